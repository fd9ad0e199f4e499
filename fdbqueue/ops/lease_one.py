"""The common lease of one message: what its two steps share once each has its head.

``leasing.lease_short`` takes the head from the run its handle's last take kept;
``contended.lease_contended`` reads it, among other consumers (the kept head paused). From the
counters each read with the metadata version and the head's record on, the lease is the same:
the counters as ``moves.count_known`` would write them (:func:`lease_counts`), the leased
record's bytes made from the ready one in one pass (:func:`prepare_lease`, ``record.lease_plain``),
then the writes of the long way's ``lease_heads`` for one plain message and its ``Message``
(:func:`write_lease`). ``lease_short`` claims its kept run between the last two (a run serves
one take), which is why they are two calls. Everything here composes inside the caller's
transaction.
"""

from __future__ import annotations

import struct
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.ops import journaling
from fdbqueue.ops.delivery import hold
from fdbqueue.ops.moves.core import JOURNALED
from fdbqueue.ops.moves.leases import put_leased_one
from fdbqueue.store.clock import now_us
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, lease_plain
from fdbqueue.types import Message

_PACK, _UNPACK = struct.Struct("<q").pack, struct.Struct("<q").unpack
_ONE = _PACK(1)
_RECORD = tuple.__new__

#: What :func:`prepare_lease` makes of the head for :func:`write_lease`: its key, the key in
#: hex, the receipt (str and bytes), the deadline (versions), until (microseconds), whether the
#: queue journals, and ``record.lease_plain``'s fields with the leased record's bytes.
Prepared = tuple[bytes, str, str, bytes, int, int, bool, tuple[str, int, str, int, bytes, bytes]]


def lease_counts(
    keys: QueueKeys, tr: Transaction, ready: bytes, inflight: bytes | None, now: int
) -> tuple[bytes, bytes] | None:
    """The ready and in-flight counters after a lease of one, as ``count_known`` makes them
    from the values read (``ready``: 8 bytes), or None for the long way: a counter of another
    length or past 64 bits, or a lease in flight that may have expired (``meta.due_entries``'
    read of the lease index: the long way's due check releases it first)."""
    try:
        left = _PACK(_UNPACK(ready)[0] - 1)
        if inflight is None:
            return left, _ONE
        leases = _UNPACK(inflight)[0]
        held = _PACK(leases + 1)
    except struct.error:
        return None
    if leases > 0 and tr.snapshot.get_range(*keys.leases_due(now), 1):
        return None
    return left, held


def prepare_lease(
    key: bytes, raw: bytes, seconds: float | None, cfg: QueueConfig, now: int, receipt: str
) -> Prepared | None:
    """The head at ``key`` (its stored bytes ``raw``) leased under ``receipt + ".0"`` for
    ``seconds`` (None: the queue's lease_seconds) from database time ``now``, nothing written:
    the record read and its leased bytes made in one pass (``record.lease_plain``: the checks of
    ``decode_fields``, the bytes of ``encode_leased``); None for headers to copy, a TTL to
    check, chunks to read, a retry delay or more, or damage: the long way."""
    secs = seconds or cfg.lease_seconds
    deadline = now + round(secs * VERSIONS_PER_SECOND)  # (clock.versions)
    until = now_us() + int(secs * 1e6)  # (delivery.lease_until)
    key_hex = key.hex()
    rcpt = receipt + ".0"  # (receipt: hex digits, made by the callers with bytes.hex())
    rcpt_bytes = rcpt.encode()
    journaled = cfg.journal
    found = lease_plain(raw, key_hex.encode(), rcpt_bytes, deadline, until, journaled)
    if found is None:
        return None
    return key, key_hex, rcpt, rcpt_bytes, deadline, until, journaled, found


def write_lease(
    keys: QueueKeys,
    tr: Transaction,
    prepared: Prepared,
    counters: tuple[bytes, bytes],
    counts: tuple[bytes, bytes],
) -> Message:
    """The lease :func:`prepare_lease` made, written as the long way writes it (``lease_heads``,
    ``put_leased_batch``, ``count_known``: ``moves.put_leased_one``, the ready and in-flight
    ``counters`` set to ``counts``), its journal entry on a journaled queue, the lease held for
    this process's ack, nack and extend (``delivery.hold``); the Message handed out."""
    key, key_hex, rcpt, rcpt_bytes, deadline, until, journaled, found = prepared
    msg_id, enqueued_us, content_type, deliveries, payload, leased_raw = found
    ikey, lkey, id_key = keys.lease_keys(deadline, msg_id, key)  # (no id entry at home)
    at = ikey, lkey
    put_leased_one(tr, key, id_key, at, leased_raw, rcpt_bytes, counters, counts)
    extra: dict[str, Any] = {"key": key_hex, "receipt": rcpt, "deadline": deadline, "until": until}
    if journaled:  # (lease_heads' mark: the ack, nack, release and extend journal by it)
        extra[JOURNALED] = 1
        journaling.record_short(tr, keys, "lease", msg_id, deliveries + 1)  # put_leased's entry
    leased = _RECORD(Record, (msg_id, enqueued_us, content_type, {}, deliveries + 1, None, 0, extra, payload))
    hold(rcpt, (leased_raw, leased, keys, at))  # for the ack, nack, extend (as lease_heads')
    return Message.from_record(
        leased,
        keys.name,
        keys.priority_of(key),
        key,
        payload,
        receipt=rcpt,
        lease_deadline=until / 1e6,
        expires_at=None,
    )


__all__ = ["Prepared", "lease_counts", "prepare_lease", "write_lease"]
