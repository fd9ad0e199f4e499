"""What every move of a message shares: the note the journal takes of it (:class:`Note`) and
what follows a move (:func:`after`), a message cleared from wherever it is with its entries
(:func:`remove_message`), chunks copied between queues, counters written as read where nothing
conflicts (:func:`count_known`, :func:`count_made_ready`), and the marks a lease leaves on a
record. Part of the one writer of message state (``fdbqueue.ops.moves``): every function
composes inside the caller's transaction.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.ops import journaling
from fdbqueue.ops.workindex import UNREAD
from fdbqueue.store.codec import MINUS_ONE, pack_count
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record

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


def copy_chunks(tr: Transaction, src: QueueKeys, dst: QueueKeys, rec: Record) -> None:
    """Copy ``rec``'s payload chunks (if it has any) from queue ``src`` to queue ``dst``."""
    if rec.chunks:
        for kv in tr.get_range(*src.chunk_range(rec.id)):
            tr.set(dst.chunk_key(rec.id, src.unpack_tail(kv.key)[2]), kv.value)
