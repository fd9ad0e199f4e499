"""Engine failures are never a message's fault: workers back off and nothing is dead-lettered.

A full disk makes the embedded engine's commits fail with a StoreError (SQLite's
SQLITE_FULL; the transaction applies nothing). :class:`FailingCommits` makes a sim
database's commits with writes fail the same way, inside the engine's own commit, so that
everything around it - the finish callbacks, the transaction's state, the layer's
bookkeeping - runs as it does on a full disk.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue, create_queue
from fdbqueue.engines.contract import Database
from fdbqueue.errors import StoreError
from fdbqueue.testing import outage


class FailingCommits:
    """While ``failing``, every commit with writes on ``db`` raises StoreError (a full disk);
    with ``only`` set, only those that wrote a key starting with it (a large write that no
    longer fits while small ones still do)."""

    def __init__(self, db: Any, only: bytes | None = None) -> None:
        self.failing = False
        self.failed = 0  # commits refused so far
        make = db.create_transaction

        def create_transaction() -> Any:
            t = make()
            commit = t._commit
            put = t.set
            wrote = [False]

            def tracked_set(key: bytes, value: bytes) -> None:
                wrote[0] = wrote[0] or (only is not None and key.startswith(only))
                put(key, value)

            def failing_commit() -> int:
                hit = t._has_writes if only is None else wrote[0]
                wrote[0] = False
                if self.failing and hit:
                    self.failed += 1
                    raise StoreError("store.db: the disk is full (database or disk is full)")
                return commit()

            t._commit = failing_commit
            t.set = tracked_set
            return t

        db.create_transaction = create_transaction


@pytest.fixture
def db():
    d = fdbqueue.open("sim://?seed=1&faults=0")
    yield d
    d.close()


def fill(db: Database, n: int = 4) -> Queue:
    create_queue(db, "jobs", max_deliveries=3)
    q = Queue("jobs")
    for i in range(n):
        q.enqueue(db, f"m{i}".encode())
    return q


def run_for(w: fdbqueue.Worker, seconds: float) -> threading.Thread:
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    time.sleep(seconds)
    return t


def finish(w: fdbqueue.Worker, t: threading.Thread, db: Database, handled: list[bytes]) -> None:
    deadline = time.monotonic() + 15
    while len(set(handled)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    w.stop()
    t.join(10)
    assert not t.is_alive()
    assert sorted(set(handled)) == [b"m0", b"m1", b"m2", b"m3"], "processing did not resume"
    assert Queue("jobs.error").size(db) == 0, "a healthy message was dead-lettered"
    assert fdbqueue.queue_stats(db, "jobs").dead == 0


def test_exactly_once_worker_backs_off_on_a_full_disk(db: Database) -> None:
    fill(db)
    disk = FailingCommits(db)
    calls: list[bytes] = []
    handled: list[bytes] = []
    w = fdbqueue.Worker(db, "jobs", lambda tr, m: calls.append(m.payload), mode="exactly_once")
    disk.failing = True
    t = run_for(w, 2.0)
    during = len(calls)
    assert t.is_alive(), "the worker died"
    assert during <= 15, f"{during} handler calls in 2 s of failing commits: no back-off"
    assert w.stats.failed == 0, "an engine failure was counted as the message's"
    w.handler = lambda tr, m: handled.append(m.payload)
    disk.failing = False
    finish(w, t, db, handled)
    assert w.stats.processed == 4


def test_failing_handler_commits_never_dead_letter_a_message(db: Database) -> None:
    """Only the handler's (large) commits fail, while the worker's small bookkeeping
    commits still land: before, each failure counted a delivery and healthy messages
    went to the error queue as max_deliveries."""
    fill(db)
    disk = FailingCommits(db, only=b"out/")
    handled: list[bytes] = []

    def handler(tr: Any, m: Any) -> None:
        tr.set(b"out/" + m.id.encode(), m.payload * 1000)
        handled.append(m.payload)

    w = fdbqueue.Worker(db, "jobs", handler, mode="exactly_once")
    disk.failing = True
    t = run_for(w, 2.0)
    assert disk.failed <= 15, f"{disk.failed} handler commits failed in 2 s: no back-off"
    assert fdbqueue.queue_stats(db, "jobs").dead == 0
    disk.failing = False
    finish(w, t, db, handled)
    assert w.stats.processed == 4 and w.stats.failed == 0


def test_lease_worker_backs_off_on_a_full_disk(db: Database) -> None:
    fill(db)
    disk = FailingCommits(db)
    handled: list[bytes] = []
    w = fdbqueue.Worker(db, "jobs", lambda m: handled.append(m.payload))
    disk.failing = True
    t = run_for(w, 2.0)
    assert t.is_alive(), "the worker died"
    assert disk.failed <= 20, f"{disk.failed} failed commits in 2 s: no back-off"
    assert not handled
    disk.failing = False
    finish(w, t, db, handled)


def test_workers_back_off_while_the_cluster_is_unavailable(db: Database) -> None:
    fill(db)
    handled: list[bytes] = []
    w = fdbqueue.Worker(db, "jobs", lambda tr, m: handled.append(m.payload), mode="exactly_once")
    with outage(db):
        t = run_for(w, 1.5)
        assert t.is_alive(), "the worker died"
    finish(w, t, db, handled)
    assert w.stats.failed == 0


def test_dispatcher_backs_off_on_a_full_disk(db: Database) -> None:
    fill(db)
    disk = FailingCommits(db)
    handled: list[bytes] = []
    d = fdbqueue.Dispatcher(db, "jobs")
    d.add_consumer(lambda m: handled.append(m.payload))
    disk.failing = True
    t = threading.Thread(target=d.run, daemon=True)
    t.start()
    time.sleep(2.0)
    assert t.is_alive(), "the dispatcher died"
    assert disk.failed <= 20, f"{disk.failed} failed commits in 2 s: no back-off"
    disk.failing = False
    deadline = time.monotonic() + 15
    while len(set(handled)) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    d.stop()
    t.join(10)
    assert sorted(set(handled)) == [b"m0", b"m1", b"m2", b"m3"]
    assert Queue("jobs.error").size(db) == 0
