"""The exclusive forwarder's reads (``runtime/outbox.py``): a batch of ready messages at the
source's head, read without writing anything (no leases: the forwarder is the queue's only
consumer)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import CorruptMessageError
from fdbqueue.ops.delivery import to_message
from fdbqueue.store.budget import BATCH_PAYLOAD_BYTES, CHUNK_BYTES
from fdbqueue.store.clock import db_now
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record, decode_record
from fdbqueue.types import Message, headers_match


class Ready(NamedTuple):
    """A ready message an exclusive forwarder read: where, its bytes, decoded, as a Message."""

    key: bytes
    raw: bytes
    rec: Record
    message: Message


def peek(t: Transaction, keys: QueueKeys, n: int, where: Mapping[str, Any] | None) -> list[Ready]:
    """Up to ``n`` ready messages from the head (snapshot reads, nothing written); the
    expired and damaged ones are left to the sweep and to consumers' dequeues."""
    now = db_now(t)
    out: list[Ready] = []
    begin, end = keys.ready_range()
    size = 0  # payload bytes: large messages go one per batch (budget.BATCH_PAYLOAD_BYTES)
    while len(out) < n and size < BATCH_PAYLOAD_BYTES:
        want = n - len(out) + 8
        kvs = t.snapshot.get_range(begin, end, want)
        for key, raw in kvs:
            try:
                rec = decode_record(raw, keys, key)
            except CorruptMessageError:
                continue
            if rec.expires_us is not None and rec.expires_us <= now:
                continue
            if where is not None and not headers_match(rec.headers, where):
                continue
            if out and size + rec.chunks * CHUNK_BYTES > BATCH_PAYLOAD_BYTES:
                size = BATCH_PAYLOAD_BYTES
                break
            size += rec.chunks * CHUNK_BYTES
            out.append(Ready(key, raw, rec, to_message(t, keys, key, rec)))
            if len(out) == n:
                break
        if len(kvs) < want or size >= BATCH_PAYLOAD_BYTES or (where is None and len(out) == n):
            break
        begin = kvs[-1].key + b"\x00"
    return out
