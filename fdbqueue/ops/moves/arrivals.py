"""New messages: a record written at its place (in sealed chunks when large), the common
enqueue's single write, and the counters of a batch of arrivals. Part of the one writer of
message state (``fdbqueue.ops.moves``): every function composes inside the caller's
transaction.
"""

from __future__ import annotations

from collections.abc import Mapping
from collections.abc import Set as AbstractSet
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.ops import journaling, workindex
from fdbqueue.ops.moves.core import Note, after, count_known, count_made_ready
from fdbqueue.ops.workindex import UNREAD
from fdbqueue.store.codec import ONE, pack_count
from fdbqueue.store.config import bump_metadata_version
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, encode_plain, seal_chunk

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
