"""Dead-letter tools: ``redrive`` puts an error queue's dead letters back to work, and
``delete_by_id`` (``Queue.delete``) removes one message in any state.

A dead letter remembers where it came from (``origin``), why (``reason``) and how many
deliveries it had; a redrive sends it back to its origin (or to ``to``) at the tail of the
priority it had, with its deliveries reset, in dequeue order - as SQS's "start DLQ redrive"
and River's or Oban's "retry" of a discarded job do. A damaged record moved aside (reason
``corrupt``) holds the damaged bytes as its payload: it is redriven only to an explicit ``to``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from fdbqueue.api.transfer import (
    BATCH,
    FULL,
    MOVED,
    PASSED,
    Visit,
    check_limit,
    in_batches,
    open_destination,
    scan_ready,
)
from fdbqueue.engines.contract import Database, Transaction, adopt
from fdbqueue.errors import CorruptMessageError, NotAnErrorQueueError, QueueError, QueueNotFoundError
from fdbqueue.ops.moves.core import CORRUPT_REASON
from fdbqueue.ops.moves.manager import delete_message, redrive_message
from fdbqueue.ops.privileges import check, checked
from fdbqueue.ops.reading import locate
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import Budget, move_cost
from fdbqueue.store.config import QueueConfig, decode_config
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys
from fdbqueue.store.meta import read_meta
from fdbqueue.store.record import decode_record
from fdbqueue.types import check_where, headers_match


def redrive(
    tr: Transaction | Database,
    queue: str,
    *,
    to: str | None = None,
    where: Mapping[str, Any] | None = None,
    limit: int | None = None,
    ids: Iterable[str] | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> int:
    """Send the dead letters of error queue ``queue`` (those whose headers match ``where``, at
    most ``limit``; only those of ``ids`` when given) back to their origin queues, or all to
    ``to``; returns how many.

    Each goes to the tail of the priority it had, with deliveries reset to 0 and its
    dead-letter fields (origin, reason) dropped; id, headers, payload and enqueue time stay.
    Journaled ``redrive`` in both queues where they are journaled. Given a Transaction, it
    redrives in it what one transaction's budget allows (call again for more); given a
    Database, in batches of at most 100 (moving.BATCH), each its own transaction, exactly once across
    commit_unknown_result. Needs ``admin`` on ``queue`` and ``enqueue`` on each destination.
    """
    src = QueueKeys.make(queue, root)
    dst = None if to is None else QueueKeys.make(to, root)
    if dst is not None and dst == src:
        raise QueueError(f"redrive to {to!r}: that is the queue it reads")
    check_limit(limit)
    where = check_where(where)
    if not run_once(adopt(tr), lambda t, _: _check_error_queue(t, src)):
        return 0  # an error queue no dead letter has made yet
    if ids is not None:
        return _by_id(tr, src, dst, where, limit, _check_ids(ids))
    return in_batches(tr, src, limit, lambda t, want, start: _batch(t, src, dst, where, want, start))


HEAD_LOOK = 20  # ready messages at the head of a queue looked at for a dead letter


def _check_error_queue(t: Transaction, src: QueueKeys) -> bool:
    """Whether there is anything to redrive from ``src``'s queue, or why that is a mistake.

    An error queue is the default error queue of the queue its name derives from, one that
    another queue names as its ``error_queue``, or one holding dead letters at its head (its
    origin since set to dead-letter elsewhere): True (after checking ``admin`` on it,
    AccessDeniedError). One that no dead letter has made yet: False (nothing to redrive).
    Otherwise NotAnErrorQueueError for a working queue, QueueNotFoundError for no queue:
    redriving either is a mistake to name, not "0 redriven". Snapshot reads: a check, not a
    condition of the redrive's commits."""
    meta = read_meta(t, src)
    snap = t.snapshot
    if meta.config is not None:
        check(t, src, "admin", meta)
        for key, raw in snap.get_range(*src.ready_range(), HEAD_LOOK):
            try:
                if "origin" in decode_record(raw, src, key).extra:
                    return True
            except CorruptMessageError:
                continue
    if _dead_letters_to(t, src):
        return meta.config is not None
    if meta.config is None:
        raise QueueNotFoundError(f"no queue named {src.name!r}")
    raise NotAnErrorQueueError(
        f"queue {src.name!r} is not an error queue: no queue dead-letters to it and it holds no "
        f"dead letter (the error queue of {src.name!r} is {meta.config.error_queue_for(src.name)!r}; "
        "to move ready messages between queues, use move)"
    )


def _dead_letters_to(t: Transaction, src: QueueKeys) -> bool:
    """Whether a queue under ``src``'s root dead-letters to ``src``'s queue: the one its name
    derives from (one read), else any (a read of every queue's settings)."""
    snap = t.snapshot
    base = src.name.removesuffix(".error")
    if base != src.name:
        raw = snap.get(src.sibling(base).config)
        if raw is not None and decode_config(raw).error_queue_for(base) == src.name:
            return True
    listing = src.root.range(("queues",))  # layout.queues_range of src's root
    names = [str(src.root.unpack(kv.key)[1]) for kv in snap.get_range(listing.start, listing.stop)]
    configs = snap.get_many([src.sibling(n).config for n in names])
    return any(
        raw is not None and name != src.name and decode_config(raw).error_queue_for(name) == src.name
        for name, raw in zip(names, configs, strict=True)
    )


