"""A message leaving its queue to a consumer: taken by a dequeue, handed to a staged dequeue's
result (collected, dropped or reclaimed later), or sent to another database by a forwarder.
Part of the one writer of message state (``fdbqueue.ops.moves``): every function composes
inside the caller's transaction.
"""

from __future__ import annotations

from fdbqueue.engines.contract import Transaction
from fdbqueue.ops import journaling
from fdbqueue.ops.moves.core import Note, after, remove_message
from fdbqueue.ops.moves.places import put_ready
from fdbqueue.ops.receipts import encode_result
from fdbqueue.store.codec import MINUS_ONE, ONE, pack_count
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record


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


def take(tr: Transaction, keys: QueueKeys, key: bytes, rec: Record, *, journaled: bool = False) -> None:
    """A dequeue: the ready message at ``key`` is gone (with its chunks), counted done."""
    remove_message(tr, keys, key, rec)
    tr.add(keys.counter("ready"), MINUS_ONE)
    tr.add(keys.counter("done"), ONE)
    if journaled:
        # after()'s entry, without a Note and a copy of the record for its deliveries
        journaling.record(tr, keys, "dequeue", rec.id, deliveries=rec.deliveries + 1)


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
