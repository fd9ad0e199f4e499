"""The one writer of message state: every move of a message between its places.

A message is ready ``("r", -priority, index, rand)``, leased ``("f", id)`` with a lease
entry ``("l", deadline, id)``, delayed ``("d", due, id)``, or gone; an id entry finds it away
from home, a TTL entry ``("x", expires, id)`` finds it when it expires, its payload may be
in chunks ``("b", id, n)`` (``layout.py`` has the keys). Every write or clear of those keys,
and of the counters that count them, is made here and nowhere else; and after each move,
in the same transaction, what must follow it: the counters, the wake key, the journal, the
work index (``workindex``). That is how FoundationDB's record layer keeps its secondary
indexes: an index maintainer's ``update(old, new)`` runs inside the transaction that
changes the record (FoundationDB Record Layer, "IndexMaintainer"), so no index is ever out
of step with its records.

The modules above decide where a message goes (delivery policies, sweeps, dequeues); they
call the functions here to move it. Every function composes inside the caller's
transaction.
"""

from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import CorruptMessageError, EngineError
from fdbqueue.ops import journaling, workindex
from fdbqueue.ops.privileges import error_queue
from fdbqueue.ops.receipts import encode_result
from fdbqueue.ops.workindex import UNREAD
from fdbqueue.store.budget import Budget, move_cost
from fdbqueue.store.clock import now_us
from fdbqueue.store.codec import MINUS_ONE, ONE, pack_count, unpack_count
from fdbqueue.store.config import QueueConfig, bump_metadata_version
from fdbqueue.store.entropy import new_id, new_rand
from fdbqueue.store.layout import QueueKeys, ready_count
from fdbqueue.store.record import Record, decode_record, encode_plain, fit_reason, seal_chunk

log = logging.getLogger("fdbqueue")
_I64 = struct.Struct("<q")  # a counter's value (FoundationDB's atomic ADD: little-endian)
_I64_PACK, _I64_UNPACK = _I64.pack, _I64.unpack

# What a lease adds to a record's extra (and a release takes away again).
LEASE_FIELDS = ("key", "receipt", "deadline", "until", "strict", "j", "v")
CORRUPT_REASON = "corrupt"
# A leased record of a journaled queue carries this mark, so that its ack and release
# journal without reading the queue's settings (they read none but the guard).
JOURNALED = "j"
VOLATILE = "v"  # and of a volatile queue: so that they declare it (engines skip the fsync)


@dataclass(frozen=True, slots=True)
class Note:
    """What the journal records of a move: its operation (``journaling.OPS``), the reason
    given and the details (where it went, where it came from)."""

    op: str
    reason: str | None = None
    details: Mapping[str, Any] | None = None


# The notes of the hot moves, made once (a Note is frozen: one instance serves every move).
_LEASE, _ACK = Note("lease"), Note("ack")


def after(tr: Transaction, keys: QueueKeys, journaled: bool, note: Note | None, rec: Record) -> None:
    """What follows a move of ``rec`` in the same transaction besides its counters (which each
    move adds itself, once per batch where it can): the journal entry, when the queue is
    journaled. The slot where later maintainers (an index of queues with work) plug in."""
    if journaled and note is not None:
        journaling.record(
            tr, keys, note.op, rec.id, deliveries=rec.deliveries, reason=note.reason, details=note.details
        )


def remove_message(
    tr: Transaction,
    keys: QueueKeys,
    key: bytes,
    rec: Record,
    *,
    chunks: bool = True,
    count: str | None = None,
) -> None:
    """Clear a message from wherever ``key`` says it is, with its id entry and TTL entry;
    ``count``: the counter of the place it leaves (``ready``, ``delayed``), when the caller
    does not count the move itself."""
    if count is not None:
        tr.add(keys.counter(count), MINUS_ONE)
    tr.clear(key)
    if key != keys.home_key(rec.id):  # at home it has no id entry
        tr.clear(keys.id_key(rec.id))
    if rec.expires_us is not None:
        tr.clear(keys.expiry_key(rec.expires_us, rec.id))
    if chunks and rec.chunks:
        tr.clear_range(*keys.chunk_range(rec.id))


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


