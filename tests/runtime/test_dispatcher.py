"""The push dispatcher: run(until_empty=True) returns once the queues are drained, whatever the
schedule, and every consumer failure is logged, counted and kept as the nack reason."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Dispatcher, Message, Queue
from fdbqueue.engines.contract import Database


@pytest.fixture(params=["memory", "sqlite"])
def ddb(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = "memory://" if request.param == "memory" else f"sqlite://{tmp_path / 'd.db'}?sync=normal"
    db = fdbqueue.open(url)
    yield db
    db.close()


def recorder(handled: list[str], seconds: float) -> Callable[[Message], None]:
    def handle(m: Message) -> None:
        time.sleep(seconds)
        handled.append(m.text())

    return handle


RUNS = 20
# 12 messages of 20 ms on 2 slots take about 0.12 s; an idle wait is at most idle_timeout.
RUN_DEADLINE = 5.0


@pytest.mark.parametrize(
    "schedule", [{"schedule": "length", "length": 5}, {"schedule": "interval", "interval": 0.05}], ids=str
)
def test_until_empty_returns_once_drained_with_every_schedule(
    ddb: Database, schedule: dict[str, Any]
) -> None:
    """The last lease of a round comes back empty while a handler is still running: the
    dispatcher must still see, once that handler ends, that the queue is drained and return
    (it used to wait for the next round forever, re-checking only the schedule)."""
    for run in range(RUNS):
        name = f"jobs{run}"
        Queue(name).enqueue_many(ddb, [f"{name}-{i}" for i in range(12)])
        handled: list[str] = []
        d = Dispatcher(ddb, name, max_concurrent=2, idle_timeout=1.0, **schedule)
        d.add_consumer(recorder(handled, 0.02), capacity=2)
        t = threading.Thread(target=d.run, kwargs={"until_empty": True}, daemon=True)
        started = time.monotonic()
        t.start()
        t.join(RUN_DEADLINE)
        hung = t.is_alive()
        if hung:
            d.stop()
            t.join(5)
        assert not hung, f"run {run + 1} of {RUNS}: still dispatching {RUN_DEADLINE} s after start"
        assert sorted(handled) == sorted(f"{name}-{i}" for i in range(12))
        assert time.monotonic() - started < RUN_DEADLINE


def test_until_empty_takes_a_length_schedules_remainder(ddb: Database) -> None:
    """Draining with schedule="length": fewer than ``length`` left and nothing more coming,
    a last shorter round takes them instead of waiting for a round that never comes."""
    q = Queue("jobs")
    q.enqueue_many(ddb, ["a", "b", "c"])
    handled: list[str] = []
    d = Dispatcher(ddb, q, schedule="length", length=100, idle_timeout=0.1)
    d.add_consumer(lambda m: handled.append(m.text()))
    t = threading.Thread(target=d.run, kwargs={"until_empty": True}, daemon=True)
    t.start()
    t.join(RUN_DEADLINE)
    hung = t.is_alive()
    d.stop()
    assert not hung and sorted(handled) == ["a", "b", "c"] and d.stats.rounds == 1


def test_until_empty_waits_for_a_delayed_retry(ddb: Database) -> None:
    """A nacked message waiting out its retry delay is not "empty": it is dispatched again."""
    fdbqueue.create_queue(ddb, "jobs", max_deliveries=2, retry_delay=0.2)
    q = Queue("jobs")
    q.enqueue(ddb, "flaky")
    calls: list[int] = []

    def flaky(m: Message) -> None:
        calls.append(m.deliveries)
        if len(calls) == 1:
            raise RuntimeError("first time fails")

    d = Dispatcher(ddb, q, idle_timeout=0.1)
    d.add_consumer(flaky)
    stats = d.run(until_empty=True)
    assert calls == [1, 2] and stats.acked == 1 and stats.nacked == 1


def test_waiting_for_a_length_does_not_spin(ddb: Database) -> None:
    """Below ``length`` the ready messages stay put: a watch that fires because messages are
    ready would end every wait at once (a busy loop of transactions); it waits for new ones."""
    q = Queue("jobs")
    q.enqueue_many(ddb, ["a", "b"])
    handled: list[str] = []
    d = Dispatcher(ddb, q, schedule="length", length=3, idle_timeout=5.0)
    d.add_consumer(lambda m: handled.append(m.text()))
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    time.sleep(0.5)
    assert handled == [] and d._watcher is not None
    armed = d._watcher.armed
    q.enqueue(ddb, "c")  # the third: a round, at once rather than after idle_timeout
    deadline = time.monotonic() + 2
    while len(handled) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    d.stop()
    t.join(5)
    assert sorted(handled) == ["a", "b", "c"]
    assert armed <= 2, f"{armed} watches armed in 0.5 s of waiting"
