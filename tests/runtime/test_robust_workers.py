"""Robust workers: heartbeats keep a long job's lease (no second delivery), a handler's
``Retry`` and ``Discard`` land where they say, a second signal stops at once with the messages
in hand back in their queue. On the embedded and the sim engines."""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Database, Discard, Message, Queue, Retry, Worker

ENGINES = ("sqlite", "sim")


@pytest.fixture(params=ENGINES)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    url = f"sqlite://{tmp_path / 'q.db'}" if request.param == "sqlite" else "sim://"
    db = fdbqueue.open(url)
    yield db
    db.close()


def test_a_handler_past_its_lease_is_not_delivered_twice_with_heartbeats(store: Database) -> None:
    fdbqueue.create_queue(store, "jobs", lease_seconds=0.6)
    Queue("jobs").enqueue(store, b"long job")
    seen: list[str] = []

    def slow(m: Message) -> None:
        seen.append(m.id)
        time.sleep(2.0)  # more than three leases

    w = Worker(store, "jobs", slow, sweep_interval=0.1)
    t = threading.Thread(target=w.run, kwargs={"max_messages": 1})
    t.start()
    time.sleep(0.2)
    other: list[Message] = []
    deadline = time.monotonic() + 2.2
    while time.monotonic() < deadline:  # a second consumer sweeping and leasing meanwhile
        Queue("jobs").sweep(store)
        m = Queue("jobs").lease(store, lease_seconds=5)
        if m is not None:
            other.append(m)
        time.sleep(0.05)
    t.join(10)
    assert not t.is_alive() and other == [] and len(seen) == 1
    assert w.stats.processed == 1 and w.stats.extended >= 3
    st = fdbqueue.queue_stats(store, "jobs")
    assert (st.ready, st.inflight, st.done) == (0, 0, 1)


def test_without_heartbeats_the_same_job_is_delivered_again(store: Database) -> None:
    """The control: the test above fails without the heartbeat."""
    fdbqueue.create_queue(store, "jobs", lease_seconds=0.6)
    Queue("jobs").enqueue(store, b"long job")
    w = Worker(store, "jobs", lambda m: time.sleep(2.0), heartbeat=False)
    t = threading.Thread(target=w.run)
    t.start()
    time.sleep(1.0)
    Queue("jobs").sweep(store)
    again = Queue("jobs").lease(store, lease_seconds=60)
    w.stop()
    t.join(10)
    assert not t.is_alive()
    assert again is not None  # the lease ran out while the handler ran
    assert w.stats.processed == 0 and w.stats.extended == 0  # its ack found the lease gone


def test_retry_and_discard_land_where_they_say(store: Database) -> None:
    fdbqueue.create_queue(store, "jobs", max_deliveries=5, retry_delay=0)
    q = Queue("jobs")
    later, poison = q.enqueue(store, b"later"), q.enqueue(store, b"poison")

    def handler(m: Message) -> None:
        if m.payload == b"later":
            raise Retry(delay=600, reason="the upstream is down")
        raise Discard("malformed: no customer id")

    w = Worker(store, "jobs", handler)
    stats = w.run(max_messages=2)
    assert (stats.retried, stats.discarded, stats.processed) == (1, 1, 0)
    st = fdbqueue.queue_stats(store, "jobs")
    assert (st.ready, st.delayed, st.inflight) == (0, 1, 0)
    back = q.get(store, later)
    assert back is not None and back.deliveries == 1
    (dead,) = list(Queue("jobs.error").browse(store))
    assert dead.id == poison and dead.reason == "malformed: no customer id"