def put_leased(
    tr: Transaction,
    keys: QueueKeys,
    key: bytes,
    leased: Record,
    deadline: int,
    receipt: str,
    *,
    count: bool,
    note: Note | None = None,
    raw: bytes | None = None,
    at: tuple[bytes, bytes] | None = None,
) -> None:
    """Put a message taken from the ready ``key`` (cleared by the caller) in flight until
    ``deadline`` under ``receipt``; ``count=False``: the caller counts a batch at once.
    ``raw``: ``leased.encode()``, when the caller made it; ``at``: its ``inflight_key`` and
    ``lease_key``, when the caller made them."""
    ikey, lkey = (keys.inflight_key(leased.id), keys.lease_key(deadline, leased.id)) if at is None else at
    tr.set(ikey, leased.encode() if raw is None else raw)
    tr.set(lkey, receipt.encode())
    if key != keys.home_key(leased.id):
        tr.clear(keys.id_key(leased.id))  # it pointed at the ready key; ("f", id) is found by id
    if count:
        tr.add(keys.counter("inflight"), ONE)
    if JOURNALED in leased.extra:
        after(tr, keys, True, note or _LEASE, leased)


def put_leased_batch(
    tr: Transaction,
    keys: QueueKeys,
    deadline: int,
    leases: list[tuple[bytes, Record, bytes, tuple[bytes, bytes], str]],
) -> None:
    """Each of ``leases`` taken out of the ready set, its TTL entry cleared (a lease ends
    before it matters: a release sets it again), and :func:`put_leased` (``count=False``) of it
    (ready key, leased record, its bytes, its ``inflight_key`` and ``lease_key``, receipt),
    leased until ``deadline``: a batch's in one call. The caller counts them
    (:func:`count_leased`)."""
    for key, leased, raw, at, receipt in leases:
        tr.clear(key)
        if leased.expires_us is not None:
            tr.clear(keys.expiry_key(leased.expires_us, leased.id))
        put_leased(tr, keys, key, leased, deadline, receipt, count=False, raw=raw, at=at)


def put_leased_one(
    tr: Transaction,
    key: bytes,
    id_key: bytes | None,
    at: tuple[bytes, bytes],
    raw: bytes,
    receipt: bytes,
    counters: tuple[bytes, bytes],
    counts: tuple[bytes, bytes],
) -> None:
    """The common lease of one message (``leasing.lease_short``): :func:`put_leased_batch`'s
    writes for a record without a TTL entry on a queue without a journal, and the ready and
    in-flight ``counters`` set to ``counts`` (:func:`count_known`'s values, made by the caller
    from what it read). ``id_key``: the message's id entry, for one away from home."""
    tr.clear(key)
    if id_key is not None:
        tr.clear(id_key)  # it pointed at the ready key; ("f", id) is found by id
    tr.set(at[0], raw)
    tr.set(at[1], receipt)
    tr.set(counters[0], counts[0])
    tr.set(counters[1], counts[1])


def end_lease_one(
    tr: Transaction, at: tuple[bytes, bytes], counters: Sequence[bytes], counts: tuple[bytes, bytes]
) -> None:
    """The common ack of one message (``delivery.ack_short``): :func:`finish_lease`'s two
    clears for a record without chunks, TTL or journal, and the in-flight and done
    ``counters`` set to ``counts`` (:func:`count_known`'s values, made by the caller)."""
    tr.clear(at[0])
    tr.clear(at[1])
    tr.set(counters[0], counts[0])
    tr.set(counters[1], counts[1])


def end_lease(
    tr: Transaction,
    keys: QueueKeys,
    rec: Record,
    *,
    count: bool = True,
    at: tuple[bytes, bytes] | None = None,
) -> None:
    """Take a leased message out of flight (its lease entry with it); the caller puts it
    somewhere. ``count=False``: the caller counts a batch at once (:func:`count_settled`).
    ``at``: its ``inflight_key`` and ``lease_key``, when the caller has them (made at its lease)."""
    if at is None:
        at = keys.inflight_key(rec.id), keys.lease_key(int(rec.extra["deadline"]), rec.id)
    tr.clear(at[0])
    tr.clear(at[1])
    if count:
        tr.add(keys.counter("inflight"), MINUS_ONE)


def end_leases(tr: Transaction, ats: list[tuple[bytes, bytes]]) -> None:
    """A batch of acked messages with nothing more to clear (no chunks, no TTL entry, no
    journal, not strict order): :func:`finish_lease`'s two clears of each, ``ats`` their
    ``inflight_key`` and ``lease_key`` as their leases made them. The caller counts them
    (:func:`count_settled`)."""
    for ikey, lkey in ats:
        tr.clear(ikey)
        tr.clear(lkey)


