"""Delivery guarantees: leases, release to the original place, poison messages, expiry.

Where a message can be (``layout.py`` has the keys):

* ready     ``("r", -priority, index, rand)`` -> record
* leased    ``("f", id)`` -> record whose ``extra`` holds its ready key, receipt, deadline
            (a version) and ``until`` (the wall-clock estimate ``Message.lease_deadline`` shows);
            plus ``("l", deadline, id)`` so that sweeps find expired leases in deadline order.
            Its id finds it there directly: a lease writes no id entry (one page less per
            lease and per ack)
* delayed   ``("d", due, id)`` -> record whose ``extra`` holds the ready key to go back to
            (a retry) or the priority to enqueue at (a delayed enqueue)
* the error queue, as a ready message of that queue, tagged with ``origin`` and ``reason``

A failed delivery (nack, lease expiry, an aborted in-transaction dequeue) puts the
message back at its original key - order kept through its lifetime, as in Apache Qpid's queue design - after
the queue's retry delay, or moves it to the error queue once it has had max_deliveries.
Every function here composes inside the caller's transaction. Every ``now`` is the
transaction's read version and every deadline a version (``fdbqueue.store.clock``), so no
client's wall clock decides when a lease, a delay or a TTL ends.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Sequence

from fdbqueue.engines.contract import (
    Attempt,
    Database,
    Transaction,
    adopt,
    is_transaction,
    retry_loop,
)
from fdbqueue.errors import CorruptMessageError, EngineError, LeaseError, LeaseExpiredError, QueueStoppedError
from fdbqueue.ops.aborts import _noted, _reason_of, _uncounted, engine_fault
from fdbqueue.ops.journaling import record_short
from fdbqueue.ops.moves.core import (
    CORRUPT_REASON,
    JOURNALED,
    LEASE_FIELDS,
    VOLATILE,
    Note,
    count_known,
    remove_message,
)
from fdbqueue.ops.moves.leases import (
    count_settled,
    drop_stale_entry,
    end_lease,
    end_lease_one,
    end_leases,
    finish_lease,
    renew_lease,
)
from fdbqueue.ops.moves.places import (
    dead_letter,
    expire_unready,
    move_corrupt,
    put_delayed,
    put_ready,
    take_delayed,
    wake,
)
from fdbqueue.ops.privileges import check, checked, dequeuer
from fdbqueue.ops.reading import expires_at, locate, read_payload
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import Budget, move_cost
from fdbqueue.store.clock import db_now, now_us, versions
from fdbqueue.store.config import QueueConfig, config_or_create
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import Meta
from fdbqueue.store.record import Record, decode_record
from fdbqueue.types import Message, check_duration

log = logging.getLogger("fdbqueue")
_PACK, _UNPACK = struct.Struct("<q").pack, struct.Struct("<q").unpack
_ONE, _MINUS_ONE = _PACK(1), _PACK(-1)


def release(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    rec: Record,
    ready_key: bytes,
    *,
    reason: str | None,
    delay: float | None,
    now: int,
    op: str = "nack",
    discard: bool = False,
) -> str:
    """A delivery failed: back to ``ready_key`` (after the retry delay) or to the error queue.

    ``rec.deliveries`` counts the failed delivery. Returns where it went:
    ``ready``, ``delayed``, ``dead`` or ``expired``. ``op``: what the journal calls the
    failure (``nack`` or ``lease_expired``) when the message goes back. ``discard``: to the
    error queue now, whatever its deliveries (a handler gave up on it).
    """
    if rec.expired(now):
        expire_unready(keys, tr, cfg, rec)
        return "expired"
    if discard or rec.deliveries >= cfg.max_deliveries:
        dead_letter(keys, tr, cfg, rec, reason or "max_deliveries", clear_id=True)
        return "dead"
    wait = cfg.retry_wait(rec.deliveries) if delay is None else delay
    extra = {k: v for k, v in rec.extra.items() if k not in LEASE_FIELDS and k != "not_before"}
    if reason is not None:
        extra["last_error"] = reason
    rec = rec.with_(extra=extra)
    priority = keys.parse_ready(ready_key)[0]
    if wait > 0 and cfg.strict_order:
        # Strict order: the message keeps its place and holds the queue until it is due.
        extra["not_before"] = now + versions(wait)
        note = Note(op, reason, {"delay": wait})
        put_ready(tr, keys, ready_key, rec.with_(extra=extra), priority, journaled=cfg.journal, note=note)
        return "ready"
    if wait > 0:
        note = Note(op, reason, {"delay": wait})
        put_delayed(
            tr,
            keys,
            now + versions(wait),
            rec,
            key=ready_key,
            priority=priority,
            journaled=cfg.journal,
            note=note,
        )
        return "delayed"
    put_ready(tr, keys, ready_key, rec, priority, journaled=cfg.journal, note=Note(op, reason))
    return "ready"


# -- leases ------------------------------------------------------------------------------------


def lease_until(seconds: float) -> int:
    """Wall-clock microseconds when a lease of ``seconds`` taken now ends, by this client's
    clock: what ``Message.lease_deadline`` shows. Expiry is decided by database time."""
    return now_us() + int(seconds * 1e6)


def _leased(
    keys: QueueKeys,
    tr: Transaction,
    m: Message,
    now: int | None,
    *,
    allow_expired: bool = False,
    peek: Sequence[bytes] = (),
) -> Record:
    """The leased record of ``m``, once ``tr``'s principal is known to hold ``dequeue`` (the
    check reads the queue's guard with the record: one round trip; ``now`` None: database
    time after it, whose correction came with it). ``peek``: counters the caller adds to,
    read in that round trip (see :func:`settled_counters`)."""
    if not isinstance(m, Message) or not m.receipt:
        raise LeaseError("ack, nack and extend take a Message returned by lease()")
    held = _held_for(keys, m)
    key = keys.inflight_key(m.id) if held is None else held[3][0]
    raw = check(tr, keys, "dequeue", also=[key], peek=peek)[0]
    return _lease_of(keys, tr, m, raw, db_now(tr) if now is None else now, allow_expired)


def settled_counters(tr: Transaction, keys: QueueKeys) -> tuple[bytes, ...]:
    """The counters an ack adds to (in flight, done), for the ack's one read to bring along at
    snapshot isolation (no read conflict: acks and leases add to them side by side), where
    transactions cannot conflict: the in-process engines, one writer at a time, resolve an
    atomic op when it is made, and then ask the store nothing more for it. Where they may
    (FoundationDB, sim) an add never reads: none."""
    if getattr(tr.db, "may_conflict", True):  # engine_traits' first, as config._read_keys reads it
        return ()
    found = _settled.get(keys.packed)
    if found is None:
        if len(_settled) > 4096:  # a process settling in very many queues: start again
            _settled.clear()
        found = _settled[keys.packed] = (keys.counter("inflight"), keys.counter("done"))
    return found


_settled: dict[bytes, tuple[bytes, ...]] = {}


def ack_many_in(
    keys: QueueKeys, tr: Transaction, msgs: list[Message], now: int | None, note: Note | None = None
) -> list[Message]:
    """Ack every message of ``msgs`` whose lease is still ours: their records and the queue's
    guard in one round trip (``now`` None: database time after it, with its correction).
    Returns the ones acked (an expired or lost lease is skipped)."""
    # What this process's lease of each kept (its keys as the lease made them), as ack_in;
    # every message checked before anything is read.
    helds: list[tuple[bytes, Record, QueueKeys, tuple[bytes, bytes]] | None] = []
    also: list[bytes] = []
    for m in msgs:
        if not isinstance(m, Message) or not m.receipt:
            raise LeaseError("ack takes Messages returned by lease()")
        h = _held_for(keys, m)
        helds.append(h)
        also.append(keys.inflight_key(m.id) if h is None else h[3][0])
    peek = settled_counters(tr, keys)
    raws = check(tr, keys, "dequeue", also=also, peek=peek)
    if now is None:
        now = db_now(tr)
    done = []
    plain: list[tuple[bytes, bytes]] = []
    strict = False
    for m, h, raw in zip(msgs, helds, raws[: len(msgs)], strict=True):  # the counters after them
        try:
            rec = _lease_of(keys, tr, m, raw, now, False)
        except LeaseError:
            continue
        done.append(m)
        # The very record this process leased (the bytes read were the ones it wrote): its
        # keys as the lease made them, not made again (as ack_in).
        at = h[3] if h is not None and rec is h[1] else None
        extra = rec.extra
        fuller = rec.chunks or rec.expires_us is not None or JOURNALED in extra or "strict" in extra
        if at is not None and not fuller:
            plain.append(at)  # finish_lease's common case: its two clears, for the batch at once
            continue
        finish_lease(tr, keys, rec, note, count=False, at=at)
        strict = strict or bool(extra.get("strict"))
    if plain:
        end_leases(tr, plain)
    # One write per counter for the batch: sets of the values read, where they were (peek).
    if done and not (peek and count_known(tr, peek, raws[len(msgs) :], (-len(done), len(done)))):
        count_settled(tr, keys, len(done))
    if strict:
        wake(tr, keys)  # strict order: the next delivery may go ahead now
    return done


# The leases this process took, by receipt: the record's bytes as written and the record
# they encode. A settlement that reads those very bytes back takes the record from here, not
# from decoding them again (equal bytes decode to an equal record, whoever wrote them and
# whether or not that attempt committed); any other bytes are decoded and checked as ever.
# Bounded: emptied past HELD_LEASES (leases that expired or were never settled here).
_held: dict[str, tuple[bytes, Record, QueueKeys, tuple[bytes, bytes]]] = {}
HELD_LEASES = 4096


def hold(receipt: str, held: tuple[bytes, Record, QueueKeys, tuple[bytes, bytes]]) -> None:
    """Keep a lease of one message this process wrote (``leasing.lease_short``) for its ack,
    nack and extend, as :func:`lease_heads` keeps its batch's, bounded alike."""
    if len(_held) >= HELD_LEASES:
        _held.clear()
    _held[receipt] = held


