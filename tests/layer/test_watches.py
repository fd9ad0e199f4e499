"""Watches as FoundationDB limits them: too_many_watches (1032) falls back to timed re-checks,
and an idle waiter keeps its watch instead of rebuilding it every idle timeout.

FoundationDB allows 10,000 outstanding watches per database by default (``set_max_watches``;
``DatabaseContext::maxOutstandingWatches`` in ``fdbclient/NativeAPI.actor.cpp``); the sim
engine refuses past ``max_watches`` with the same error.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator

import pytest

import fdbqueue
from fdbqueue import Queue, aio
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.runtime.dispatcher import Dispatcher
from fdbqueue.runtime.worker import Worker
from scripts.txncost import LoggingDatabase


@pytest.fixture
def sim() -> Iterator[SimDatabase]:
    database = fdbqueue.open("sim://?seed=7&faults=0")
    assert isinstance(database, SimDatabase)
    yield database
    database.close()


def later(seconds: float, action: object) -> threading.Thread:
    def run() -> None:
        time.sleep(seconds)
        action()  # type: ignore[operator]

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_blocking_dequeue_refused_a_watch_waits_out_its_timeout(sim: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(sim, b"x")
    q.dequeue(sim)  # the queue exists, empty
    sim.max_watches = 0
    started = time.monotonic()
    assert q.dequeue(sim, timeout=0.5) is None  # before: EngineError 1032 escaped
    assert time.monotonic() - started >= 0.45


def test_a_blocking_dequeue_refused_a_watch_still_gets_a_message(sim: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(sim, b"x")
    q.dequeue(sim)
    sim.max_watches = 0
    t = later(0.3, lambda: q.enqueue(sim, b"late"))
    m = q.dequeue(sim, timeout=5)
    t.join()
    assert m is not None and m.payload == b"late"


@pytest.mark.parametrize("api", ["blocking", "asyncio"])
def test_both_apis_wait_out_a_refused_watch_alike(sim: SimDatabase, api: str) -> None:
    """One implementation of each wait serves both APIs (``fdbqueue.ops.steps``): with every
    watch refused, a wait shorter than the re-check interval and a longer one both end
    False on an empty queue (the asyncio twin said True to the shorter one), and both still
    see a message that comes."""
    q = Queue("jobs")
    q.enqueue(sim, b"x")
    q.dequeue(sim)
    sim.max_watches = 0
    if api == "blocking":
        wait, take = q.wait, (lambda db, t: q.dequeue(db, timeout=t))
    else:
        aq = aio.AsyncQueue(q)

        def wait(db: SimDatabase, t: float) -> bool:
            return asyncio.run(aq.wait(db, t))

        def take(db: SimDatabase, t: float) -> fdbqueue.Message | None:
            return asyncio.run(aq.dequeue(db, timeout=t))

    for timeout in (0.1, 0.4):  # below and above REFUSED_WATCH_RECHECK (0.2 s)
        started = time.monotonic()
        assert wait(sim, timeout) is False
        assert time.monotonic() - started >= timeout - 0.02
        assert take(sim, timeout) is None
    t = later(0.3, lambda: q.enqueue(sim, b"late"))
    assert wait(sim, 5) is True
    m = take(sim, 5)
    t.join()
    assert m is not None and m.payload == b"late"


def test_wait_refused_a_watch_falls_back_to_timed_rechecks(sim: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(sim, b"x")
    q.dequeue(sim)
    sim.max_watches = 0
    started = time.monotonic()
    assert q.wait(sim, timeout=0.4) is False  # before: EngineError 1032 escaped
    assert time.monotonic() - started >= 0.35
    t = later(0.3, lambda: q.enqueue(sim, b"late"))
    assert q.wait(sim, timeout=5) is True
    t.join()


def test_a_lease_worker_refused_watches_still_serves_every_queue(sim: SimDatabase) -> None:
    sim.max_watches = 1  # two queues: one of them gets no watch
    queues = [Queue("a"), Queue("b")]
    for q in queues:
        q.enqueue(sim, b"warm")
    got: list[bytes] = []
    w = Worker(sim, queues, lambda m: got.append(m.payload), mode="lease", idle_timeout=30.0)
    runner = threading.Thread(target=w.run)
    runner.start()
    try:
        deadline = time.monotonic() + 5
        while len(got) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        for q in queues:  # one at a time: the one without a watch must be served too
            time.sleep(0.3)  # idle again, one queue watched, the other re-checked
            q.enqueue(sim, b"late " + q.name.encode())
            deadline = time.monotonic() + 3  # well inside the 30 s idle timeout
            while got[-1] != b"late " + q.name.encode() and time.monotonic() < deadline:
                time.sleep(0.02)
    finally:
        w.stop()
        runner.join()
    assert got == [b"warm", b"warm", b"late a", b"late b"]
    # Timed re-checks, not a busy loop (before: the refused watch counted as fired, and the
    # worker spun, rebuilding watches thousands of times a second).
    assert w.stats.wakeups < 50, w.stats


@pytest.mark.parametrize("kind", ["worker", "dispatcher"])
def test_an_idle_waiter_keeps_its_watches(sim: SimDatabase, kind: str) -> None:
    """Idle for a second with a 50 ms idle timeout: about 20 idle rounds. Before, each
    round made a watch, its transaction, a bounding read and a relay thread per queue."""
    sim.max_watches = 4  # room for the two queues' watches, not for a rebuild that leaks
    db = LoggingDatabase(sim)
    queues = [Queue("a"), Queue("b")]
    for q in queues:
        q.enqueue(db, b"x")
        q.dequeue(db)
    runner: Worker | Dispatcher
    if kind == "worker":
        runner = Worker(db, queues, lambda m: None, mode="lease", idle_timeout=0.05)
    else:
        runner = Dispatcher(db, queues, idle_timeout=0.05)
        runner.add_consumer(lambda m: None)
    threads_before = threading.active_count()
    db.take_all()
    thread = threading.Thread(target=runner.run)
    thread.start()
    time.sleep(1.0)
    peak_threads = threading.active_count() - threads_before
    runner.stop()
    thread.join()
    costs = [c for c, _ in db.take_all()]
    rounds = max(1, sum(1 for c in costs if c.commit == 0) // 2)
    assert db.watches <= 2, f"{db.watches} watches made while idle"
    assert peak_threads <= 2 + 2  # the runner, its pool or handler, and a relay per watch
    # Per idle round: one lease attempt per queue; the watches and their bounds are kept.
    assert len(costs) <= 2 * rounds + 2 * 2 + 4, f"{len(costs)} transactions in {rounds} rounds"
    assert sim.sizes()["watches"] == 0  # cancelled when the runner stopped