def finish_lease(
    tr: Transaction,
    keys: QueueKeys,
    rec: Record,
    note: Note | None = None,
    *,
    count: bool = True,
    at: tuple[bytes, bytes] | None = None,
) -> None:
    """An acked message: out of flight and gone, with its chunks and TTL entry; counted done.
    Journaled ``ack``, or as ``note`` says (a forwarder's ``forward_out``). ``count=False``:
    the caller counts a batch of acks at once (:func:`count_settled`). ``at``: as
    :func:`end_lease`'s."""
    end_lease(tr, keys, rec, count=count, at=at)
    if JOURNALED in rec.extra:
        after(tr, keys, True, note or _ACK, rec)
    if count:
        tr.add(keys.counter("done"), ONE)
    if rec.chunks:
        tr.clear_range(*keys.chunk_range(rec.id))
    if rec.expires_us is not None:
        tr.clear(keys.expiry_key(rec.expires_us, rec.id))


def renew_lease(
    tr: Transaction, keys: QueueKeys, rec: Record, renewed: Record, deadline: int, receipt: str
) -> None:
    """Move a lease's deadline: ``renewed`` replaces ``rec`` in flight under a new lease entry."""
    tr.clear(keys.lease_key(int(rec.extra["deadline"]), rec.id))
    tr.set(keys.inflight_key(rec.id), renewed.encode())
    tr.set(keys.lease_key(deadline, rec.id), receipt.encode())


def drop_stale_entry(tr: Transaction, key: bytes) -> None:
    """Clear an index entry (lease or TTL) whose message moved on or is gone."""
    tr.clear(key)


def take_delayed(
    tr: Transaction, keys: QueueKeys, dkey: bytes, rec: Record, *, expired: bool = False
) -> None:
    """Take a due message out of the delayed set (the caller puts it somewhere); ``expired``:
    its TTL entry goes too."""
    tr.clear(dkey)
    tr.add(keys.counter("delayed"), MINUS_ONE)
    if expired and rec.expires_us is not None:
        tr.clear(keys.expiry_key(rec.expires_us, rec.id))


# FoundationDB's blob recipe: values of about 10 kB (its documentation, "Blob" design recipe).
CHUNK_SIZE = 10_000


def write_new(
    tr: Transaction,
    keys: QueueKeys,
    key: bytes,
    rec: Record,
    *,
    home: bool,
    payload: bytes | None,
    journaled: bool = False,
    details: Mapping[str, Any] | None = None,
    origin: str | None = None,
) -> None:
    """Write a new message at ``key`` (ready or delayed); ``home``: its id names ``key`` (no id
    entry); ``payload``: the payload to write in sealed chunks when ``rec.chunks``. The caller
    counts the batch (:func:`count_new`)."""
    if payload is not None:
        for n in range(rec.chunks):
            tr.set(keys.chunk_key(rec.id, n), seal_chunk(payload[n * CHUNK_SIZE : (n + 1) * CHUNK_SIZE]))
    if rec.expires_us is not None:
        tr.set(keys.expiry_key(rec.expires_us, rec.id), b"")
    tr.set(key, rec.encode())
    if not home:
        tr.set(keys.id_key(rec.id), key)
    if journaled:
        if origin is not None:
            after(tr, keys, True, Note("forward_in", None, {**(details or {}), "origin": origin}), rec)
        else:
            after(tr, keys, True, Note("enqueue", None, details), rec)


def write_plain(
    tr: Transaction, key: bytes, msg_id: str, enqueued_us: int, content_type: str, payload: bytes
) -> None:
    """:func:`write_new` of the common new message (ready at the key its id names, no TTL,
    headers, chunks nor journal): its one write, the record encoded directly
    (``record.encode_plain``). The caller counts it (:func:`count_new`)."""
    tr.set(key, encode_plain(msg_id, enqueued_us, content_type, payload))


def count_plain_enqueue(
    tr: Transaction, wake_at: bytes, made: bytes, ready_at: bytes, counted_at: bytes, first: bytes | None
) -> None:
    """The counters of the common enqueue of one message (``enqueuing._plain_step``): the wake
    counter (``wake_at``) set to ``made``, the value read plus one, which counts the message
    (ready - taken + (wake - counted): ``store/layout.py``); where the queue had no counted
    counter yet (``first``: the ready counter read plus one), the ready counter set to ``first``
    and the counted counter to ``made``, so that the message is counted once from here on."""
    tr.set(wake_at, made)
    if first is not None:
        tr.set(ready_at, first)
        tr.set(counted_at, made)


