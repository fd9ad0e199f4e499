"""The exclusive forwarder's reads (``runtime/outbox.py``): a batch of ready messages at the
source's head, read without writing anything (no leases: the forwarder is the queue's only
consumer)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from fdbqueue.engines.contract import Transaction
from fdbqueue.ops.reading import to_message
from fdbqueue.ops.scan import SKIP, ReadyScan
from fdbqueue.store.clock import db_now
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import Record
from fdbqueue.types import Message


class Ready(NamedTuple):
    """A ready message an exclusive forwarder read: where, its bytes, decoded, as a Message."""

    key: bytes
    raw: bytes
    rec: Record
    message: Message


def peek(t: Transaction, keys: QueueKeys, n: int, where: Mapping[str, Any] | None) -> list[Ready]:
    """Up to ``n`` ready messages from the head (snapshot reads, nothing written); the
    expired and damaged ones are left to the sweep and to consumers' dequeues (SKIP), and
    large messages go one per batch (``ReadyScan.claim``: budget.BATCH_PAYLOAD_BYTES)."""
    out: list[Ready] = []
    scan = ReadyScan(t, keys, db_now(t), where=where, sizes=(8,), need=n, damaged=SKIP, expired=SKIP)
    for key, raw, rec in scan:
        if not scan.claim(rec):
            break
        out.append(Ready(key, raw, rec, to_message(t, keys, key, rec)))
        if len(out) == n:
            break
    return out