def _held_for(keys: QueueKeys, m: Message) -> tuple[bytes, Record, QueueKeys, tuple[bytes, bytes]] | None:
    """What this process's lease of ``m`` in this queue kept (its record's bytes, the record,
    its keys as the lease made them), or None: leased elsewhere, or no longer held."""
    held = _held.get(m.receipt)  # type: ignore[arg-type]
    return held if held is not None and held[2] is keys and held[1].id == m.id else None


def _lease_of(
    keys: QueueKeys, tr: Transaction, m: Message, raw: bytes | None, now: int, allow_expired: bool
) -> Record:
    held = _held.pop(m.receipt, None)  # type: ignore[arg-type]  # a receipt: checked by the caller
    if raw is None:
        rec = None
    elif held is not None and held[0] == raw:
        rec = held[1]
    else:
        rec = decode_record(raw, keys, keys.inflight_key(m.id), m.id)
    if rec is None or rec.extra.get("receipt") != m.receipt:
        raise LeaseError(
            f"message {m.id} is not leased under this receipt (already acked, nacked or expired)"
        )
    if not allow_expired and int(rec.extra["deadline"]) <= now:
        raise LeaseExpiredError(f"the lease on message {m.id} expired; it goes back to the queue")
    if VOLATILE in rec.extra:
        tr.options.set_volatile_prefix(keys.q.key())
    return rec