def take_plain(
    tr: Transaction, keys: QueueKeys, key: bytes, msg_id: str, taken_at: bytes, taken: bytes
) -> None:
    """The common take of the head (``head.take_short``, ``contended.take_contended``): the
    record at ``key`` cleared, its id entry where it is away from home, and the taken counter
    (``taken_at``) set to ``taken``, the value read plus one (every reader takes ready as
    ready - taken and done as done + taken: ``store/layout.py``). No Record built, no journal
    entry (the caller's, ``journaling.record_short``)."""
    tr.clear(key)
    if key != keys.home_key(msg_id):  # at home it has no id entry
        tr.clear(keys.id_key(msg_id))
    tr.set(taken_at, taken)


def write_plain_journaled(
    tr: Transaction,
    keys: QueueKeys,
    key: bytes,
    msg_id: str,
    enqueued_us: int,
    content_type: str,
    payload: bytes,
    priority: int,
    at_us: int,
) -> None:
    """:func:`write_plain` on a journaled queue: the same write, then the ``enqueue`` entry
    :func:`write_new` would journal (details: the priority, when not 0), the writer's wall
    clock ``at_us`` read by the caller. The caller counts it (:func:`count_new`)."""
    tr.set(key, encode_plain(msg_id, enqueued_us, content_type, payload))
    journaling.record_enqueue(tr, keys, msg_id, priority, at_us)


def count_known(
    tr: Transaction, counters: Sequence[bytes], values: Sequence[bytes | None], deltas: tuple[int, int]
) -> bool:
    """Write two counters as their values read in ``tr`` (``values``, through its own writes,
    with nothing written to them since) plus ``deltas``: what ``tr.add`` of the deltas leaves.
    Only where transactions cannot conflict (``Meta.cluster`` false): one writer holds the
    store from its first read to its commit and the engine resolves an add at the call
    against the same value, so a set is the cheaper call (no read of the value, no
    arithmetic in the engine). As the add: an absent counter counts from 0 and a sum wraps at
    64 bits. False, writing nothing, when a value is not an 8-byte counter (the add
    zero-extends or truncates it): the caller adds."""
    a, b = values
    dx, dy = deltas
    try:  # (the common case: two 8-byte counters, no wrap; struct.error says which is not)
        x = dx if a is None else _I64_UNPACK(a)[0] + dx
        y = dy if b is None else _I64_UNPACK(b)[0] + dy
        a, b = _I64_PACK(x), _I64_PACK(y)
    except struct.error:
        if (a is not None and len(a) != 8) or (b is not None and len(b) != 8):
            return False
        # past 64 bits: wrapped, as FoundationDB's ADD
        x = dx if a is None else _I64_UNPACK(a)[0] + dx
        y = dy if b is None else _I64_UNPACK(b)[0] + dy
        a, b = _I64_PACK((x + 2**63) % 2**64 - 2**63), _I64_PACK((y + 2**63) % 2**64 - 2**63)
    tr.set(counters[0], a)
    tr.set(counters[1], b)
    return True


def count_new(
    tr: Transaction,
    keys: QueueKeys,
    ready: int,
    delayed: int,
    new_priorities: AbstractSet[int],
    work: bytes | object | None = workindex.UNREAD,
    *,
    conflicts: bool = True,
    seen: list[bytes | None] | None = None,
    counted: bytes | None = UNREAD,
) -> None:
    """Count a batch of new messages: one atomic add per counter (no conflicts between
    producers), the wake key for blocked consumers, and a marker per new priority.
    ``work``: the queue's work-index entry when the caller read it (``Meta.work``);
    ``conflicts``: False where the engine never conflicts (``Meta.cluster``); ``seen``: what
    the caller read of the counters in this transaction, nothing written to them since
    (``Meta.raw``, in ``QueueKeys.meta_read``'s order); ``counted``: the counted counter as
    read, where the caller read it apart (:func:`count_made_ready`)."""
    if new_priorities:
        for p in new_priorities:
            tr.set(keys.priority_marker(p), b"")
        bump_metadata_version(tr, keys)  # cached marker sets elsewhere are out of date
    read = keys.meta_read()  # the counters' keys, packed once: [1] ready, [2] wake, [5] delayed
    # Where nothing conflicts, the ready and wake counters as read, moved on (count_known).
    if ready and (conflicts or seen is None or not count_known(tr, read[1:3], seen[1:3], (ready, ready))):
        n = ONE if ready == 1 else pack_count(ready)
        tr.add(read[1], n)
        tr.add(read[2], n)
    if ready:
        if counted is UNREAD and seen is not None and len(seen) > 7:
            counted = seen[7]
        count_made_ready(tr, keys, ready, counted)
    if delayed:
        tr.add(read[5], ONE if delayed == 1 else pack_count(delayed))
    if (ready or delayed) and (conflicts or work != b""):  # (marked, and nothing conflicts: no call)
        workindex.mark(tr, keys, work, conflicts=conflicts)