def _check_ids(ids: Iterable[str]) -> list[str]:
    if isinstance(ids, (str, bytes)):
        raise QueueError(f"ids must be a list of message ids, not one {type(ids).__name__}")
    out = list(dict.fromkeys(ids))  # each once, in the order given
    bad = [i for i in out if not isinstance(i, str) or not i]
    if bad:
        raise QueueError(f"message ids must be non-empty strs, got {bad[0]!r}")
    return out


def _by_id(
    tr: Transaction | Database,
    src: QueueKeys,
    to: QueueKeys | None,
    where: Mapping[str, Any] | None,
    limit: int | None,
    ids: list[str],
) -> int:
    """Redrive the dead letters of ``ids`` (those still in the error queue), BATCH ids a
    transaction, each settled exactly once (moving.in_batches); an id not there is passed."""
    left = ids if limit is None else ids[:limit]

    def step(t: Transaction, want: int | None, start: bytes | None) -> tuple[int, bytes | None]:
        first = 0 if start is None else int(start)
        part = left[first : first + min(BATCH, len(left) if want is None else want)]
        visit = _visitor(t, src, to, where)
        budget = Budget()
        done = 0
        for n, msg_id in enumerate(part):
            key = locate(t, src, msg_id)
            raw = None if key is None or src.unpack_tail(key)[0] != "r" else t.get(key)
            if key is None or raw is None:
                continue  # gone, or not a dead letter (leased or delayed)
            outcome = visit(key, raw, budget)
            if outcome == FULL:
                return done, str(first + n).encode()  # the rest in the next transaction
            done += outcome == MOVED
        nxt = first + len(part)
        return done, str(nxt).encode() if nxt < len(left) else None

    return in_batches(tr, src, None, step)


def _batch(
    t: Transaction,
    src: QueueKeys,
    to: QueueKeys | None,
    where: Mapping[str, Any] | None,
    limit: int | None,
    start: bytes | None,
) -> tuple[int, bytes | None]:
    """Redrive up to ``limit`` matching dead letters from ``start`` (None: the head); returns
    how many, and where the next transaction goes on (None: the end)."""
    return scan_ready(t, src, start, limit, _visitor(t, src, to, where))


def _visitor(t: Transaction, src: QueueKeys, to: QueueKeys | None, where: Mapping[str, Any] | None) -> Visit:
    """What a redrive does with one dead letter of ``src`` in ``t``: checks ``admin`` first."""
    smeta = read_meta(t, src)
    if smeta.config is None:
        raise QueueNotFoundError(f"no queue named {src.name!r}")
    check(t, src, "admin", smeta)
    src_journaled = smeta.config.journal
    journaled: dict[str, bool] = {}  # destination -> journaled, each opened once

    def visit(key: bytes, raw: bytes, budget: Budget) -> str:
        try:
            rec = decode_record(raw, src, key)
        except CorruptMessageError:
            return PASSED  # a sweep or a consumer moves it aside
        if where is not None and not headers_match(rec.headers, where):
            return PASSED
        origin = rec.extra.get("origin")
        if to is None and (not isinstance(origin, str) or rec.extra.get("reason") == CORRUPT_REASON):
            return PASSED  # not a dead letter of a queue here, or damaged bytes: only to an explicit `to`
        dst = to if to is not None else src.sibling(str(origin))
        if dst == src:
            return PASSED
        if not budget.take(2 * move_cost(len(key), len(raw), rec.chunks)):
            return FULL
        if dst.name not in journaled:
            journaled[dst.name] = open_destination(t, dst)
        t.add_read_conflict_key(key)  # a concurrent consumer of it conflicts
        redrive_message(t, src, src_journaled, dst, journaled[dst.name], key, rec)
        return MOVED

    return visit


def delete_by_id(tr: Transaction | Database, keys: QueueKeys, msg_id: str) -> bool:
    """Remove message ``msg_id`` of ``keys``' queue wherever it waits (ready, leased,
    delayed); True if it was there. Composes inside a caller's transaction. Needs ``admin``."""
    if not isinstance(msg_id, str) or not msg_id:
        raise QueueError(f"message id must be a non-empty str, got {msg_id!r}")

    def body(t: Transaction, _: bool) -> bool:
        meta = checked(t, keys, "admin")
        where = locate(t, keys, msg_id)
        raw = None if where is None else t.get(where)
        if where is None or raw is None:
            return False
        try:
            rec = decode_record(raw, keys, where, msg_id)
        except CorruptMessageError as exc:
            raise QueueError(f"message {msg_id!r} is damaged ({exc}): a sweep moves it aside") from None
        cfg = meta.config or QueueConfig()
        delete_message(t, keys, where, rec, journaled=cfg.journal)
        return True

    return run_once(adopt(tr), body)