def ack_in(keys: QueueKeys, tr: Transaction, m: Message, now: int | None, note: Note | None = None) -> Record:
    """Ack ``m`` in ``tr`` (:func:`_leased` written out, to keep the counters it reads)."""
    if not isinstance(m, Message) or not m.receipt:
        raise LeaseError("ack, nack and extend take a Message returned by lease()")
    held = _held_for(keys, m)
    peek = settled_counters(tr, keys)
    key = keys.inflight_key(m.id) if held is None else held[3][0]
    values = check(tr, keys, "dequeue", also=[key], peek=peek)
    rec = _lease_of(keys, tr, m, values[0], db_now(tr) if now is None else now, False)
    # The very record this process leased (the bytes read were the ones it wrote), in this
    # queue: its keys as the lease made them, not made again.
    at = held[3] if held is not None and rec is held[1] else None
    # The journal's entry (finish_lease) writes stamped keys under the journal's own prefix,
    # never a counter: the counters read are still what the set below writes over.
    known = bool(peek)
    finish_lease(tr, keys, rec, note, at=at, count=not known)
    if known and not count_known(tr, peek, values[1:], (-1, 1)):
        count_settled(tr, keys, 1)
    return rec


def ack_short(keys: QueueKeys, tr: Transaction, m: Message) -> bool:
    """:func:`ack_in` of ``m`` in its common case, where nothing conflicts: this process's own
    lease of it in this queue (its bytes, record and keys kept: ``_held``), read back as the
    very bytes that lease wrote, not expired, on a queue with no owner or whose owner granted
    ``tr``'s principal ``dequeue`` (``privileges.dequeuer``), its record without
    chunks, TTL, strict order or volatile prefix. Then its two keys cleared and the
    in-flight and done counters set to what was read less and plus one (``ack_in``'s writes,
    ``moves.end_lease_one``), the ``ack`` entry when the record carries the journal's mark
    (``finish_lease``'s, ``journaling.record_short``), and True. False, having written nothing (the reads are
    snapshot reads the long way makes again, from the transaction's own cache), for any
    other case: the caller acks the long way (``ack_in``), which raises or acts as ever.
    Composes inside the caller's transaction."""
    if not isinstance(m, Message) or not m.receipt:
        return False  # (ack_in says why)
    held = _held.get(m.receipt)
    if held is None:
        return False
    written, rec, at_keys, at = held
    extra = rec.extra
    if (
        at_keys is not keys
        or rec.id != m.id
        or rec.chunks
        or rec.expires_us is not None
        or VOLATILE in extra
        or "strict" in extra
    ):
        return False
    if getattr(tr.db, "may_conflict", True):  # (settled_counters' condition)
        return False
    read = _ack_reads.get(keys.packed)
    if read is None:
        if len(_ack_reads) > 4096:  # a process settling in very many queues: start again
            _ack_reads.clear()
        read = _ack_reads[keys.packed] = (keys.guard, *settled_counters(tr, keys))
    guard_key, inflight_key, done_key = read
    # privileges.check's one round trip: the guard, the leased record, the two counters
    guard, raw, inflight, done = tr.snapshot.get_many([guard_key, at[0], inflight_key, done_key])
    if raw != written or (guard is not None and not dequeuer(tr.db, keys, guard)):
        return False  # another lease's record; an owner who did not grant the right (ack_in raises)
    if int(extra["deadline"]) <= int(tr.get_read_version()):  # db_now where nothing conflicts
        return False  # expired: the long way says so
    try:  # count_known's arithmetic; a counter of another length or past 64 bits: the long way
        counts = (
            _MINUS_ONE if inflight is None else _PACK(_UNPACK(inflight)[0] - 1),
            _ONE if done is None else _PACK(_UNPACK(done)[0] + 1),
        )
    except struct.error:
        return False
    del _held[m.receipt]  # (_lease_of's pop: the lease is settled)
    end_lease_one(tr, at, (inflight_key, done_key), counts)
    if JOURNALED in extra:
        record_short(tr, keys, "ack", rec.id, rec.deliveries)  # (finish_lease's entry)
    return True


