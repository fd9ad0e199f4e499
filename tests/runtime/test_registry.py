"""The registry of workers: every running Worker (lease and exactly-once modes), AsyncWorker
and Dispatcher shows in ``fdbqueue.workers(db)`` with its host, pid, queues, counts and the
message in hand; it leaves when it stops; a killed one is shown dead after about three
heartbeats (database time) and pruned later. Nothing is waited for by the wall clock: each
check polls the registry until it says what the test expects, within a generous bound."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue, Worker, WorkerInfo, aio
from fdbqueue.ops.txn import run_once
from fdbqueue.store.layout import WorkerKeys
from tests.support import ROOT

ENGINES = ["sim", "sqlite"]
BEAT = 0.1  # seconds between heartbeats in these tests


@pytest.fixture(params=ENGINES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return "sim://?seed=5&faults=0" if request.param == "sim" else f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[Any]:
    d = fdbqueue.open(url)
    yield d
    d.close()


def until(found: Callable[[], Any], what: str, limit: float = 20.0) -> Any:
    """Poll ``found()`` until it is truthy (its value), failing after ``limit`` seconds."""
    end = time.monotonic() + limit
    while True:
        got = found()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"never saw {what}")
        time.sleep(0.02)


def started(w: Any, run: Callable[[], Any] | None = None) -> threading.Thread:
    t = threading.Thread(target=run or w.run, daemon=True)
    t.start()
    return t


def test_a_running_worker_shows_its_counts_and_the_message_in_hand(db: Any) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)  # a failure is one failed delivery
    q = Queue("jobs")
    q.enqueue_many(db, [b"quick"] * 3)
    slow = threading.Event()
    release = threading.Event()

    def handler(m: fdbqueue.Message) -> None:
        if m.payload == b"slow":
            slow.set()
            release.wait(30)
        elif m.payload == b"bad":
            raise ValueError("bad")

    w = Worker(db, "jobs", handler, registry_interval=BEAT, settle_linger=0)
    t = started(w)
    mine: WorkerInfo = until(lambda: [x for x in fdbqueue.workers(db) if x.pid == os.getpid()], "the worker")[
        0
    ]
    assert mine.host == socket.gethostname() and mine.queues == ("jobs",) and mine.kind == "Worker"
    assert mine.started <= time.time() + 1
    until(lambda: [x for x in fdbqueue.workers(db) if x.id == mine.id and x.alive], "it alive")
    until(lambda: fdbqueue.workers(db)[0].handled == 3, "three handled")
    q.enqueue(db, b"bad")
    slow_id = q.enqueue(db, b"slow")
    assert slow.wait(20)
    busy = until(lambda: [x for x in fdbqueue.workers(db) if x.current is not None], "the message in hand")[0]
    assert busy.current.id == slow_id and busy.current.queue == "jobs"
    assert busy.current.since <= time.time() + 1
    assert busy.handled == 4 and busy.failed == 1  # three quick ones and the failure
    release.set()
    until(
        lambda: fdbqueue.workers(db)[0].current is None and fdbqueue.workers(db)[0].handled == 5, "idle again"
    )
    w.stop()
    t.join(30)
    assert fdbqueue.workers(db) == []  # a stopped worker leaves the registry


def test_an_exactly_once_worker_shows_its_message_in_hand(db: Any, url: str) -> None:
    if url.startswith("sqlite"):
        pytest.skip(
            "the embedded engine has one writer, which an exactly-once handler holds while it "
            "runs: the heartbeat writes once it commits (docs/api.md, The registry of workers)"
        )
    q = Queue("jobs")
    mid = q.enqueue(db, b"x")
    inside = threading.Event()
    release = threading.Event()

    def handler(tr: Any, m: fdbqueue.Message) -> None:
        inside.set()
        release.wait(3)  # well within the 5-second transaction

    w = Worker(db, "jobs", handler, mode="exactly_once", registry_interval=BEAT)
    t = started(w, lambda: w.run(max_messages=1))
    assert inside.wait(20)
    busy = until(lambda: [x for x in fdbqueue.workers(db) if x.current is not None], "the message in hand")[0]
    assert busy.current.id == mid
    release.set()
    t.join(30)
    assert fdbqueue.workers(db) == []


def test_async_workers_and_dispatchers_register_too(db: Any) -> None:
    Queue("jobs").enqueue(db, b"x")
    seen: dict[str, WorkerInfo] = {}

    async def handler(m: fdbqueue.Message) -> None:
        seen.update({w.kind: w for w in fdbqueue.workers(db)})

    asyncio.run(aio.AsyncWorker(db, "jobs", handler, registry_interval=BEAT).run(until_empty=True))
    assert seen["AsyncWorker"].queues == ("jobs",)
    Queue("jobs").enqueue(db, b"y")
    d = fdbqueue.Dispatcher(db, ["jobs"], registry_interval=BEAT)
    d.add_consumer(lambda m: seen.update({w.kind: w for w in fdbqueue.workers(db)}))
    d.run(until_empty=True)
    assert seen["Dispatcher"].queues == ("jobs",)
    assert fdbqueue.workers(db) == []


def test_workers_refuses_an_alive_that_is_no_flag(db: Any) -> None:
    """``alive="yes"`` filtered out every worker (an empty list that looked like none running)."""
    for bad in ("yes", 1, "False"):
        with pytest.raises(fdbqueue.QueueError, match="alive must be True or False"):
            fdbqueue.workers(db, alive=bad)  # type: ignore[arg-type]
    assert fdbqueue.workers(db, alive=None) == fdbqueue.workers(db, alive=True) == []


def test_a_worker_may_stay_out_of_the_registry(db: Any) -> None:
    Queue("jobs").enqueue(db, b"x")
    seen = []
    Worker(db, "jobs", lambda m: seen.append(fdbqueue.workers(db)), register=False).run(until_empty=True)
    assert seen == [[]]


def test_a_principal_sees_only_the_workers_of_queues_it_may_browse(db: Any, url: str) -> None:
    if url.startswith("sim"):
        pytest.skip(
            "a principal is given when a store is opened, and each sim:// opened is a store of its own"
        )
    ops = fdbqueue.open(url, principal="ops")
    eve = fdbqueue.open(url, principal="eve")
    fdbqueue.create_queue(ops, "vault", owner="ops")
    Queue("vault").enqueue(ops, b"x")
    release = threading.Event()
    w = Worker(ops, "vault", lambda m: release.wait(30), registry_interval=BEAT)
    t = started(w)
    until(lambda: [x for x in fdbqueue.workers(ops) if x.current], "ops' worker busy")
    assert fdbqueue.workers(eve) == []
    fdbqueue.grant(ops, "vault", "eve", ["browse"])
    assert [x.queues for x in fdbqueue.workers(eve)] == [("vault",)]
    release.set()
    w.stop()
    t.join(30)


CHILD = """
import sys, fdbqueue
db = fdbqueue.open(sys.argv[1])
fdbqueue.Worker(db, "jobs", lambda m: None, registry_interval={beat}).run()
"""


def test_a_killed_worker_is_shown_dead_then_pruned(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    err = tmp_path / "child.err"
    with open(err, "wb") as stderr:
        child = subprocess.Popen([sys.executable, "-c", CHILD.format(beat=BEAT), url], env=env, stderr=stderr)

    def registered() -> list[WorkerInfo]:
        assert child.poll() is None, f"the child ended: {err.read_text()}"
        return [x for x in fdbqueue.workers(db) if x.pid == child.pid]

    try:
        info = until(registered, "the child", 120)[0]
        assert info.interval == BEAT
        os.kill(child.pid, signal.SIGKILL)
        child.wait(30)
        dead = until(lambda: fdbqueue.workers(db, alive=False), "the killed worker dead")
        assert [x.pid for x in dead] == [child.pid]
        assert fdbqueue.workers(db, alive=True) == []
        assert fdbqueue.prune_workers(db, older_than=3600) == 0  # dead, but not long enough
        assert fdbqueue.prune_workers(db, older_than=0) == 1
        assert fdbqueue.workers(db) == []
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
        db.close()


def test_heartbeats_write_only_the_workers_own_key(db: Any) -> None:
    """No key every worker writes: each beat rewrites its own record and nothing else."""
    Queue("a").enqueue(db, b"x")
    ws = [Worker(db, name, lambda m: None, registry_interval=BEAT) for name in ("a", "b")]
    ts = [started(w) for w in ws]
    records = until(lambda: len(fdbqueue.workers(db)) == 2 and fdbqueue.workers(db), "two workers")
    keys = run_once(db, lambda t, _: [kv.key for kv in t.get_range(*WorkerKeys().range())])
    assert sorted(keys) == sorted(WorkerKeys().entry(r.id) for r in records)
    for w in ws:
        w.stop()
    for t in ts:
        t.join(30)