def take(tr: Transaction, keys: QueueKeys, key: bytes, rec: Record, *, journaled: bool = False) -> None:
    """A dequeue: the ready message at ``key`` is gone (with its chunks), counted done."""
    remove_message(tr, keys, key, rec)
    tr.add(keys.counter("ready"), MINUS_ONE)
    tr.add(keys.counter("done"), ONE)
    if journaled:
        # after()'s entry, without a Note and a copy of the record for its deliveries
        journaling.record(tr, keys, "dequeue", rec.id, deliveries=rec.deliveries + 1)


def wake(tr: Transaction, keys: QueueKeys, n: int = 1) -> None:
    """Wake blocked consumers: a watch on the wake key fires (an atomic add: no conflicts);
    and the work index's consumers (a strict-order ack, dequeue enabled again)."""
    tr.add(keys.wake, pack_count(n) if n != 1 else ONE)
    count_made_ready(tr, keys, n)  # (made ready: none; the ready count must not move)
    workindex.mark(tr, keys)


def count_made_ready(tr: Transaction, keys: QueueKeys, n: int, counted: bytes | None = UNREAD) -> None:
    """Keep the counted counter in step with the wake counter that the caller adds ``n`` to
    (having counted what it made ready in the ready counter, if anything): the ready count is
    ready - taken + (wake - counted) (``layout.ready_count``), so that what the embedded
    engine's short enqueue (``enqueuing._plain_step``) counts in wake alone is the difference.
    Only where it is present (absent: the ready count is ready - taken) and where nothing
    conflicts: elsewhere (FoundationDB, sim) the short enqueue never runs, so it is never
    present and nothing is read. ``counted``: as the caller read it, else read here."""
    if getattr(tr.db, "may_conflict", True):
        return
    key = keys.counter("counted")
    if counted is UNREAD:
        counted = tr.snapshot.get(key)
    if counted is None:
        return
    try:  # count_known's arithmetic; another length or past 64 bits: the add's
        tr.set(key, _I64_PACK(_I64_UNPACK(counted)[0] + n))
    except struct.error:
        tr.add(key, pack_count(n))


def count_leased(tr: Transaction, keys: QueueKeys, n: int) -> None:
    """A batch of ``n`` leases from the ready set: one atomic add per counter, not one per message."""
    if n:
        tr.add(keys.counter("ready"), pack_count(-n))
        tr.add(keys.counter("inflight"), pack_count(n))


def count_settled(tr: Transaction, keys: QueueKeys, n: int) -> None:
    """A batch of ``n`` acks (:func:`finish_lease` with ``count=False``): one atomic add per
    counter, not one per message."""
    if n:
        tr.add(keys.counter("inflight"), pack_count(-n))
        tr.add(keys.counter("done"), pack_count(n))


def hand_over(
    tr: Transaction,
    keys: QueueKeys,
    res_key: bytes,
    now: int,
    key: bytes,
    raw: bytes,
    rec: Record,
    *,
    journaled: bool = False,
) -> None:
    """A staged dequeue pairs the ready message at ``key`` with a waiting request: the record
    moves to the request's result (its chunks stay for the requester to read), counted by
    :func:`count_handed`."""
    tr.set(res_key, encode_result(now, key, raw))
    remove_message(tr, keys, key, rec, chunks=False)
    if journaled:
        # after()'s entry, without a Note and a copy of the record for its deliveries
        journaling.record(tr, keys, "dequeue", rec.id, deliveries=rec.deliveries + 1)