_ack_reads: dict[bytes, tuple[bytes, ...]] = {}  # ack_short's keys: the guard and its two counters


def ack_own(db: object, keys: QueueKeys, m: Message) -> bool:
    """``Queue.ack(db, m)`` where its own retried transaction needs no receipt (nothing
    conflicts, no commit ends unknown: the embedded engine): one transaction whose step is
    :func:`ack_short`, and the long way (:func:`ack_in`, a strict queue's wake) in the same
    transaction when the case is another; True once it committed. False, having run nothing,
    on any other engine or in a caller's transaction: the caller acks as ever
    (``receipts.run_once_confirmed``)."""
    own = own_database(db)
    if own is None:
        return False

    def step(t: Transaction, _: Attempt) -> None:
        if not ack_short(keys, t, m) and ack_in(keys, t, m, None).extra.get("strict"):
            wake(t, keys)  # strict order: the next delivery may go ahead now

    retry_loop(own, step, None, True)
    return True


def own_database(db: object) -> Database | None:
    """``db`` when it is a Database (as ``adopt`` returns it) whose own transactions need no
    receipt: nothing conflicts and no commit ends unknown (``engine_traits``: the embedded
    engine); else None (a transaction, another engine, a wrapped one)."""
    kind = type(db)
    if kind not in OWN_KINDS:  # adopt and is_transaction asked once per type (below)
        if adopt(db) is not db or is_transaction(db):
            return None
        OWN_KINDS.add(kind)
    # engine_traits' own reading, on the instance (it may set either itself)
    if getattr(db, "may_conflict", True) or getattr(db, "may_commit_unknown", True):
        return None
    return db  # type: ignore[return-value]  # (adopt returned it as it is: a Database)


