"""A message made ready or delayed, dead-lettered, moved aside as damaged, or expired: where a
record goes when it leaves flight, the delayed set, or its queue for the error queue. Part of
the one writer of message state (``fdbqueue.ops.moves``): every function composes inside the
caller's transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import CorruptMessageError, EngineError
from fdbqueue.ops import workindex
from fdbqueue.ops.moves.core import (
    CORRUPT_REASON,
    LEASE_FIELDS,
    Note,
    after,
    copy_chunks,
    count_made_ready,
    remove_message,
)
from fdbqueue.ops.privileges import error_queue
from fdbqueue.ops.workindex import UNREAD
from fdbqueue.store.budget import Budget, move_cost
from fdbqueue.store.clock import now_us
from fdbqueue.store.codec import MINUS_ONE, ONE, pack_count, unpack_count
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.entropy import new_id, new_rand
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, fit_reason

log = logging.getLogger("fdbqueue")


def put_ready(
    tr: Transaction,
    keys: QueueKeys,
    key: bytes | None,
    rec: Record,
    priority: int,
    *,
    journaled: bool = False,
    note: Note | None = None,
) -> bytes:
    """Make ``rec`` ready at ``key`` (its original place) or at the tail of its priority;
    journaled as ``note`` when ``journaled``."""
    seen: bytes | None = UNREAD
    if key is None:
        # The index and the work index entry in one round trip.
        raw, seen = tr.snapshot.get_many([keys.wake, keys.work_entry])
        index = unpack_count(raw) + 1  # the add below moves it on
        key = keys.ready_key(priority, index, new_rand())
        tr.set(keys.priority_marker(priority), b"")
    tr.set(key, rec.encode())
    if key == keys.home_key(rec.id):
        tr.clear(keys.id_key(rec.id))  # back home: the id finds it without an entry
    else:
        tr.set(keys.id_key(rec.id), key)
    if rec.expires_us is not None:
        tr.set(keys.expiry_key(rec.expires_us, rec.id), b"")
    tr.add(keys.counter("ready"), ONE)
    tr.add(keys.wake, ONE)
    count_made_ready(tr, keys, 1)
    workindex.mark(tr, keys, seen)
    after(tr, keys, journaled, note, rec)
    return key


def put_delayed(
    tr: Transaction,
    keys: QueueKeys,
    due: int,
    rec: Record,
    *,
    key: bytes | None,
    priority: int,
    journaled: bool = False,
    note: Note | None = None,
) -> None:
    """Hold ``rec`` until ``due`` (a version); then it goes to ``key`` (a retry) or the tail (an enqueue)."""
    extra = {k: v for k, v in rec.extra.items() if k not in LEASE_FIELDS}
    extra["priority"] = priority
    if key is not None:
        extra["key"] = key.hex()
    dkey = keys.delayed_key(due, rec.id)
    tr.set(dkey, rec.with_(extra=extra).encode())
    tr.set(keys.id_key(rec.id), dkey)
    if rec.expires_us is not None:
        tr.set(keys.expiry_key(rec.expires_us, rec.id), b"")
    tr.add(keys.counter("delayed"), ONE)
    workindex.mark(tr, keys)  # a worker visiting finds it delayed, and parks the entry till it is due
    after(tr, keys, journaled, note, rec)


def dead_letter(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    rec: Record,
    reason: str,
    *,
    clear_id: bool = False,
    note: Note | None = None,
) -> None:
    """Move a message (already removed from its queue, chunks still there) to the error queue;
    ``clear_id``: its id entry too (a message out of the ready set keeps one). Journaled as
    ``dead`` in both queues (where each is journaled), or as ``note`` in its own."""
    if clear_id:
        tr.clear(keys.id_key(rec.id))
    ekeys, ecfg = error_queue(tr, keys, cfg)
    if cfg.journal:
        after(tr, keys, True, note or Note("dead", reason, {"to": ekeys.name}), rec)
    if rec.chunks:
        copy_chunks(tr, keys, ekeys, rec)
        tr.clear_range(*keys.chunk_range(rec.id))
    extra: dict[str, Any] = {"origin": keys.name, "reason": reason, "deliveries": rec.deliveries}
    if "key" in rec.extra:  # its place in the ready order (a lease or retry kept it): its priority
        extra["priority"] = keys.priority_of(bytes.fromhex(str(rec.extra["key"])))
    elif rec.extra.get("priority"):
        extra["priority"] = rec.extra["priority"]
    dead = rec.with_(deliveries=0, extra=extra, expires_us=None)
    put_ready(
        tr, ekeys, None, dead, 0, journaled=ecfg.journal, note=Note("dead", reason, {"origin": keys.name})
    )
    tr.add(keys.counter("dead"), ONE)


def move_corrupt(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    key: bytes,
    raw: bytes,
    error: CorruptMessageError,
    budget: Budget | None = None,
    *,
    state: str = "ready",
    also_clear: bytes | None = None,
) -> None:
    """Move the damaged record at ``key`` (in ``state``: ready, inflight or delayed) out of
    its queue so the queue keeps flowing: to the error queue as a message tagged ``reason =
    "corrupt"`` whose payload is the damaged record's bytes, unchanged (nothing is thrown
    away), with ``origin``, the ``key`` it was at (hex) and what was wrong. Its id there is
    the id its key names (else a fresh one). ``also_clear``: its lease entry, for a leased
    one. Counted in ``corrupt``; logged when the transaction commits. Composes in the
    caller's transaction.

    What the record said cannot be trusted, so its id entry, TTL entry and payload chunks
    (if it had any) are left where they are: a sweep clears a TTL entry whose message is
    gone, and chunks stay under the id in its queue for whoever recovers it.
    """
    if budget is not None:
        budget.charge(move_cost(len(key), len(raw), 0))
    tr.add_read_conflict_key(key)  # two movers of one record conflict
    tr.clear(key)
    if also_clear is not None:
        tr.clear(also_clear)
    tr.add(keys.counter(state), MINUS_ONE)
    tr.add(keys.counter("corrupt"), ONE)
    mid = error.msg_id or new_id()
    ename = cfg.error_queue_for(keys.name)

    def logged(failed: EngineError | None) -> None:
        if failed is None:  # once, when the move is committed: not once per retried attempt
            log.error(
                "queue %r: damaged message %r at key %r (%s): moved to %r",
                keys.name,
                mid,
                key,
                error.detail,
                ename,
            )

    tr.on_finish(logged)
    ekeys, ecfg = error_queue(tr, keys, cfg)
    extra = {
        "origin": keys.name,
        "reason": CORRUPT_REASON,
        "key": key.hex(),
        "detail": fit_reason(error.detail),
    }
    moved = Record(mid, now_us(), "b", {}, 0, None, 0, extra, raw)
    after(
        tr, keys, cfg.journal, Note("dead", CORRUPT_REASON, {"to": ename, "detail": extra["detail"]}), moved
    )
    put_ready(
        tr,
        ekeys,
        None,
        moved,
        0,
        journaled=ecfg.journal,
        note=Note("dead", CORRUPT_REASON, {"origin": keys.name}),
    )


def expire(keys: QueueKeys, tr: Transaction, cfg: QueueConfig, key: bytes, rec: Record) -> None:
    """A ready message past its TTL: discarded, or to the error queue tagged ``expired``."""
    remove_message(tr, keys, key, rec, chunks=cfg.expiry_action == "discard")
    tr.add(keys.counter("ready"), MINUS_ONE)
    tr.add(keys.counter("expired"), ONE)
    _expired(keys, tr, cfg, rec)


def _expired(keys: QueueKeys, tr: Transaction, cfg: QueueConfig, rec: Record) -> None:
    note = Note("expired", None, {"action": cfg.expiry_action})
    if cfg.expiry_action == "error":
        note = Note("expired", None, {"action": "error", "to": cfg.error_queue_for(keys.name)})
        dead_letter(keys, tr, cfg, rec, "expired", note=note)
    else:
        after(tr, keys, cfg.journal, note, rec)


def expire_unready(keys: QueueKeys, tr: Transaction, cfg: QueueConfig, rec: Record) -> None:
    """A message already out of the ready set (leased, delayed) past its TTL: discard it or
    dead-letter it tagged ``expired``; its id entry goes either way."""
    tr.add(keys.counter("expired"), ONE)
    tr.clear(keys.id_key(rec.id))
    if cfg.expiry_action != "error" and rec.chunks:
        tr.clear_range(*keys.chunk_range(rec.id))
    _expired(keys, tr, cfg, rec)


def take_delayed(
    tr: Transaction, keys: QueueKeys, dkey: bytes, rec: Record, *, expired: bool = False
) -> None:
    """Take a due message out of the delayed set (the caller puts it somewhere); ``expired``:
    its TTL entry goes too."""
    tr.clear(dkey)
    tr.add(keys.counter("delayed"), MINUS_ONE)
    if expired and rec.expires_us is not None:
        tr.clear(keys.expiry_key(rec.expires_us, rec.id))


def wake(tr: Transaction, keys: QueueKeys, n: int = 1) -> None:
    """Wake blocked consumers: a watch on the wake key fires (an atomic add: no conflicts);
    and the work index's consumers (a strict-order ack, dequeue enabled again)."""
    tr.add(keys.wake, pack_count(n) if n != 1 else ONE)
    count_made_ready(tr, keys, n)  # (made ready: none; the ready count must not move)
    workindex.mark(tr, keys)