def count_handed(tr: Transaction, keys: QueueKeys, n: int) -> None:
    """``n`` messages handed to waiting requests: one atomic add per counter for the batch."""
    if n:
        tr.add(keys.counter("ready"), pack_count(-n))
        tr.add(keys.counter("done"), pack_count(n))


def collect_result(tr: Transaction, keys: QueueKeys, res_key: bytes, rec: Record) -> None:
    """The requester took its staged result: the message is gone, with its chunks."""
    tr.clear(res_key)
    if rec.chunks:
        tr.clear_range(*keys.chunk_range(rec.id))


def drop_result(tr: Transaction, res_key: bytes) -> None:
    """Clear a staged result whose record the caller moves elsewhere."""
    tr.clear(res_key)


def reclaim_result(
    tr: Transaction, keys: QueueKeys, res_key: bytes, key: bytes, rec: Record, *, journaled: bool = False
) -> None:
    """A staged result nobody collected (its requester died): back to its place in the ready
    set, no longer counted done (:func:`count_handed` counted it)."""
    tr.clear(res_key)
    note = Note("release", "its staged dequeue was never collected")
    put_ready(tr, keys, key, rec, keys.parse_ready(key)[0], journaled=journaled, note=note)
    tr.add(keys.counter("done"), MINUS_ONE)


def destroy(tr: Transaction, keys: QueueKeys, *, journaled: bool = False) -> None:
    """Remove the queue and every key it has: messages, indexes, counters, settings (its
    journal stays, until trimmed, with what of it is kept in the queue's keys on the embedded
    engine: the consuming operations' and the arrivals' history pointers, the entries and the
    bell, ``JournalKeys.queue_kept_ranges``)."""
    if journaled:
        journaling.record(tr, keys, "destroy")
    begin, end = keys.all_range()
    for kept, after in keys.journal_keys().queue_kept_ranges(keys.name):
        tr.clear_range(begin, kept)
        begin = after
    tr.clear_range(begin, end)
    tr.clear(keys.listing)
    workindex.unmark(tr, keys)


def purge(tr: Transaction, keys: QueueKeys) -> int:
    """Remove every message (ready, leased, delayed) and its indexes, keeping the settings;
    returns how many the counters said there were.

    Range clears, a few hundred bytes whatever the queue holds (a range clear counts its
    begin and end only: ``Transaction::getSize`` in ``fdbclient/NativeAPI.actor.cpp``). The
    counters are read at snapshot isolation: every enqueue and dequeue adds to them
    atomically, and a serializable read would make each of those adds conflict with the
    purge, which then never commits on a busy queue. Setting them to zero stays right
    whatever was added meanwhile: the same commit clears every message they count. The taken
    counter (layout.py: ready less it, done plus it) is folded into done and zeroed, so that
    the ready count starts from zero again; only the embedded engine writes it, where nothing
    conflicts (head.take_short), so what is read of it is what is there. So for the counted
    counter (ready plus wake less it: enqueuing._plain_step): cleared, the ready count is the
    ready counter's again (zero).
    """
    removed = 0
    taken, wake, counted = tr.snapshot.get_many([keys.counter(c) for c in ("taken", "wake", "counted")])
    for tag in ("ready", "inflight", "delayed"):
        raw = tr.snapshot.get(keys.counter(tag))
        removed += ready_count(raw, taken, wake, counted) if tag == "ready" else max(0, unpack_count(raw))
        tr.set(keys.counter(tag), pack_count(0))
    if taken is not None and unpack_count(taken):
        tr.add(keys.counter("done"), pack_count(unpack_count(taken)))
        tr.set(keys.counter("taken"), pack_count(0))
    if counted is not None:
        tr.clear(keys.counter("counted"))
    for begin, end in keys.message_ranges():
        tr.clear_range(begin, end)
    tr.clear_range(*keys.priority_marker_range())
    bump_metadata_version(tr, keys)
    return removed


