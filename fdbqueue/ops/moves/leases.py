"""A message put in flight (a lease) and taken out of it (an ack, or before a release or a
retry puts it elsewhere), a lease renewed, a stale index entry dropped, and the counters of a
batch of leases or acks. Part of the one writer of message state (``fdbqueue.ops.moves``):
every function composes inside the caller's transaction.
"""

from __future__ import annotations

from collections.abc import Sequence

from fdbqueue.engines.contract import Transaction
from fdbqueue.ops.moves.core import JOURNALED, Note, after
from fdbqueue.store.codec import MINUS_ONE, ONE, pack_count
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record

# The notes of the hot moves, made once (a Note is frozen: one instance serves every move).
_LEASE, _ACK = Note("lease"), Note("ack")


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
