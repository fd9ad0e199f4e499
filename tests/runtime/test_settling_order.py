"""A lease-mode Worker's plain lease (no work set: nothing to retire, no claim) leases before
it writes the batched acks it carries (ops/settling.py ``lease_settling``): the lease's range
read then meets no write of its own transaction, so the embedded engine keeps no sorted index
of the transaction's writes (issue 30's ninth pass, docs/performance.md). A work set's lease
still acks first (its retire must see the acks gone). And the order changes no outcome: an
ack whose lease expired is lost either way, and its message is leased again, once."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Message, Queue
from fdbqueue.ops import settling
from fdbqueue.ops.settling import Settler, lease_settling


def _open(where: str, tmp_path: Path) -> fdbqueue.Database:
    if where == "sim":
        return fdbqueue.open("sim://?seed=5&faults=0")
    return fdbqueue.open(f"sqlite:///{tmp_path}/q.db")


def test_a_workers_plain_lease_leases_before_it_writes_its_acks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = _open("sqlite", tmp_path)
    Queue("jobs").enqueue_many(db, [b"m%d" % i for i in range(20)])
    inner = settling.lease_batch
    wrote_before: list[bool] = []

    def lease_batch(keys: Any, t: Any, *args: Any, **kwargs: Any) -> Any:
        wrote_before.append(bool(t._has_writes))  # the embedded engine's: a write made in t
        return inner(keys, t, *args, **kwargs)

    monkeypatch.setattr(settling, "lease_batch", lease_batch)
    seen: list[bytes] = []
    worker = fdbqueue.Worker(
        db, "jobs", lambda m: seen.append(m.payload), mode="lease", prefetch=(5, 5), settle_linger=3600.0
    )
    stats = worker.run(max_messages=20)
    assert stats.processed == 20 and not stats.released, stats
    assert sorted(seen) == sorted(b"m%d" % i for i in range(20))
    assert fdbqueue.queue_stats(db, "jobs").inflight == 0  # every ack committed
    # The leases that carried a batch's acks (the first carried none): none after a write.
    assert len(wrote_before) >= 3, wrote_before
    assert not any(wrote_before), wrote_before


@pytest.mark.parametrize("where", ["sim", "sqlite"])
def test_an_expired_ack_carried_by_a_lease_is_lost_and_its_message_leased_once(
    tmp_path: Path, where: str
) -> None:
    db = _open(where, tmp_path)
    q = Queue("jobs")
    ids = q.enqueue_many(db, [b"a", b"b"])
    first = q.lease_many(db, 1, 0.2)
    assert [m.id for m in first] == ids[:1]
    lost: list[Message] = []
    acked: list[int] = []

    def done(_q: Queue, n: int, gone: list[Message]) -> None:
        acked.append(n)
        lost.extend(gone)

    settler: Settler[Queue] = Settler(db, 3600.0, 256, done)
    try:
        time.sleep(0.3)  # past the lease of the message whose ack waits
        settler.add(q, first[0])
        got = lease_settling(db, settler, q, 5, 60.0)
    finally:
        settler.close()
    # The expired one went back and is leased again (once, under a new lease) with the other;
    # its ack found its lease gone: reported lost, nothing acked.
    assert sorted(m.id for m in got) == sorted(ids)
    assert [m.id for m in lost] == ids[:1] and sum(acked) == 0
    stats = fdbqueue.queue_stats(db, "jobs")
    assert (stats.ready, stats.inflight) == (0, 2)
    for m in got:
        q.ack(db, m)
    assert fdbqueue.queue_stats(db, "jobs").inflight == 0
