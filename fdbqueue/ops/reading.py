"""A message as read: where it waits, its payload, and the :class:`Message` a caller is given.

What every reader of a message shares - dequeue, lease, browse, get, export, the dashboard -
apart from ``delivery.py``, which moves messages between their places: nothing here writes.
``locate`` finds a message by id (its home key, its lease, else its id entry); a payload is
inline or in chunks, joined and checked (``CorruptMessageError`` when they are damaged); a
TTL is kept in database time and shown as a wall-clock estimate. Every function composes
inside the caller's transaction.
"""

from __future__ import annotations

from fdbqueue.engines.contract import ReadView, Transaction
from fdbqueue.errors import CorruptMessageError
from fdbqueue.store.clock import db_now, now_us, seconds_of
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, join_chunks
from fdbqueue.types import Message


def expires_at(tr: Transaction, rec: Record) -> float | None:
    """``Message.expires_at``: when the message's TTL ends, as a wall-clock estimate (seconds
    since the epoch, by this client's clock); the TTL itself is kept in database time."""
    if rec.expires_us is None:
        return None
    return now_us() / 1e6 + seconds_of(rec.expires_us - db_now(tr))


def locate(tr: Transaction, keys: QueueKeys, msg_id: str) -> bytes | None:
    """The key where message ``msg_id`` is now, or None: its home key, its lease
    (``("f", id)``), else where its id entry points (delayed, or ready away from home)."""
    home = keys.home_key(msg_id)
    if home is not None and tr.get(home) is not None:
        return home
    fkey = keys.inflight_key(msg_id)
    if tr.get(fkey) is not None:
        return fkey
    return tr.get(keys.id_key(msg_id))


def read_payload(tr: ReadView, keys: QueueKeys, rec: Record) -> bytes:
    """``rec``'s payload: inline, or its chunks (one range read) joined and checked
    (CorruptMessageError when they are damaged)."""
    if not rec.chunks:
        return rec.payload
    values = [kv.value for kv in tr.get_range(*keys.chunk_range(rec.id))]
    return join_chunks(values, rec.chunks, keys.name, rec.id)


def read_payloads(
    tr: Transaction, keys: QueueKeys, recs: list[Record]
) -> tuple[dict[str, bytes], dict[str, CorruptMessageError]]:
    """The payloads of the chunked messages among ``recs``: one ``get_many`` for all their
    chunks (their count is in the record), not a range read per message. Second: the
    messages whose chunks are damaged.

    Snapshot reads: chunks never change while their message exists, and the message's
    own key carries the read conflict.
    """
    chunked = [rec for rec in recs if rec.chunks]
    if not chunked:
        return {}, {}
    values = iter(
        tr.snapshot.get_many([keys.chunk_key(rec.id, i) for rec in chunked for i in range(rec.chunks)])
    )
    payloads: dict[str, bytes] = {}
    damaged: dict[str, CorruptMessageError] = {}
    for rec in chunked:
        try:
            payloads[rec.id] = join_chunks(
                [next(values) for _ in range(rec.chunks)], rec.chunks, keys.name, rec.id
            )
        except CorruptMessageError as exc:
            damaged[rec.id] = exc
    return payloads, damaged


def to_message(
    tr: Transaction, keys: QueueKeys, key: bytes, rec: Record, *, delivered: bool = False
) -> Message:
    """The ready message ``rec`` at ``key`` as a :class:`Message` (its payload read)."""
    payload = rec.payload if not rec.chunks else read_payload(tr, keys, rec)
    priority = keys.priority_of(key)
    if rec.expires_us is None:
        return Message.from_record(rec, keys.name, priority, key, payload, delivered=delivered)
    return Message.from_record(
        rec, keys.name, priority, key, payload, delivered=delivered, expires_at=expires_at(tr, rec)
    )
