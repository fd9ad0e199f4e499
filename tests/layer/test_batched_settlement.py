"""``ack_many`` and ``nack_many`` on every engine: one transaction for many leased messages,
the receipt checks of ``ack``, composing in a caller's transaction; a lease-mode Worker acks
in batches (one commit for many handlers) and a crash before the batch commits delivers the
messages again, never loses them."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Database, LeaseError, Queue, QueueError, Worker
from fdbqueue.ops.settling import Settler
from fdbqueue.store.clock import FakeClock
from tests.support.processes import real_clock

from . import test_delivery

clock = test_delivery.clock  # the fixture: a test clock that moves database time


def test_ack_many_and_nack_many(db: Database, clock: FakeClock) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=2, lease_seconds=30)
    q = Queue("jobs")
    ids = q.enqueue_many(db, [f"m{i}" for i in range(6)])
    ms = q.lease_many(db, 6)
    assert [m.id for m in ms] == ids
    assert [m.id for m in q.ack_many(db, ms[:3])] == ids[:3]
    assert q.ack_many(db, ms[:3]) == []  # acked already: left out, not raised
    with pytest.raises(LeaseError):
        q.ack(db, ms[0])
    assert q.nack_many(db, ms[3:5], reason="later") == ["ready", "ready"]
    clock.advance(31)  # ms[5]'s lease runs out
    assert q.nack_many(db, ms[5:]) == [None]
    st = fdbqueue.queue_stats(db, "jobs")
    # The one whose lease ended is no longer in flight (docs/api.md, "What every view counts"):
    # lease_ended until a sweep releases it.
    assert (st.done, st.ready, st.inflight, st.lease_ended) == (3, 2, 0, 1)
    q.sweep(db)
    again = q.lease_many(db, 3)
    assert sorted(m.id for m in again) == sorted(ids[3:])
    assert q.nack_many(db, again, reason="bad") == ["dead"] * 3  # max_deliveries=2
    assert fdbqueue.queue_stats(db, "jobs.error").ready == 3


def test_ack_many_composes_in_a_callers_transaction_and_refuses_bad_input(db: Database) -> None:
    q, other = Queue("jobs"), Queue("other")
    q.enqueue_many(db, [b"a", b"b"])
    other.enqueue(db, b"c")
    ms = q.lease_many(db, 2)

    @fdbqueue.transactional
    def undone(tr: fdbqueue.Transaction) -> None:
        assert len(q.ack_many(tr, ms)) == 2
        raise RuntimeError("the caller aborts")

    with pytest.raises(RuntimeError):
        undone(db)
    assert fdbqueue.queue_stats(db, "jobs").inflight == 2
    plain = q.peek(db)
    assert plain is None
    (c,) = other.lease_many(db, 1)
    with pytest.raises(QueueError, match="of queue 'other'"):
        q.ack_many(db, [ms[0], c])
    with pytest.raises(LeaseError, match="returned by lease"):
        q.ack_many(db, [ms[0], "x"])  # type: ignore[list-item]
    assert fdbqueue.queue_stats(db, "jobs").inflight == 2  # nothing acked by the refused calls
    assert len(q.ack_many(db, ms)) == 2


@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_worker_acks_a_batch_in_one_transaction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, concurrency: int
) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    n = 2000
    for _ in range(4):
        Queue("jobs").enqueue_many(db, [b"x"] * (n // 4))
    settles: list[int] = []
    real = Settler.settle

    def counting(self: Settler, t: Any, got: list[Any]) -> list[Any]:
        settles.append(len(got))
        return real(self, t, got)

    monkeypatch.setattr(Settler, "settle", counting)
    stats = Worker(db, "jobs", lambda m: None, concurrency=concurrency).run(until_empty=True)
    st = fdbqueue.queue_stats(db, "jobs")
    assert stats.processed == n == st.done and st.inflight == 0 and stats.ack_lost == 0
    assert sum(settles) == n
    assert len(settles) <= n / 10, f"{len(settles)} ack transactions for {n} messages"
    # settle_linger=0: an ack each, as before batching.
    Queue("jobs").enqueue_many(db, [b"x"] * 20)
    settles.clear()
    stats = Worker(db, "jobs", lambda m: None, settle_linger=0).run(until_empty=True)
    assert stats.processed == 20 and settles == [] and fdbqueue.queue_stats(db, "jobs").done == n + 20
    db.close()


def test_max_messages_counts_the_messages_whose_acks_are_batched(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    Queue("jobs").enqueue_many(db, [b"x"] * 50)
    seen: list[str] = []
    stats = Worker(db, "jobs", lambda m: seen.append(m.id), settle_linger=10.0).run(max_messages=7)
    assert len(seen) == 7 and stats.processed == 7
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.done, st.inflight, st.ready) == (7, 0, 43)  # the unstarted ones went back
    db.close()


_CRASHING = """
import os, signal, sys
import fdbqueue
db = fdbqueue.open(sys.argv[1])
def handle(m):
    with open(sys.argv[2], "a") as f:
        f.write(m.text() + "\\n")
    if m.text() == "m7":
        os.kill(os.getpid(), signal.SIGKILL)  # between handlers and their batched acks
fdbqueue.Worker(db, "jobs", handle, settle_linger=60.0, prefetch=(4, 4)).run()
"""


@pytest.mark.slow
@pytest.mark.usefixtures(real_clock.__name__)
def test_a_crash_before_the_batch_commits_delivers_again_and_loses_nothing(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "jobs", lease_seconds=1.0)
    Queue("jobs").enqueue_many(db, [f"m{i}" for i in range(20)])
    log = tmp_path / "handled.txt"
    proc = subprocess.run([sys.executable, "-c", _CRASHING, url, str(log)], timeout=120)
    assert proc.returncode == -signal.SIGKILL
    first = log.read_text().split()
    assert first[-1] == "m7"
    st = fdbqueue.queue_stats(db, "jobs")
    assert st.done < 8 and st.inflight > 0  # handled, not acked: still leased
    time.sleep(1.2)  # the leases run out
    again: list[str] = []
    Worker(db, "jobs", lambda m: again.append(m.text())).run(until_empty=True)
    assert sorted(set(first) | set(again)) == sorted(f"m{i}" for i in range(20))  # none lost
    assert "m7" in again and set(first) & set(again)  # the unacked ones: delivered again
    assert fdbqueue.queue_stats(db, "jobs").done == 20
    db.close()