def purge_some(tr: Transaction, keys: QueueKeys, limit: int) -> tuple[int, bool]:
    """A journaled queue's purge, one step: remove up to ``limit`` messages one by one, each
    journaled ``purge`` (so that its history ends there); returns how many, and whether
    more are left. A damaged record (no id to journal) is left to :func:`purge`'s clears."""
    n = 0
    for tag in ("r", "f", "d"):
        r = keys.q.range((tag,))
        kvs = tr.get_range(r.start, r.stop, limit - n + 1)
        for kv in kvs[: limit - n]:
            try:
                rec = decode_record(kv.value, keys, kv.key)
            except CorruptMessageError:
                continue
            if tag == "r":
                remove_message(tr, keys, kv.key, rec, count="ready")
            elif tag == "f":
                end_lease(tr, keys, rec)
                remove_message(tr, keys, kv.key, rec)  # its chunks and TTL entry
            else:
                take_delayed(tr, keys, kv.key, rec, expired=True)
                remove_message(tr, keys, kv.key, rec)
            after(tr, keys, True, Note("purge"), rec)
            n += 1
        if len(kvs) > limit - n or n >= limit:
            return n, True
    return n, False


def send_away(
    tr: Transaction, keys: QueueKeys, key: bytes, rec: Record, *, journaled: bool, note: Note
) -> None:
    """The ready message at ``key`` has left for another database (an exclusive forwarder
    installed it there): gone from its queue with its chunks, counted done (the caller adds
    the batch to ``done``: :func:`count_sent`), journaled as ``note``."""
    remove_message(tr, keys, key, rec, count="ready")
    if journaled:
        after(tr, keys, True, note, rec)


def count_sent(tr: Transaction, keys: QueueKeys, n: int) -> None:
    if n:
        tr.add(keys.counter("done"), pack_count(n))


def copy_chunks(tr: Transaction, src: QueueKeys, dst: QueueKeys, rec: Record) -> None:
    """Copy ``rec``'s payload chunks (if it has any) from queue ``src`` to queue ``dst``."""
    if rec.chunks:
        for kv in tr.get_range(*src.chunk_range(rec.id)):
            tr.set(dst.chunk_key(rec.id, src.unpack_tail(kv.key)[2]), kv.value)


def move_message(
    tr: Transaction,
    src: QueueKeys,
    src_journaled: bool,
    dst: QueueKeys,
    dst_journaled: bool,
    key: bytes,
    rec: Record,
) -> None:
    """Move the ready message at ``key`` of ``src`` to the tail of its priority in ``dst``,
    keeping its id, headers, priority, payload (its chunks copied), enqueue time, TTL and
    deliveries: the queue manager's forwarding between two queues, one transaction
    (Bernstein & Newcomer). Journaled ``move_out`` in ``src`` and ``move_in`` in ``dst``."""
    copy_chunks(tr, src, dst, rec)
    remove_message(tr, src, key, rec, count="ready")  # its chunks with it
    if src_journaled:
        after(tr, src, True, Note("move_out", None, {"to": dst.name}), rec)
    note = Note("move_in", None, {"origin": src.name})
    put_ready(tr, dst, None, rec, src.priority_of(key), journaled=dst_journaled, note=note)


def redrive_message(
    tr: Transaction,
    src: QueueKeys,
    src_journaled: bool,
    dst: QueueKeys,
    dst_journaled: bool,
    key: bytes,
    rec: Record,
) -> None:
    """Put the dead letter at ``key`` of error queue ``src`` back to work in ``dst``: at the
    tail of the priority it had, deliveries reset, its dead-letter fields dropped; payload
    (chunks copied), id, headers and enqueue time kept. Journaled ``redrive`` in both."""
    copy_chunks(tr, src, dst, rec)
    remove_message(tr, src, key, rec, count="ready")
    if src_journaled:
        after(tr, src, True, Note("redrive", None, {"to": dst.name}), rec)
    back = rec.with_(deliveries=0, extra={})
    note = Note("redrive", None, {"origin": src.name})
    put_ready(tr, dst, None, back, int(rec.extra.get("priority", 0)), journaled=dst_journaled, note=note)


def delete_message(tr: Transaction, keys: QueueKeys, key: bytes, rec: Record, *, journaled: bool) -> None:
    """Remove the message at ``key`` in whichever state it is (ready, leased, delayed) with
    its indexes and chunks; a leased one's holder then finds its lease gone. Journaled
    ``delete``."""
    tag = keys.unpack_tail(key)[0]
    if tag == "f":
        end_lease(tr, keys, rec)
        remove_message(tr, keys, key, rec)
    elif tag == "d":
        take_delayed(tr, keys, key, rec)
        remove_message(tr, keys, key, rec)
    else:
        remove_message(tr, keys, key, rec, count="ready")
    after(tr, keys, journaled, Note("delete"), rec)
