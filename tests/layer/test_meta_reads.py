"""What the dequeue and the lease read of a queue's metadata (``config.read_meta_for``) and
how its counters are asked (``Meta.count``, ``Meta.waiting``): the same answers as the full
read (``read_meta``) and as decoding every counter, whatever the counters hold, and settings
changed by another handle seen by the next read (issue 30, fifth pass)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.ops.head import LEASE_KEPT, TAKE_KEPT
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.meta import LEASE_COUNTERS, TAKE_COUNTERS, Meta, read_meta, read_meta_for

ALL = ("ready", "wake", "inflight", "delayed", "taken", "counted", "done")


@pytest.mark.parametrize("counters", [TAKE_COUNTERS, LEASE_COUNTERS, TAKE_KEPT, LEASE_KEPT, ("done",), ALL])
def test_read_meta_for_reads_what_read_meta_reads_in_its_order(
    db: Database, counters: tuple[str, ...]
) -> None:
    q = Queue("jobs")
    q.enqueue_many(db, [b"a", b"b", b"c", b"d"])
    q.enqueue(db, b"later", delay=60.0)
    q.lease(db)
    q.dequeue(db)

    def both(tr: Transaction) -> tuple[Meta, Meta, list[bytes | None]]:
        keys = q.keys
        done = tr.get(keys.counter("done"))
        return read_meta_for(tr, keys, counters), read_meta(tr, keys), [done]

    for _ in range(2):  # the plan made, then the plan kept
        part, full, (done,) = run_transaction(db, both)
        assert len(part.raw) == 9
        assert part.raw[0] == full.raw[0]  # the metadata version
        named = (("ready", 1), ("wake", 2), ("inflight", 4), ("delayed", 5), ("taken", 6), ("counted", 7))
        # Where transactions may conflict, neither reads the counted counter (only the
        # embedded engine's short enqueue writes it) nor the dequeue and the lease the wake one.
        cluster = part.cluster
        skipped = ("wake", "counted") if cluster and counters in (TAKE_COUNTERS, LEASE_COUNTERS) else ()
        assert not cluster or len(full.raw) == 7
        for name, at in named:
            read = name in counters and name not in skipped
            assert part.raw[at] == (full.raw[at] if read and at < len(full.raw) else None), name
            asked = read or (name == "ready" and name in counters)
            assert part.count(name) == (full.count(name) if asked else 0), name
        assert part.raw[3] is None and part.work is None and part.made_ready == 0
        assert part.raw[8] == (done if "done" in counters else None)
        assert part[:5] == full[:5]  # config, state, priorities, owner, acl
    assert full.count("ready") == 2 and full.count("inflight") == 1 and full.count("delayed") == 1


def test_read_meta_for_sees_settings_changed_by_another_handle(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    a, b = fdbqueue.open(url), fdbqueue.open(url)
    q = Queue("jobs")
    q.enqueue(a, b"x")
    for db in (a, b):
        meta = run_transaction(db, lambda tr: read_meta_for(tr, q.keys, TAKE_COUNTERS))
        assert meta.config is not None and meta.config.max_deliveries == 5
    fdbqueue.create_queue(b, "jobs", max_deliveries=9)
    meta = run_transaction(a, lambda tr: read_meta_for(tr, q.keys, TAKE_COUNTERS))
    assert meta.config is not None and meta.config.max_deliveries == 9
    fdbqueue.destroy_queue(b, "jobs")
    meta = run_transaction(a, lambda tr: read_meta_for(tr, q.keys, TAKE_COUNTERS))
    assert meta.config is None and meta.count("ready") == 0
    a.close()
    b.close()


VALUES = [
    None,
    bytes(8),
    struct.pack("<q", 3),
    struct.pack("<q", -2),
    struct.pack("<q", 2**63 - 1),
    b"\x05\x00\x00\x00",  # a counter stored shorter: zero-extended
    b"\x00" * 12,
    b"\x01" + b"\x00" * 11,  # longer: truncated to its first 8 bytes
    b"",
]


@pytest.mark.parametrize("inflight", VALUES)
@pytest.mark.parametrize("delayed", VALUES)
def test_count_and_waiting_answer_as_decoding_each_counter(
    inflight: bytes | None, delayed: bytes | None
) -> None:
    raw: list[bytes | None] = [b"v", inflight, None, None, inflight, delayed, None]
    meta = Meta(None, fdbqueue.QueueState(), frozenset(), None, {}, 0, None, False, raw)  # type: ignore[attr-defined]

    def decoded(value: bytes | None) -> int:
        return 0 if value is None else max(0, unpack_count(value))

    assert meta.count("inflight") == decoded(inflight)
    assert meta.count("delayed") == decoded(delayed)
    assert meta.count("ready") == decoded(inflight)
    assert meta.count("wake") == 0 and meta.count("nonesuch") == 0
    assert meta.waiting() == bool(decoded(inflight) or decoded(delayed))
    short = meta._replace(raw=raw[:4])  # an enqueue's read without them
    assert short.count("inflight") == 0 and not short.waiting()
