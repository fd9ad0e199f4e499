"""Moving messages between two queues of one database: ``move`` (and the ``fdbqueue move``
command).

The queue manager's forwarding within one system (Bernstein & Newcomer): each message is
removed from one queue and installed on the other in one transaction (``moves.move_message``),
so a crash leaves it in exactly one of them.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from fdbqueue.engines.contract import Database, Transaction, adopt, is_transaction
from fdbqueue.errors import QueueError, QueueNotFoundError
from fdbqueue.ops.moves.manager import move_message
from fdbqueue.ops.privileges import check, check_create
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.scan import ReadyScan
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import Budget, move_cost
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import QueueConfig, write_config
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys
from fdbqueue.store.meta import read_meta
from fdbqueue.types import check_where

BATCH = 100  # messages one transaction moves at most (each also bounded by the byte budget)


def move(
    tr: Transaction | Database,
    src: str,
    dst: str,
    *,
    where: Mapping[str, Any] | None = None,
    limit: int | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> int:
    """Move the ready messages of queue ``src`` (those whose headers match ``where``, at most
    ``limit``) to queue ``dst`` of the same database, in dequeue order; returns how many.

    Each message keeps its id, headers, priority, payload, enqueue time, TTL and deliveries,
    and goes to the tail of its priority in ``dst``; leased and delayed messages stay. Given a
    Transaction, it moves in it what one transaction's budget allows (call again for more);
    given a Database, in batches of at most BATCH, each its own transaction, exactly once
    across commit_unknown_result (a receipt settles each batch). Needs ``admin`` on ``src``
    and ``enqueue`` on ``dst``; journaled ``move_out`` / ``move_in`` where the queues are.
    """
    skeys, dkeys = QueueKeys.make(src, root), QueueKeys.make(dst, root)
    if skeys == dkeys:
        raise QueueError(f"move needs two queues, got {src!r} twice")
    check_limit(limit)
    where = check_where(where)
    return in_batches(tr, skeys, limit, lambda t, want, start: _batch(t, skeys, dkeys, where, want, start))


# One transaction's work: (transaction, at most how many, from which cursor) -> (how many, next cursor).
Step = Callable[[Transaction, int | None, bytes | None], tuple[int, bytes | None]]


def check_limit(limit: object) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise QueueError(f"limit must be an int >= 0 or None, got {limit!r}")


def in_batches(tr: Transaction | Database, keys: QueueKeys, limit: int | None, step: Step) -> int:
    """Run ``step(t, want, start)`` - move up to ``want`` messages from cursor ``start``,
    returning how many and the next cursor (None: done) - in a caller's transaction once, or
    given a Database in batches of at most BATCH, each its own transaction, exactly once
    across commit_unknown_result (a receipt on ``keys``' queue settles each). Returns the total."""
    tr = adopt(tr)
    if is_transaction(tr):
        return run_once(tr, lambda t, _: step(t, limit, None)[0])
    total = 0
    cursor: bytes | None = None
    while limit is None or total < limit:
        want = BATCH if limit is None else min(BATCH, limit - total)
        start = cursor

        def body(t: Transaction, want: int = want, start: bytes | None = start) -> tuple[int, bytes | None]:
            return step(t, want, start)

        n, cursor = run_once_confirmed(tr, keys, body)
        total += n
        if cursor is None:
            return total
    return total


def open_destination(t: Transaction, keys: QueueKeys) -> bool:
    """Check that ``t``'s principal may enqueue into ``keys``' queue, create it with defaults
    if it has never been used (as enqueue does); returns whether it keeps a journal."""
    meta = read_meta(t, keys)
    check(t, keys, "enqueue", meta)
    if meta.config is None:
        check_create(t, keys)  # an owned queue's error queue is its owner's to make
        write_config(t, keys, QueueConfig())
        return False
    return meta.config.journal


# What a scan's visit did with one ready record.
MOVED, PASSED, FULL = "moved", "passed", "full"
Visit = Callable[[bytes, bytes, Budget], str]


def scan_ready(
    t: Transaction, keys: QueueKeys, start: bytes | None, limit: int | None, visit: Visit
) -> tuple[int, bytes | None]:
    """Walk ``keys``' ready messages from ``start`` (None: the head) in dequeue order, in
    pages bounded by one transaction's budget, calling ``visit(key, raw, budget)`` on each:
    it moves the record (MOVED), passes it by (PASSED) or finds no room left (FULL). Stops
    after ``limit`` moves; returns how many, and where the next transaction goes on (None:
    the scan reached the end)."""
    budget = Budget()
    moved = 0
    begin, end = keys.ready_range()
    begin = start or begin
    while True:
        asked = budget.batch(64)
        kvs = t.snapshot.get_range(begin, end, asked)
        budget.read(kvs)
        for key, raw in kvs:
            if limit is not None and moved >= limit:
                return moved, key
            outcome = visit(key, raw, budget)
            if outcome == FULL:
                return moved, key  # the rest for the next transaction
            moved += outcome == MOVED
        if len(kvs) < asked:
            return moved, None  # the end of the ready messages
        begin = kvs[-1].key + b"\x00"
        if budget.scan_exhausted():
            return moved, begin


def _batch(
    t: Transaction,
    skeys: QueueKeys,
    dkeys: QueueKeys,
    where: Mapping[str, Any] | None,
    limit: int | None,
    start: bytes | None,
) -> tuple[int, bytes | None]:
    """Move up to ``limit`` matching ready messages from ``start`` (None: the head); returns
    how many, and where the next transaction goes on (None: the scan reached the end)."""
    smeta = read_meta(t, skeys)
    if smeta.config is None:
        raise QueueNotFoundError(f"no queue named {skeys.name!r}")
    check(t, skeys, "admin", smeta)
    djournal = open_destination(t, dkeys)
    scfg = smeta.config

    budget = Budget()
    scan = ReadyScan(t, skeys, db_now(t), cfg=scfg, budget=budget, begin=start, where=where, limit=limit)
    for key, raw, rec in scan:
        if not budget.take(2 * move_cost(len(key), len(raw), rec.chunks)):
            return scan.taken, key  # no room left: the rest for the next transaction
        scan.claim()
        t.add_read_conflict_key(key)  # a concurrent dequeue of it conflicts
        move_message(t, skeys, scfg.journal, dkeys, djournal, key, rec)
    return scan.taken, scan.cursor
