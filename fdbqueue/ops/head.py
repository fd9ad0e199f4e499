"""What a dequeue may hand out: the head of the ready set, or the first match of a filter.

The scans (``scan.py``'s ReadyScan) move aside what they meet that can no longer be
delivered (expired or damaged records) within the transaction's budget (``budget.py``), and
first make ready what came due (a sweep step), so a dequeue never waits for a sweeper.
Every function here composes inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fdbqueue.engines.contract import KeyValue, Transaction
from fdbqueue.errors import CorruptMessageError, QueueError
from fdbqueue.ops.moves import move_corrupt
from fdbqueue.ops.scan import KEYS, ReadyScan, expire_within
from fdbqueue.ops.sweep import sweep_step
from fdbqueue.ops.waiting import next_due
from fdbqueue.store.budget import Budget
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, decode_record

HEAD_SKIP_LIMIT = 100  # expired messages the staged dequeue looks past per pairing batch
HEAD_BATCH = 64  # the head scan reads 1, then 8, then up to this many records at a time
FILTER_SCAN_LIMIT = 10_000  # dequeue(where=...) looks at most this many messages, over all transactions
FILTER_BATCH = 100
# Kept back from a dequeue's or lease's budget for the message it takes: the leased record
# (at most the value limit) and its index entries.
TAKE_RESERVE = 110_000


def deliverable_head(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    where: Mapping[str, Any] | None,
    fallback: bool,
    now: int,
    *,
    check_due: bool = True,
    budget: Budget | None = None,
    start: bytes | None = None,
) -> tuple[bytes, Record] | None:
    """The next deliverable ready message; moves aside expired ones it meets.

    ``check_due``: whether delayed or leased messages may exist (their counters), so that
    what came due is made ready first; when none exist the two index reads are skipped.
    ``budget``: what this transaction may still spend (``fdbqueue/store/budget.py``): expired
    messages it cannot afford to move are passed over and left for a later transaction or
    a sweep, so a live message behind them is still found; ``budget.more`` then says that
    work was left. ``start``: a ready key to scan from (a lease_many's next message).
    """
    if where is not None and not all(isinstance(name, str) for name in where):
        raise QueueError(f"header names in a filter must be str (as stored), got {list(where)!r}")
    if check_due and next_due(tr, keys, now) is not None:
        budget = Budget(TAKE_RESERVE) if budget is None else budget
        sweep_step(keys, tr, cfg, now, 16, budget)  # due delays and expired leases first
    if cfg.strict_order:
        if where is not None:
            raise QueueError(f"queue {keys.name!r} keeps strict order: dequeue by filter would break it")
        if tr.get_range(*keys.index_range("l"), limit=1):
            return None  # strict order: one delivery in flight at a time
    begin, end = keys.ready_range()
    if where is not None:
        budget = Budget(TAKE_RESERVE) if budget is None else budget
        return _find(keys, tr, cfg, begin, end, dict(where), fallback, now, budget)
    return _head(keys, tr, cfg, start or begin, end, now, budget)


def _begun(budget: Budget | None, kvs: list[KeyValue]) -> Budget:
    """``budget``, or one begun now for a head scan that goes past its first record, with
    that record's read counted (a live head, the common case, needs none)."""
    if budget is not None:
        return budget
    fresh = Budget(TAKE_RESERVE)
    fresh.read(kvs)
    return fresh


def _head(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    begin: bytes,
    end: bytes,
    now: int,
    budget: Budget | None,
) -> tuple[bytes, Record] | None:
    """The first live ready message from ``begin``, moving expired ones aside within ``budget``.

    Read at snapshot isolation in growing batches (1, 8, 64 records: one round trip when the
    head is live, a few past a run of expired messages), bounded per transaction by the
    budget's read bytes and time; then the read conflict a serializable scan would have
    taken, ``[begin, the key returned]``, is added: a concurrent take of the same message,
    or of an expired one moved here, conflicts as before.

    This is ``ReadyScan(..., sizes=(1, 8, HEAD_BATCH), conflict=RANGE)`` (``scan.py``) written out:
    every dequeue runs it, and the scanner's object and generator cost it instructions
    (``scripts/count_instructions.py``). Change the two together.
    """
    scan_from = begin
    want = 1
    # The first batch (one record) is a serializable read: the read conflict it takes,
    # [begin, its key] or [begin, end) when there is none, is the very one the scan adds
    # when it stops there, as it does in the common case (a live head, or none): one call
    # less. Later batches are snapshot reads, their conflict added where the scan stops.
    # ``budget`` None (a dequeue in a caller's transaction): one is begun (_begun) only when
    # the scan goes past its first record, which a live head never does.
    first = True
    while True:
        limit = 1 if budget is None else budget.batch(want)  # a first batch: 1 either way
        if first:
            kvs = tr.get_range(begin, end, limit)
            if budget is not None:
                budget.read(kvs)
        else:
            kvs = tr.snapshot.get_range(begin, end, limit)
            budget = _begun(budget, [])  # begun by now (past the first record): for the type
            budget.read(kvs)
        for key, raw in kvs:
            try:
                rec = decode_record(raw, keys, key)
            except CorruptMessageError as exc:
                budget = _begun(budget, kvs)
                move_corrupt(keys, tr, cfg, key, raw, exc, budget)
                first = False
                continue
            if rec.expired(now):
                budget = _begun(budget, kvs)
                expire_within(keys, tr, cfg, key, raw, rec, budget)
                first = False
                continue
            if not first:
                tr.add_read_conflict_range(scan_from, key + b"\x00")
            if rec.extra and int(rec.extra.get("not_before", 0)) > now:  # extra: mostly empty
                return None  # strict order: the head waits out its retry delay
            return key, rec
        if len(kvs) < limit:
            if not first:
                tr.add_read_conflict_range(scan_from, end)  # saw the end, as a serializable read would
            return None
        first = False
        budget = _begun(budget, kvs)  # begun already: every record of this batch was moved aside
        begin = kvs[-1].key + b"\x00"
        if budget.scan_exhausted():
            tr.add_read_conflict_range(scan_from, begin)
            budget.more = True  # expired messages beyond this transaction's reading: later
            return None
        want = min(want * 8, HEAD_BATCH)


def _find(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    begin: bytes,
    end: bytes,
    where: dict[str, Any],
    fallback: bool,
    now: int,
    budget: Budget,
) -> tuple[bytes, Record] | None:
    """The oldest ready message whose headers match ``where``; with ``fallback`` the oldest
    live message when none matches.

    Snapshot batches from ``budget.resume`` (or the head), at most SCAN_READ_BYTES and
    SCAN_SECONDS per transaction and FILTER_SCAN_LIMIT messages in all; a match is taken
    with a read conflict on its key alone (a serializable point read of it at this
    transaction's read version), so only a concurrent take of the same message conflicts.
    Where the per-transaction bound is reached first, ``budget.resume`` and ``budget.more``
    say where the next transaction goes on (a dequeue given a Database does so; in a
    caller's transaction the dequeue returns None).
    """
    scan = ReadyScan(
        tr,
        keys,
        now,
        cfg=cfg,
        budget=budget,
        begin=budget.resume or begin,
        where=where,
        sizes=(FILTER_BATCH,) if budget.read_rows else (8, FILTER_BATCH),
        row_limit=FILTER_SCAN_LIMIT - budget.scanned,
        conflict=KEYS,
    )
    for key, _raw, rec in scan:
        budget.scanned += scan.rows
        tr.add_read_conflict_key(key)
        budget.resume = None
        return key, rec
    budget.scanned += scan.rows
    if scan.exhausted:
        budget.resume = scan.cursor
        budget.more = True
        return None
    budget.resume = None
    budget.more = False  # the scan is over: what it left is a sweep's
    return _head(keys, tr, cfg, begin, end, now, budget) if fallback else None