def test_retry_and_discard_in_exactly_once_mode(store: Database) -> None:
    fdbqueue.create_queue(store, "jobs", max_deliveries=5, retry_delay=0)
    q = Queue("jobs")
    later, poison = q.enqueue(store, b"later"), q.enqueue(store, b"poison")

    def handler(tr: fdbqueue.Transaction, m: Message) -> None:
        tr.set(b"app/" + m.id.encode(), b"written")  # aborted with the verdict
        if m.payload == b"later":
            raise Retry(delay=600)
        raise Discard("cannot be parsed")

    stats = Worker(store, "jobs", handler, mode="exactly_once").run(max_messages=2)
    assert (stats.retried, stats.discarded) == (1, 1)
    assert store.get(b"app/" + later.encode()) is None  # type: ignore[attr-defined]
    assert fdbqueue.queue_stats(store, "jobs").delayed == 1
    (dead,) = list(Queue("jobs.error").browse(store))
    assert dead.id == poison and dead.reason == "cannot be parsed"


def test_a_dispatcher_handler_may_retry_and_discard(store: Database) -> None:
    q = Queue("jobs")
    q.enqueue(store, b"later")
    q.enqueue(store, b"poison")

    def handler(m: Message) -> None:
        if m.payload == b"later":
            raise Retry(delay=600)
        raise Discard("no")

    d = fdbqueue.Dispatcher(store, "jobs")
    d.add_consumer(handler, capacity=1)
    t = threading.Thread(target=d.run)
    t.start()
    deadline = time.monotonic() + 20
    while Queue("jobs.error").size(store) < 1 or fdbqueue.queue_stats(store, "jobs").delayed < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    d.stop()
    t.join(10)
    assert fdbqueue.queue_stats(store, "jobs").delayed == 1
    assert [m.reason for m in Queue("jobs.error").browse(store)] == ["no"]


def _worker_child(url: str, started: str) -> None:
    def handler(m: Message) -> None:
        Path(started).write_text(m.id)
        time.sleep(60)  # a long job, interrupted

    Worker(fdbqueue.open(url), "jobs", handler).run(install_signals=True)


@pytest.mark.parametrize("how", ["second signal", "shutdown_timeout"])
def test_a_second_signal_stops_at_once_and_the_message_goes_back(tmp_path: Path, how: str) -> None:
    import multiprocessing as mp

    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "jobs", lease_seconds=600)
    sent = Queue("jobs").enqueue(db, b"long")
    started = tmp_path / "started"
    ctx = mp.get_context("spawn")
    target = _worker_child if how == "second signal" else _worker_child_with_timeout
    p = ctx.Process(target=target, args=(url, str(started)))
    p.start()
    deadline = time.monotonic() + 30
    while not started.exists():
        assert time.monotonic() < deadline, "the worker never started the job"
        time.sleep(0.05)
    os.kill(p.pid or 0, signal.SIGTERM)  # graceful: would wait a minute for the job
    time.sleep(0.5)
    assert p.is_alive()
    begun = time.monotonic()
    if how == "second signal":
        os.kill(p.pid or 0, signal.SIGTERM)
    p.join(20)
    assert p.exitcode == 0 and time.monotonic() - begun < 10
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.ready, st.inflight) == (1, 0)  # back at once, not after the 600 s lease
    m = Queue("jobs").dequeue(db)
    assert m is not None and m.id == sent and m.deliveries == 1  # the interrupted one not counted


def _worker_child_with_timeout(url: str, started: str) -> None:
    def handler(m: Message) -> None:
        Path(started).write_text(m.id)
        time.sleep(60)

    Worker(fdbqueue.open(url), "jobs", handler, shutdown_timeout=1.0).run(install_signals=True)


