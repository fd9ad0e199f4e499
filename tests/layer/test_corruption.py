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
from fdbqueue.engines.contract import Database
from fdbqueue.errors import CorruptMessageError, QueueError
from fdbqueue.store.record import Record, join_chunks, seal_chunk

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


# -- a damaged message is moved aside and the queue keeps flowing --------------------------


def three_with_a_damaged_head(db: Database, q: Queue) -> tuple[list[str], bytes]:
    """Three messages; the head's record damaged (one bit). The ids and the damaged bytes."""
    ids = [q.enqueue(db, f"m{i}-payload") for i in range(3)]
    key = q.keys.home_key(ids[0])
    assert key is not None
    damage(db, key, 8 * 12 + 3)
    damaged = read_raw(db, key)
    assert damaged is not None
    return ids, damaged


def assert_moved_aside(db: Database, q: Queue, mid: str, damaged: bytes) -> None:
    """The damaged message is in the error queue by its id, its stored bytes kept as they were."""
    eq = Queue(f"{q.name}.error")
    m = eq.get(db, mid)
    assert m is not None, "the damaged message is recoverable from the error queue"
    assert m.reason == "corrupt" and m.origin == q.name
    assert m.payload == damaged  # nothing thrown away: the record's bytes, unchanged
    assert bytes.fromhex(str(m.extra["key"])) == q.keys.home_key(mid)
    assert "checksum" in str(m.extra["detail"])
    assert fdbqueue.queue_stats(db, q.name).corrupt == 1


@pytest.mark.parametrize("engine", LOCAL, indirect=True)
@pytest.mark.parametrize("how", ["dequeue", "lease", "lease_many", "staged", "filtered"])
def test_a_damaged_head_is_moved_aside_and_the_rest_delivered(
    db: Database, how: str, caplog: pytest.LogCaptureFixture
) -> None:
    from fdbqueue.ops.contention import staged_dequeue

    q = Queue("jobs")
    ids, damaged = three_with_a_damaged_head(db, q)
    take = {
        "dequeue": lambda: [q.dequeue(db)],
        "lease": lambda: [q.lease(db, 30)],
        "lease_many": lambda: q.lease_many(db, 5, 30),
        "staged": lambda: [staged_dequeue(db, q.keys)],
        "filtered": lambda: [q.dequeue(db, where={"x": "no such"}, fallback=True)],
    }[how]
    got: list[Any] = []
    with caplog.at_level("ERROR", logger="fdbqueue"):
        while len(got) < 2:
            batch = [m for m in take() if m is not None]
            assert batch, f"delivered {len(got)} of the 2 sound messages, then nothing"
            got += batch
    assert [m.id for m in got] == ids[1:]
    assert [m.payload for m in got] == [b"m1-payload", b"m2-payload"]
    assert sum(ids[0] in r.getMessage() for r in caplog.records) == 1, "the move is logged once, naming it"
    assert_moved_aside(db, q, ids[0], damaged)
    assert q.size(db) == 0


@pytest.mark.parametrize("engine", LOCAL, indirect=True)
def test_damaged_leased_and_delayed_records_are_moved_aside_by_the_sweep(db: Database) -> None:
    from fdbqueue.store.clock import fake_clock

    q = Queue("jobs")
    with fake_clock() as clock:
        leased_id = q.enqueue(db, b"leased")
        m = q.lease(db, 1)
        assert m is not None and m.id == leased_id
        delayed_id = q.enqueue(db, b"delayed", delay=1)
        sound_id = q.enqueue(db, b"sound", delay=1)
        damage(db, q.keys.inflight_key(leased_id), 8 * 12 + 3)
        dkey = next(k for k in all_keys(db, q, "d") if delayed_id.encode() in k)
        damage(db, dkey, 8 * 12 + 3)
        clock.advance(5)
        q.sweep(db)
    eq = Queue("jobs.error")
    for mid in (leased_id, delayed_id):
        moved = eq.get(db, mid)
        assert moved is not None and moved.reason == "corrupt", mid
    stats = fdbqueue.queue_stats(db, "jobs")
    assert (stats.inflight, stats.delayed, stats.ready, stats.corrupt) == (0, 0, 1, 2)
    assert all_keys(db, q, "l") == []  # the damaged lease's entry went with it
    m = q.dequeue(db)
    assert m is not None and m.id == sound_id and m.payload == b"sound"


