"""Workers and the push dispatcher: modes, fairness, priorities, prefetch, graceful stop."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Dispatcher, Message, Queue, Worker
from fdbqueue.engines.contract import Database


@pytest.fixture(params=["memory", "sqlite"])
def wdb(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = "memory://" if request.param == "memory" else f"sqlite://{tmp_path / 'w.db'}?sync=normal"
    db = fdbqueue.open(url)
    yield db
    db.close()


def fill(db: Database, name: str, n: int, **kw: Any) -> Queue:
    q = Queue(name)
    for start in range(0, n, 500):  # transactions within the budget (fdbqueue/store/budget.py)
        q.enqueue_many(db, [f"{name}-{i}" for i in range(start, min(n, start + 500))], **kw)
    return q


def test_exactly_once_worker_commits_the_handlers_writes(wdb: Database) -> None:
    q = fill(wdb, "jobs", 50)

    def handler(tr: Any, m: Message) -> None:
        tr[b"done/" + m.payload] = b"1"

    stats = Worker(wdb, q, handler, mode="exactly_once").run(until_empty=True)
    assert stats.processed == 50 and stats.failed == 0
    assert len(wdb.get_range_startswith(b"done/")) == 50  # type: ignore[attr-defined]
    assert q.empty(wdb)


def test_exactly_once_worker_dead_letters_a_poison_message(wdb: Database) -> None:
    fdbqueue.create_queue(wdb, "jobs", max_deliveries=2)
    q = fill(wdb, "jobs", 3)

    def handler(tr: Any, m: Message) -> None:
        if m.text() == "jobs-1":
            raise ValueError("poison")
        tr[b"done/" + m.payload] = b"1"

    stats = Worker(wdb, q, handler, mode="exactly_once").run(until_empty=True)
    assert stats.processed == 2 and stats.failed == 2
    dead = Queue("jobs.error").dequeue(wdb)
    assert dead is not None and dead.text() == "jobs-1" and dead.reason == "ValueError: poison"
    assert wdb.get(b"done/jobs-1") is None  # type: ignore[attr-defined]


def test_lease_worker_acks_and_nacks_with_the_exception(wdb: Database) -> None:
    fdbqueue.create_queue(wdb, "jobs", max_deliveries=1)
    q = fill(wdb, "jobs", 20)
    seen: list[str] = []
    lock = threading.Lock()

    def handler(m: Message) -> None:
        if m.text() == "jobs-7":
            raise KeyError("missing customer")
        with lock:
            seen.append(m.text())

    stats = Worker(wdb, q, handler, mode="lease", concurrency=3).run(until_empty=True)
    assert sorted(seen) == sorted(f"jobs-{i}" for i in range(20) if i != 7)
    assert stats.processed == 19 and stats.failed == 1
    dead = Queue("jobs.error").dequeue(wdb)
    assert dead is not None and dead.reason == "KeyError: 'missing customer'"
    assert fdbqueue.queue_stats(wdb, "jobs").inflight == 0


def test_multi_queue_worker_is_fair_between_queues(wdb: Database) -> None:
    a, b = fill(wdb, "a", 200), fill(wdb, "b", 200)
    stats = Worker(wdb, [a, b], lambda tr, m: None, mode="exactly_once").run(max_messages=100)
    assert abs(stats.per_queue["a"] - stats.per_queue["b"]) <= 2  # strict alternation


def test_stop_releases_prefetched_messages_without_counting_them(wdb: Database) -> None:
    q = fill(wdb, "jobs", 300)
    started = threading.Event()

    def slow(m: Message) -> None:
        started.set()
        time.sleep(0.01)

    w = Worker(wdb, q, slow, mode="lease", prefetch=(50, 50))
    t = threading.Thread(target=w.run)
    t.start()
    assert started.wait(5)
    time.sleep(0.1)
    w.stop()
    t.join(10)
    assert not t.is_alive()
    st = fdbqueue.queue_stats(wdb, "jobs")
    assert st.inflight == 0  # nothing left hidden in a dead worker's memory
    assert st.ready == 300 - w.stats.processed and w.stats.released > 0
    assert all(m.deliveries == 0 for m in q.browse(wdb))  # released ones were never delivered


def test_prefetch_budget_follows_measured_rates(wdb: Database) -> None:
    q = fill(wdb, "jobs", 600)
    w = Worker(wdb, q, lambda m: None, mode="lease", prefetch=(1, 128))
    assert w.budget.size == 1  # nothing measured yet: the lower bound
    stats = w.run(until_empty=True)
    assert stats.processed == 600
    assert 1 < stats.prefetch <= 128  # grew with the measured rates, within its bounds
    assert stats.egress_rate > 0 and stats.ingress_rate > 0


def test_idle_worker_wakes_promptly_on_an_enqueue(wdb: Database) -> None:
    q = Queue("jobs")
    fdbqueue.create_queue(wdb, "jobs")
    done = threading.Event()
    got: list[float] = []

    def handler(m: Message) -> None:
        got.append(time.monotonic())
        done.set()

    w = Worker(wdb, q, handler, mode="lease", idle_timeout=30.0)
    t = threading.Thread(target=w.run, kwargs={"max_messages": 1})
    t.start()
    time.sleep(0.3)  # the worker is waiting on its watch
    sent = time.monotonic()
    q.enqueue(wdb, "wake up")
    assert done.wait(5)
    t.join(5)
    assert got[0] - sent < 0.5  # woken by the watch, not by the 30 s timeout


# --- the dispatcher -----------------------------------------------------------------------------


def run_dispatcher(d: Dispatcher, **kw: Any) -> Any:
    return d.run(until_empty=True, **kw)


def test_dispatch_each_with_load_control(wdb: Database) -> None:
    q = fill(wdb, "jobs", 30)
    d = Dispatcher(wdb, q, schedule="each", max_concurrent=3)
    d.add_consumer(lambda m: time.sleep(0.02), capacity=10)
    stats = run_dispatcher(d)
    assert stats.acked == 30 and stats.max_running == 3


def test_dispatch_only_when_idle(wdb: Database) -> None:
    q = fill(wdb, "jobs", 10)
    d = Dispatcher(wdb, q, schedule="idle", max_concurrent=8)
    d.add_consumer(lambda m: time.sleep(0.01), capacity=8)
    stats = run_dispatcher(d)
    assert stats.acked == 10 and stats.max_running == 1


def test_dispatch_when_the_queue_reaches_a_length(wdb: Database) -> None:
    q = fill(wdb, "jobs", 4)
    handled: list[str] = []
    d = Dispatcher(wdb, q, schedule="length", length=5, idle_timeout=0.05)
    d.add_consumer(lambda m: handled.append(m.text()))
    t = threading.Thread(target=d.run)
    t.start()
    time.sleep(0.4)
    assert handled == []  # 4 < 5: no round yet
    q.enqueue(wdb, "jobs-4")
    deadline = time.monotonic() + 5
    while len(handled) < 5 and time.monotonic() < deadline:
        time.sleep(0.02)
    d.stop()
    t.join(5)
    assert sorted(handled) == [f"jobs-{i}" for i in range(5)] and d.stats.rounds == 1


def test_dispatch_at_intervals(wdb: Database) -> None:
    q = Queue("jobs")
    fdbqueue.create_queue(wdb, "jobs")
    times: list[float] = []
    d = Dispatcher(wdb, q, schedule="interval", interval=0.3)
    d.add_consumer(lambda m: times.append(time.monotonic()), capacity=4)
    t = threading.Thread(target=d.run)
    t.start()
    start = time.monotonic()
    q.enqueue_many(wdb, ["a", "b"])
    time.sleep(0.8)
    q.enqueue(wdb, "c")
    deadline = time.monotonic() + 5
    while len(times) < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    d.stop()
    t.join(5)
    assert len(times) == 3
    assert times[2] - start >= 0.8  # "c" waited for the next interval round
    assert d.stats.rounds >= 2


def test_consumer_priorities(wdb: Database) -> None:
    q = fill(wdb, "jobs", 40)
    d = Dispatcher(wdb, q, schedule="each", max_concurrent=1)
    d.add_consumer(lambda m: None, priority=10, name="high")
    d.add_consumer(lambda m: None, priority=1, name="low")
    stats = run_dispatcher(d)
    assert stats.per_consumer == {"high": 40, "low": 0}  # high always has capacity here

    q2 = fill(wdb, "more", 60)
    d2 = Dispatcher(wdb, q2, schedule="each", max_concurrent=3)
    d2.add_consumer(lambda m: time.sleep(0.01), priority=10, capacity=2, name="high")
    d2.add_consumer(lambda m: time.sleep(0.01), priority=1, capacity=2, name="low")
    stats2 = run_dispatcher(d2)
    # high is served while it has capacity; low only gets the overflow (1 of 3 slots)
    assert stats2.per_consumer["high"] > 1.5 * stats2.per_consumer["low"] > 0


def test_equal_consumers_share_fairly(wdb: Database) -> None:
    q = fill(wdb, "jobs", 120)
    d = Dispatcher(wdb, q, schedule="each", max_concurrent=3)
    for name in ("x", "y", "z"):
        d.add_consumer(lambda m: time.sleep(0.002), name=name)
    stats = run_dispatcher(d)
    shares = [stats.per_consumer[n] / 120 for n in ("x", "y", "z")]
    assert all(0.25 <= s <= 0.42 for s in shares), shares


def test_dispatcher_is_fair_between_queues(wdb: Database) -> None:
    a, b = fill(wdb, "a", 60), fill(wdb, "b", 60)
    d = Dispatcher(wdb, [a, b], schedule="each", max_concurrent=1)
    d.add_consumer(lambda m: None)
    stats = d.run(max_messages=40)
    assert abs(stats.per_queue["a"] - stats.per_queue["b"]) <= 2


def test_bad_worker_and_dispatcher_arguments(wdb: Database) -> None:
    with pytest.raises(fdbqueue.QueueError):
        Worker(wdb, "jobs", lambda m: None, mode="sometimes")
    with pytest.raises(fdbqueue.QueueError):
        Worker(wdb, [], lambda m: None)
    with pytest.raises(fdbqueue.QueueError):
        Worker(wdb, "jobs", "not callable")  # type: ignore[arg-type]
    with pytest.raises(fdbqueue.QueueError):
        Dispatcher(wdb, "jobs", schedule="whenever")
    with pytest.raises(fdbqueue.QueueError):
        Dispatcher(wdb, "jobs").run()  # no consumer


def test_lease_worker_with_several_handlers_leases_in_batches(
    wdb: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Refilling the prefetch buffer at every freed slot would cost a lease transaction (and, at
    sync=full, an fsync) per message on top of its ack: the buffer is refilled at half. (The
    budget starts at one message and grows with the measured rates, so the first few are small.)"""
    n = 3000
    q = fill(wdb, "jobs", n)
    batches: list[int] = []
    real = Worker._lease  # every lease transaction of a worker (with batched acks or not)

    def counting(self: Worker, *args: Any, **kw: Any) -> list[Message]:
        got = real(self, *args, **kw)
        if got:
            batches.append(len(got))
        return got

    monkeypatch.setattr(Worker, "_lease", counting)
    stats = Worker(wdb, q, lambda m: None, mode="lease", concurrency=4).run(until_empty=True)
    assert stats.processed == n and sum(batches) == n
    assert len(batches) <= n / 10, f"{len(batches)} lease transactions for {n} messages"


@pytest.mark.parametrize("mode", ["lease", "exactly_once"])
def test_until_empty_ends_soon_after_another_workers_last_ack(wdb: Database, mode: str) -> None:
    """``run(until_empty=True)`` waits while another worker holds a lease (it may come back),
    but an ack wakes no watch: it looked again only after ``idle_timeout`` (1 s), which left
    one of four draining processes idle for a second at the end of a drain. It re-checks
    often while only leases are out."""
    q = Queue("jobs")
    q.enqueue(wdb, b"held")
    held = q.lease(wdb)
    assert held is not None
    handler: Any = (lambda tr, m: None) if mode == "exactly_once" else (lambda m: None)
    worker = Worker(wdb, q, handler, mode=mode)
    assert worker.idle_timeout == 1.0
    done: list[float] = []
    t = threading.Thread(target=lambda: (worker.run(until_empty=True), done.append(time.monotonic())))
    t.start()
    time.sleep(0.3)
    assert not done, "it stopped while a lease was still out"
    acked = time.monotonic()
    q.ack(wdb, held)
    t.join(5)
    assert done and done[0] - acked < 0.4, f"stopped {done[0] - acked:.2f} s after the last ack"