def test_cli_worker_logs_failures_as_json_with_their_fields(tmp_path: Path) -> None:
    import json
    import subprocess
    import sys

    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    sent = Queue("jobs").enqueue(db, b"x")
    argv = [
        "--url",
        url,
        "worker",
        "jobs",
        "--handler",
        "tests.support.cli_handlers:fail",
        "--max-messages",
        "1",
    ]
    argv += ["--log-format", "json", "--log-level", "info", "--no-heartbeat", "--shutdown-timeout", "5"]
    r = subprocess.run([sys.executable, "-m", "fdbqueue", *argv], capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr.decode()
    lines = [json.loads(x) for x in r.stderr.decode().splitlines() if x.startswith("{")]
    (failure,) = [x for x in lines if x["level"] == "ERROR"]
    assert (failure["queue"], failure["message_id"], failure["deliveries"]) == ("jobs", sent, 1)
    assert "Traceback" in failure["traceback"] and failure["logger"] == "fdbqueue.runtime.worker"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "fdbqueue",
            "--url",
            url,
            "worker",
            "jobs",
            "--handler",
            "x:y",
            "--log-level",
            "LOUD",
        ],
        capture_output=True,
        timeout=60,
    )
    assert r.returncode == 2 and b"--log-level" in r.stderr


@pytest.mark.parametrize("delay", [-1, "30", float("nan"), float("inf"), True])
def test_a_bad_retry_delay_is_refused_where_the_handler_raises_it(delay: object) -> None:
    """Not when the worker nacks (the message then sat leased, hidden, until its lease ended)."""
    with pytest.raises(fdbqueue.QueueError, match="Retry's delay must be"):
        Retry(delay=delay)  # type: ignore[arg-type]
    with pytest.raises(fdbqueue.QueueError, match="Retry's reason must be a str"):
        Retry(reason=5)  # type: ignore[arg-type]


def test_discard_without_a_reason_dead_letters_as_discarded(store: Database) -> None:
    with pytest.raises(fdbqueue.QueueError, match="Discard's reason must be a str"):
        Discard(123)  # type: ignore[arg-type]
    q = Queue("jobs")
    mid = q.enqueue(store, b"x")

    def handler(m: Message) -> None:
        raise Discard(None)

    stats = Worker(store, "jobs", handler).run(max_messages=1)
    assert (stats.discarded, stats.failed) == (1, 1)
    assert "1 discarded" in str(stats)
    (dead,) = list(Queue("jobs.error").browse(store))
    assert (dead.id, dead.reason) == (mid, "discarded by the handler")


def test_a_retry_counts_and_shows_in_the_summary(store: Database) -> None:
    fdbqueue.create_queue(store, "jobs", retry_delay=0)
    Queue("jobs").enqueue(store, b"x")

    def handler(m: Message) -> None:
        raise Retry(delay=60)

    stats = Worker(store, "jobs", handler).run(max_messages=1)
    assert stats.retried == 1 and str(stats).startswith("processed 0; failed 1 (1 retried)")


@pytest.mark.parametrize(
    ("kwargs", "text"),
    [
        ({"queues": 5}, "queues must be"),
        ({"queues": ["jobs", 5]}, "queues must be"),
        ({"metrics_port": -1}, "metrics_port must be an int from 0 to 65535"),
        ({"metrics_port": 65536}, "metrics_port must be an int from 0 to 65535"),
        ({"heartbeat": "yes"}, "heartbeat must be True or False"),
        ({"run_schedules": 1}, "run_schedules must be True or False"),
    ],
)
def test_a_worker_refuses_bad_arguments_clearly(
    store: Database, kwargs: dict[str, object], text: str
) -> None:
    args: dict[str, object] = {"queues": "jobs", **kwargs}
    with pytest.raises(fdbqueue.QueueError, match=text):
        Worker(store, args.pop("queues"), lambda m: None, **args)  # type: ignore[arg-type]


def test_a_worker_on_port_0_says_which_port_it_serves_metrics_on(store: Database) -> None:
    import urllib.request

    Queue("jobs").enqueue(store, b"x")
    seen: list[str] = []

    def handler(m: Message) -> None:
        assert w.metrics_port  # the port taken, while run() serves
        with urllib.request.urlopen(f"http://127.0.0.1:{w.metrics_port}/metrics", timeout=10) as r:
            seen.append(r.read().decode())

    w = Worker(store, "jobs", handler, metrics_port=0)
    w.run(max_messages=1)
    assert seen and "fdbqueue_queue_messages" in seen[0]