#: The kinds of Database :func:`own_database` has seen ``adopt`` return as they are (whose
#: callers then ask only the instance's traits).
OWN_KINDS: set[type] = set()


def nack_in(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    m: Message,
    delay: float | None,
    reason: str | None,
    now: int,
    discard: bool = False,
) -> str:
    rec = _leased(keys, tr, m, now)
    end_lease(tr, keys, rec)
    back = bytes.fromhex(rec.extra["key"])
    return release(keys, tr, cfg, rec, back, reason=reason, delay=delay, now=now, discard=discard)


def release_in(keys: QueueKeys, tr: Transaction, m: Message, now: int) -> None:
    """Back to its original place at once; the delivery is not counted (it never started)."""
    rec = _leased(keys, tr, m, now, allow_expired=True)
    end_lease(tr, keys, rec)
    extra = {k: v for k, v in rec.extra.items() if k not in LEASE_FIELDS}
    back = rec.with_(deliveries=max(0, rec.deliveries - 1), extra=extra)
    key = bytes.fromhex(rec.extra["key"])
    journaled = bool(rec.extra.get(JOURNALED))
    put_ready(tr, keys, key, back, keys.parse_ready(key)[0], journaled=journaled, note=Note("release"))


def extend_in(keys: QueueKeys, tr: Transaction, m: Message, seconds: float, now: int) -> Message:
    rec = _leased(keys, tr, m, now)
    deadline = now + versions(seconds)
    until = lease_until(seconds)
    extra = {**rec.extra, "deadline": deadline, "until": until}
    renew_lease(tr, keys, rec, rec.with_(extra=extra), deadline, str(m.receipt))
    return Message.from_record(
        rec.with_(extra=extra),
        keys.name,
        m.priority,
        m.key,
        m.payload,
        receipt=m.receipt,
        lease_deadline=until / 1e6,
        expires_at=m.expires_at,
    )


def expire_lease(
    keys: QueueKeys,
    tr: Transaction,
    cfg: QueueConfig,
    lease_key: bytes,
    now: int,
    budget: Budget | None = None,
) -> str | None:
    """Release the message of an expired lease entry (a sweep step); None if already settled,
    ``later`` if ``budget`` cannot afford the move (nothing written)."""
    _, deadline, msg_id = keys.unpack_tail(lease_key)
    if tr.get(lease_key) is None:
        return None
    raw = tr.get(keys.inflight_key(msg_id))
    if raw is None:
        drop_stale_entry(tr, lease_key)
        return None
    try:
        rec = decode_record(raw, keys, keys.inflight_key(msg_id), msg_id)
    except CorruptMessageError as exc:
        move_corrupt(
            keys, tr, cfg, keys.inflight_key(msg_id), raw, exc, budget, state="inflight", also_clear=lease_key
        )
        return CORRUPT_REASON
    if int(rec.extra.get("deadline", -1)) != deadline:
        drop_stale_entry(tr, lease_key)
        return None  # extended since: this entry is stale
    if budget is not None and not budget.take(move_cost(len(lease_key), len(raw), rec.chunks)):
        return "later"
    end_lease(tr, keys, rec)
    ready_key = bytes.fromhex(rec.extra["key"])
    return release(keys, tr, cfg, rec, ready_key, reason=None, delay=None, now=now, op="lease_expired")


def promote_delayed(
    keys: QueueKeys, tr: Transaction, cfg: QueueConfig, dkey: bytes, now: int, budget: Budget | None = None
) -> str | None:
    """Move a due delayed message to the ready set (or expire it); None if already moved,
    ``later`` if ``budget`` cannot afford the move (nothing written)."""
    raw = tr.get(dkey)
    if raw is None:
        return None
    try:
        rec = decode_record(raw, keys, dkey)
    except CorruptMessageError as exc:
        move_corrupt(keys, tr, cfg, dkey, raw, exc, budget, state="delayed")
        return CORRUPT_REASON
    if budget is not None and not budget.take(move_cost(len(dkey), len(raw), rec.chunks)):
        return "later"
    if rec.expired(now):
        take_delayed(tr, keys, dkey, rec, expired=True)
        expire_unready(keys, tr, cfg, rec)
        return "expired"
    take_delayed(tr, keys, dkey, rec)
    extra = dict(rec.extra)
    target = extra.pop("key", None)
    priority = int(extra.pop("priority", 0))
    back = None if target is None else bytes.fromhex(target)
    put_ready(tr, keys, back, rec.with_(extra=extra), priority, journaled=cfg.journal, note=Note("promote"))
    return "ready"


