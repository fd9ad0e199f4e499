"""A time limit per handler call: a hung lease-mode handler with heartbeats on kept its message
forever. Past ``time_limit`` the lease is renewed no more, the message is released as a failed
delivery (the error queue at max_deliveries, reason ``time_limit``), the call's thread is
abandoned (its late result settles nothing: its receipt is stale) and the worker goes on."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Message, Queue, Worker, aio
from fdbqueue.errors import LeaseError, QueueError
from tests.support import ROOT


@pytest.fixture
def db(tmp_path: Path) -> Any:
    d = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    yield d
    d.close()


def handler_threads() -> int:
    return sum(t.name == "fdbqueue-handler" for t in threading.enumerate())


def test_a_hung_lease_handler_is_given_up_and_its_message_dead_lettered(db: Any) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=2, retry_delay=0, lease_seconds=0.6)
    q = Queue("jobs")
    hung = q.enqueue(db, "hang")
    quick = q.enqueue_many(db, [f"q{i}" for i in range(5)])
    release = threading.Event()
    done: list[str] = []
    late: list[object] = []

    def handler(m: Message) -> None:
        if m.text() == "hang":
            release.wait(30)  # hung, with the heartbeat renewing its 0.6 s lease
            try:  # its late result: the receipt it holds is stale
                q.ack(db, m)
                late.append("acked")
            except LeaseError as exc:
                late.append(exc)
            return
        done.append(m.id)

    w = Worker(db, "jobs", handler, concurrency=2, time_limit=0.4, idle_timeout=0.05, sweep_interval=0.1)
    begun = time.monotonic()
    stats = w.run(until_empty=True)
    took = time.monotonic() - begun
    try:
        assert sorted(done) == sorted(quick)  # the slot went on with the other messages
        assert (stats.processed, stats.failed, stats.timed_out) == (5, 2, 2)
        assert "2 timed out" in str(stats)
        assert took < 10
        dead = list(Queue("jobs.error").browse(db))
        assert [m.id for m in dead] == [hung]
        assert dead[0].reason == "time_limit: the handler ran past 0.4 s"
        assert dead[0].extra["deliveries"] == 2
    finally:
        release.set()
    deadline = time.monotonic() + 5
    while len(late) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    assert len(late) == 2 and all(isinstance(x, LeaseError) for x in late), late
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.ready, st.inflight, st.delayed) == (0, 0, 0) and Queue("jobs.error").size(db) == 1


def test_abandoned_threads_are_bounded_and_the_worker_waits_for_room(db: Any) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    q = Queue("jobs")
    q.enqueue_many(db, [f"h{i}" for i in range(4)])
    release = threading.Event()
    calls: list[str] = []

    def handler(m: Message) -> None:
        calls.append(m.text())
        release.wait(30)

    w = Worker(db, "jobs", handler, time_limit=0.2, idle_timeout=0.05)
    t = threading.Thread(target=w.run, kwargs={"until_empty": True})
    t.start()
    try:
        time.sleep(1.5)
        assert len(calls) == 2 and handler_threads() == 2  # 2 x concurrency, then it waits
        assert w.stats.timed_out == 2
    finally:
        release.set()
    t.join(15)
    assert not t.is_alive() and len(calls) == 4
    assert (w.stats.timed_out, w.stats.processed) == (2, 2)  # released: the last two returned in time
    deadline = time.monotonic() + 5
    while handler_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert handler_threads() == 0  # the abandoned calls ended, and run() ended its own threads


def test_an_exactly_once_call_that_returns_late_is_aborted_and_counted(db: Any) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    mid = Queue("jobs").enqueue(db, "slow")

    def handler(tr: Any, m: Message) -> None:
        tr[b"done/" + m.payload] = b"1"
        time.sleep(0.3)

    stats = Worker(db, "jobs", handler, mode="exactly-once", time_limit=0.1).run(until_empty=True)
    assert (stats.processed, stats.failed, stats.timed_out) == (0, 1, 1)
    assert db.get(b"done/slow") is None  # its writes aborted
    (dead,) = Queue("jobs.error").browse(db)
    assert dead.id == mid and dead.reason == "time_limit: the handler ran past 0.1 s"


def test_an_async_handler_past_its_time_limit_is_cancelled(db: Any) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    q = Queue("jobs")
    hung = q.enqueue(db, "hang")
    q.enqueue_many(db, ["a", "b"])
    cancelled: list[str] = []

    async def handler(m: Message) -> None:
        if m.text() == "hang":
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                cancelled.append(m.id)
                raise

    w = aio.AsyncWorker(db, "jobs", handler, time_limit=0.2, idle_timeout=0.05)
    stats = asyncio.run(asyncio.wait_for(w.run(until_empty=True), 20))
    assert cancelled == [hung]
    assert (stats.processed, stats.failed, stats.timed_out) == (2, 1, 1)
    (dead,) = Queue("jobs.error").browse(db)
    assert dead.id == hung and dead.reason == "time_limit: the handler ran past 0.2 s"


def test_a_time_limit_must_be_positive(db: Any) -> None:
    for bad in (0, -1, "5", float("nan")):
        with pytest.raises(QueueError, match="time_limit"):
            Worker(db, "jobs", lambda m: None, time_limit=bad)
        with pytest.raises(QueueError, match="time_limit"):

            async def h(m: Message) -> None: ...

            aio.AsyncWorker(db, "jobs", h, time_limit=bad)


def test_cli_worker_time_limit(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'c.db'}?sync=normal"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    mid = Queue("jobs").enqueue(db, "slow")
    log = tmp_path / "handled.log"
    env = {**os.environ, "CLI_HANDLER_LOG": str(log), "CLI_HANDLER_SLEEP": "20", "PYTHONPATH": str(ROOT)}
    argv = ["worker", "jobs", "--handler", "tests.support.cli_handlers:record", "--time-limit", "0.3"]
    r = subprocess.run(
        [sys.executable, "-m", "fdbqueue", "--url", url, *argv, "--until-empty"],
        capture_output=True,
        env=env,
        timeout=15,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr.decode()
    assert b"ran past its time limit of 0.3 s" in r.stderr and b"1 timed out" in r.stdout
    assert not log.exists()  # the abandoned call never finished
    (dead,) = Queue("jobs.error").browse(db)
    assert dead.id == mid and dead.reason == "time_limit: the handler ran past 0.3 s"
    db.close()


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_worker_stalled_by_abandoned_threads_holds_no_message(
    db: Any, concurrency: int, caplog: pytest.LogCaptureFixture
) -> None:
    """Every call of the stuck worker's handler sleeps far past its limit: once abandoned
    threads fill its places it leases nothing (no message kept leased, and renewed, for a
    slot that cannot run it), another worker takes the rest, and ``until_empty`` sees the
    queue empty and returns, though the abandoned threads still run."""
    fdbqueue.create_queue(db, "jobs", max_deliveries=1, lease_seconds=2)
    q = Queue("jobs")
    hung = 2 * concurrency  # the places for abandoned threads
    q.enqueue_many(db, [f"m{i}" for i in range(hung + 3)])
    release = threading.Event()
    stuck_calls: list[str] = []

    def stuck(m: Message) -> None:
        stuck_calls.append(m.id)
        release.wait(60)  # far past the limit

    w1 = Worker(db, "jobs", stuck, concurrency=concurrency, time_limit=0.2, idle_timeout=0.05)
    t1 = threading.Thread(target=w1.run, kwargs={"until_empty": True}, daemon=True)
    try:
        t1.start()
        deadline = time.monotonic() + 10
        while w1.stats.timed_out < hung and time.monotonic() < deadline:
            time.sleep(0.02)
        assert w1.stats.timed_out == hung
        time.sleep(0.5)  # stalled: it may not lease meanwhile
        st = fdbqueue.queue_stats(db, "jobs")
        assert (st.ready, st.inflight) == (3, 0), st  # it holds nothing
        assert len(stuck_calls) == hung
        assert "ignores its time limit" in caplog.text

        done: list[str] = []
        w2 = Worker(db, "jobs", lambda m: done.append(m.id), idle_timeout=0.05)
        t2 = threading.Thread(target=w2.run, kwargs={"until_empty": True}, daemon=True)
        t2.start()
        t2.join(10)
        assert not t2.is_alive() and len(done) == 3  # the other worker took them at once
        t1.join(10)
        assert not t1.is_alive()  # the queue is empty: the stuck worker's until_empty returns
        assert len(stuck_calls) == hung and w1.stats.processed == 0
        assert Queue("jobs.error").size(db) == hung
    finally:
        w1.stop()
        release.set()
        t1.join(10)
