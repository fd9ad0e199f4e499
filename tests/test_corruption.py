"""Damaged records and payload chunks are detected on read (CRC-32) and reported by name.

The damage is written directly (``tr.set`` of a record with one bit flipped) on every engine,
and on the embedded engine also into the store file itself.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.base import Database
from fdbqueue.errors import CorruptMessageError, QueueError
from fdbqueue.message import Record, join_chunks, seal_chunk

LOCAL = ["memory", "sim", "sqlite"]


def flip(raw: bytes, bit: int) -> bytes:
    b = bytearray(raw)
    b[bit // 8] ^= 1 << (bit % 8)
    return bytes(b)


@fdbqueue.transactional
def read_raw(tr: Any, key: bytes) -> bytes | None:
    return tr.get(key)  # type: ignore[no-any-return]


@fdbqueue.transactional
def write_raw(tr: Any, key: bytes, value: bytes) -> None:
    tr.set(key, value)


def damage(db: Database, key: bytes, bit: int) -> bytes:
    """Flip one bit of the value at ``key``; the value before."""
    raw = read_raw(db, key)
    assert raw is not None
    write_raw(db, key, flip(raw, bit))
    return raw


def test_every_flipped_bit_of_a_record_is_detected() -> None:
    recs = [
        Record("r0a1b2", 1_700_000_000_000_000, "b", {}, 0, None, 0, {}, b"payload bytes"),
        Record("custom-id", 5, "j", {"h": "v"}, 3, 99, 0, {"reason": "x"}, b'{"a":1}'),
    ]
    for rec in recs:
        raw = rec.encode()
        assert Record.decode(raw) == rec
        for bit in range(len(raw) * 8):
            with pytest.raises(CorruptMessageError):
                Record.decode(flip(raw, bit))
        for cut in range(len(raw)):
            with pytest.raises(CorruptMessageError):
                Record.decode(raw[:cut])


def test_corrupt_message_error_is_a_queue_error_naming_where() -> None:
    exc = CorruptMessageError("record checksum mismatch", queue="jobs", key=b"k", msg_id="r01")
    assert isinstance(exc, QueueError)
    assert "jobs" in str(exc) and "r01" in str(exc) and "checksum" in str(exc)


def test_every_flipped_bit_of_a_chunk_is_detected() -> None:
    parts = [b"a" * 40, b"bc" * 7]
    sealed = [seal_chunk(p) for p in parts]
    assert join_chunks(sealed, 2, "q", "m1") == b"".join(parts)
    for bit in range(len(sealed[1]) * 8):
        with pytest.raises(CorruptMessageError, match="m1"):
            join_chunks([sealed[0], flip(sealed[1], bit)], 2, "q", "m1")
    with pytest.raises(CorruptMessageError, match=r"missing|chunks"):
        join_chunks(sealed[:1], 2, "q", "m1")


@pytest.mark.parametrize("engine", LOCAL, indirect=True)
def test_a_damaged_record_is_reported_by_peek_and_get_not_json_errors(db: Database) -> None:
    q = Queue("jobs")
    mid = q.enqueue(db, b"hello corrupt world")
    key = q.keys.home_key(mid)
    assert key is not None
    raw = damage(db, key, 8 * 12 + 3)  # inside the JSON fields: json.loads used to fail
    for read in (lambda: q.peek(db), lambda: q.get(db, mid)):
        with pytest.raises(CorruptMessageError) as info:
            read()
        assert info.value.queue == "jobs" and info.value.msg_id == mid and mid in str(info.value)
        assert not isinstance(info.value, json.JSONDecodeError)
    write_raw(db, key, raw)  # repaired: readable again
    assert q.get(db, mid).payload == b"hello corrupt world"  # type: ignore[union-attr]


@pytest.mark.parametrize("engine", LOCAL, indirect=True)
def test_a_flipped_payload_bit_is_not_delivered_as_a_wrong_payload(db: Database) -> None:
    q = Queue("jobs")
    mid = q.enqueue(db, b"x" * 300)
    key = q.keys.home_key(mid)
    assert key is not None
    damage(db, key, (len(read_raw(db, key) or b"") - 20) * 8)  # in the payload
    with pytest.raises(CorruptMessageError, match=mid):
        q.get(db, mid)


@pytest.mark.parametrize("engine", LOCAL, indirect=True)
def test_a_damaged_chunk_is_reported_naming_the_message(db: Database) -> None:
    q = Queue("jobs")
    big = bytes(range(256)) * 200  # 51,200 bytes: six chunks
    mid = q.enqueue(db, big)
    assert q.get(db, mid).payload == big  # type: ignore[union-attr]
    damage(db, q.keys.chunk_key(mid, 3), 5000 * 8 + 1)
    with pytest.raises(CorruptMessageError, match=mid):
        q.get(db, mid)
    with pytest.raises(CorruptMessageError, match=mid):
        q.peek(db)


def flip_in_file(path: Any, needle: bytes, offset: int) -> None:
    """Flip one bit ``offset`` bytes past the only place ``needle`` occurs in the file."""
    data = bytearray(path.read_bytes())
    at = data.find(needle)
    assert at >= 0 and data.find(needle, at + 1) < 0, "the payload is in the file once"
    data[at + offset] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_bit_flipped_in_the_store_file_is_reported_not_delivered(tmp_path: Any) -> None:
    """SQLite keeps no page checksums: a flipped bit in a record's bytes reads back as
    valid data. The record's own checksum catches it."""
    store = tmp_path / "store.db"
    url = f"sqlite://{store}"
    q = Queue("jobs")
    db = fdbqueue.open(url)
    try:
        mid = q.enqueue(db, b"needle-payload-0123456789")
    finally:
        db.close()  # checkpointed into the store file
    flip_in_file(store, b"needle-payload-0123456789", 7)
    db = fdbqueue.open(url)
    try:
        with pytest.raises(CorruptMessageError, match=mid):
            q.get(db, mid)
    finally:
        db.close()