@fdbqueue.transactional
def _range(tr: Any, begin: bytes, end: bytes) -> list[bytes]:
    return [kv.key for kv in tr.get_range(begin, end)]


def all_keys(db: Database, q: Queue, tag: str) -> list[bytes]:
    return _range(db, *q.keys.index_range(tag))  # type: ignore[no-any-return]


@pytest.mark.parametrize("engine", LOCAL, indirect=True)
@pytest.mark.parametrize("how", ["dequeue", "lease_many", "staged"])
def test_a_head_with_a_damaged_chunk_is_moved_aside_and_the_rest_delivered(db: Database, how: str) -> None:
    from fdbqueue.ops.contention import staged_dequeue

    q = Queue("jobs")
    big = bytes(range(256)) * 100  # 25,600 bytes: three chunks
    ids = [q.enqueue(db, big), q.enqueue(db, b"small"), q.enqueue(db, big[::-1])]
    damage(db, q.keys.chunk_key(ids[0], 1), 100)
    take = {
        "dequeue": lambda: [q.dequeue(db)],
        "lease_many": lambda: q.lease_many(db, 5, 30),
        "staged": lambda: [staged_dequeue(db, q.keys)],
    }[how]
    got: list[Any] = []
    for _ in range(4):
        got += [m for m in take() if m is not None]
    assert [m.id for m in got] == ids[1:]
    assert [m.payload for m in got] == [b"small", big[::-1]]
    moved = Queue("jobs.error").get(db, ids[0])
    assert moved is not None and moved.reason == "corrupt" and "chunk 1" in str(moved.extra["detail"])
    assert Record.decode(moved.payload).chunks == 3  # the record, sound, as it was stored
    assert fdbqueue.queue_stats(db, "jobs").corrupt == 1


def test_a_bit_flipped_in_the_store_file_is_moved_aside_and_the_rest_delivered(tmp_path: Any) -> None:
    store = tmp_path / "store.db"
    url = f"sqlite://{store}"
    q = Queue("jobs")
    db = fdbqueue.open(url)
    try:
        ids = [q.enqueue(db, p) for p in (b"first", b"needle-payload-0123456789", b"third")]
    finally:
        db.close()
    flip_in_file(store, b"needle-payload-0123456789", 3)
    db = fdbqueue.open(url)
    try:
        got = [q.dequeue(db) for _ in range(3)]
        assert [m.payload for m in got if m is not None] == [b"first", b"third"]
        moved = Queue("jobs.error").get(db, ids[1])
        assert moved is not None and moved.reason == "corrupt" and moved.origin == "jobs"
        assert b"nee" + bytes([ord("d") ^ 0x10]) + b"le-payload" in moved.payload  # its damaged bytes, kept
        with pytest.raises(CorruptMessageError):
            Record.decode(moved.payload)
        assert fdbqueue.queue_stats(db, "jobs").corrupt == 1
    finally:
        db.close()


@pytest.mark.parametrize("engine", LOCAL, indirect=True)
def test_browse_and_stats_name_a_damaged_message_not_json_errors(db: Database) -> None:
    q = Queue("jobs")
    ids, _ = three_with_a_damaged_head(db, q)
    with pytest.raises(CorruptMessageError, match=ids[0]) as info:
        list(q.browse(db))
    assert info.value.queue == "jobs" and info.value.key == q.keys.home_key(ids[0])
    stats = fdbqueue.queue_stats(db, "jobs")  # its age cannot be trusted: skipped, no error
    assert stats.ready == 3 and stats.corrupt == 0
    assert q.wait(db, timeout=0)  # deliverable: the dequeue that comes moves it aside
    assert q.dequeue(db).id == ids[1]  # type: ignore[union-attr]
    assert [m.id for m in q.browse(db)] == ids[2:]
    assert fdbqueue.queue_stats(db, "jobs").corrupt == 1