def open_for_dequeue(tr: Transaction, keys: QueueKeys, meta: Meta | None) -> tuple[QueueConfig, Meta] | None:
    """The queue's settings and metadata for a dequeue or lease, once ``tr``'s principal may
    dequeue; None when the queue was never created (empty); QueueStoppedError when paused."""
    if meta is None:
        meta = checked(tr, keys, "dequeue")
    else:
        check(tr, keys, "dequeue", meta)
    if meta.config is None:
        return None
    if not meta.state.dequeue:
        raise QueueStoppedError(f"dequeue is disabled on queue {keys.name!r}")
    return meta.config, meta


def message_elsewhere(keys: QueueKeys, tr: Transaction, key: bytes, raw: bytes) -> Message | None:
    """A message found through the id index outside the ready set (leased or delayed)."""
    tag = keys.unpack_tail(key)[0]
    rec = decode_record(raw, keys, key)
    payload = read_payload(tr, keys, rec)
    deadline = None
    if tag == "f":
        ready_key = bytes.fromhex(rec.extra["key"])
        deadline = int(rec.extra["until"]) / 1e6
        priority = keys.parse_ready(ready_key)[0]
    elif tag == "d":
        ready_key = bytes.fromhex(rec.extra["key"]) if "key" in rec.extra else b""
        priority = int(rec.extra.get("priority", 0))
    else:
        return None
    return Message.from_record(
        rec, keys.name, priority, ready_key, payload, lease_deadline=deadline, expires_at=expires_at(tr, rec)
    )


def check_lease_seconds(seconds: object) -> float:
    """A lease length: a number of seconds above 0 and at most ten years (``check_duration``)."""
    return check_duration("lease_seconds", seconds, positive=True)


def count_failed_attempt(keys: QueueKeys, db: Database, msg: Message, error: EngineError) -> None:
    """The caller's transaction that dequeued ``msg`` did not commit: count the delivery.

    Runs after that transaction has ended (its locks released), in one of its own. A
    failure of the engine (:func:`engine_fault`: a conflict, an unknown commit result, a
    full disk ...) or an abort under :func:`not_counted` is not the message's doing: not
    counted. An application abort (1025) and a handler too slow for the 5-second window
    (1007) are counted, with the reason the caller gave (see :func:`failure_reason`), else
    what the error says (1007: :data:`TOO_OLD_REASON`).
    """
    if error.maybe_committed or engine_fault(error) or _uncounted.get(id(msg)) == msg.id:
        return
    reason = _reason_of(msg, error)
    noted = _noted(msg)
    delay, discard = (noted[2], noted[3]) if noted is not None else (None, False)

    def body(t: Transaction, _: bool) -> None:
        where = locate(t, keys, msg.id)
        raw = None if where is None else t.get(where)
        if where is None or raw is None:
            return  # taken by another consumer, or the caller's commit did land (1021)
        rec = decode_record(raw, keys, where, msg.id)
        if rec.deliveries >= msg.deliveries:
            return  # counted already (this count's own commit ended unknown, then retried)
        tag = keys.unpack_tail(where)[0]
        if tag == "r":
            ready_key = where
        elif tag == "d":
            # The dequeue promoted a due delayed message itself, and the abort undid that too:
            # it is still delayed, with the place it was due to go back to (if a retry).
            extra = dict(rec.extra)
            target = extra.pop("key", None)
            extra.pop("priority", None)
            ready_key = bytes.fromhex(target) if target else msg.key
            rec = rec.with_(extra=extra)
        else:
            return  # leased again meanwhile: its lease counts its deliveries
        cfg = config_or_create(t, keys)
        remove_message(t, keys, where, rec, chunks=False, count="ready" if tag == "r" else "delayed")
        failed = rec.with_(deliveries=rec.deliveries + 1)
        release(keys, t, cfg, failed, ready_key, reason=reason, delay=delay, now=db_now(t), discard=discard)

    try:
        run_once(db, body)
    except Exception:  # never mask the caller's own error with this bookkeeping
        log.exception("fdbqueue: could not count the failed delivery of %s on %r", msg.id, keys.name)
