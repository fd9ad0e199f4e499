"""Autonomous enqueues: written in a transaction of their own, whatever becomes of the caller's.

Where a transaction can run beside the caller's (sim, memory, FoundationDB), the enqueue
commits at once in its own and its errors are raised to the caller. On the embedded engine
the caller's transaction holds the single writer, so the write has to wait until that
transaction ends (``on_finish``). The caller must still learn the outcome, since the id it
gets may already be committed elsewhere:

* what could refuse the write is checked first, in the caller's transaction (which sees its
  own writes): a stopped queue, a payload past ``max_payload``, no room under ``max_size``
  counting the caller's own enqueues and the autonomous ones it had admitted. A refusal is
  raised there, before any id is handed out. A committed dedup match returns its first id
  (nothing written); the caller's own uncommitted one does not count, since it goes if the
  caller aborts;
* the admitted write is then not refused for a full queue or a stopped one: it was accepted
  when the queue took it (``max_size`` may thus be overshot by the autonomous enqueues
  admitted before the caller's own filled the queue, as concurrent enqueues may overshoot it);
* what can still fail (the database closed before the write, a full disk or another store
  error, a dedup match committed by another process in between) is set on the returned
  :class:`AutonomousId`'s ``outcome`` future, and logged.
"""

from __future__ import annotations

import logging

from fdbqueue.engines.contract import Database, Transaction, check_room
from fdbqueue.errors import (
    EngineError,
    NestedTransactionError,
    PayloadTooLargeError,
    QueueFullError,
    QueueStoppedError,
)
from fdbqueue.ops.enqueuing import enqueue_items, first_of
from fdbqueue.store.budget import MAX_PAYLOAD_BYTES
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import read_meta
from fdbqueue.types import AutonomousId, Item

log = logging.getLogger("fdbqueue")

# Autonomous enqueues admitted in a caller's transaction and not written yet, by (id of the
# transaction, the queue's prefix): they count against max_size in admit. An entry goes when
# that transaction's attempt ends (its on_finish), so a reused id() finds none.
_reserved: dict[tuple[int, bytes], int] = {}


def enqueue_autonomous(keys: QueueKeys, tr: Transaction, item: Item) -> AutonomousId:
    """Enqueue ``item`` (its id fixed) outside the caller's ``tr`` (see the module docstring)."""
    db: Database = tr.db
    try:
        return AutonomousId.written(enqueue_items(keys, db, [item], 0)[0])
    except NestedTransactionError:
        pass  # the embedded engine: the caller's transaction holds the single writer
    seen = admit(keys, tr, item)
    if seen is not None:
        return AutonomousId.written(seen)  # a dedup match: nothing to write
    slot = (id(tr), keys.q.key())
    _reserved[slot] = _reserved.get(slot, 0) + 1
    done = AutonomousId(item.id)
    admitted = item._replace(admitted=True)

    def later(_error: EngineError | None) -> None:
        _reserved.pop(slot, None)
        try:
            done.outcome.set_result(enqueue_items(keys, db, [admitted], 0)[0])
        except Exception as exc:  # reported on the outcome; the caller's own is not masked
            log.exception("fdbqueue: autonomous enqueue to %r failed", keys.name)
            done.outcome.set_exception(exc)

    tr.on_finish(later)
    return done


def admit(keys: QueueKeys, tr: Transaction, item: Item) -> str | None:
    """Raise what would refuse ``item`` now, checked in the caller's ``tr``; the first
    message's id on a dedup match, else None (admitted)."""
    check_room(tr.db)  # below the free-space reserve: refused now, not at the deferred write
    meta = read_meta(tr, keys)
    cfg = meta.config or QueueConfig()
    if not meta.state.enqueue:
        raise QueueStoppedError(f"enqueue is disabled on queue {keys.name!r}")
    limit = min(cfg.max_payload, MAX_PAYLOAD_BYTES)
    if len(item.payload) > limit:
        raise PayloadTooLargeError(
            f"payload of {len(item.payload)} bytes exceeds queue {keys.name!r}'s max_payload of {limit} bytes"
        )
    if item.dedup_key is not None:
        # Against what is committed, not the caller's own enqueue with that key: that one
        # goes if the caller aborts, and the autonomous message must stay. A transaction
        # begun meanwhile in this thread reads the last committed state (engines/sqlite/database.py).
        peek = tr.db.create_transaction()
        try:
            seen = peek.get(keys.dedup_key(item.dedup_key))
            first_id = None if seen is None else first_of(seen, cfg, db_now(peek))
            if first_id is not None:
                return first_id  # else the bounds below still apply
        finally:
            peek.cancel()
    if cfg.max_size is not None:
        held = meta.count("ready") + meta.count("inflight") + meta.count("delayed")
        held += _reserved.get((id(tr), keys.q.key()), 0)
        if held + 1 > cfg.max_size:
            raise QueueFullError(
                f"queue {keys.name!r} is full ({held} of max_size {cfg.max_size}, counting this "
                "transaction's enqueues): the autonomous enqueue is refused",
                block=cfg.overflow == "block",
            )
    return None
