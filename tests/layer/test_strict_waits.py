"""Waiting on a strict-order queue whose head cannot be delivered yet does not spin.

Under strict order a dequeue returns nothing while a lease is in flight or while the head
waits out its retry delay, though the ready range is not empty: a wait that looked only at
the ready range returned at once, and every waiter spun at full CPU for as long as the
lease or the retry delay lasted.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue, create_queue
from fdbqueue.engines.contract import Database


@pytest.fixture(params=["memory", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path):
    url = "memory://" if request.param == "memory" else f"sqlite://{tmp_path / 'store.db'}?sync=normal"
    d = fdbqueue.open(url)
    yield d
    d.close()


class CountingQueue(Queue):
    """A queue that counts the dequeue and lease attempts made through it."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.attempts = 0

    def dequeue(self, tr: Any, **kw: Any) -> Any:
        self.attempts += 1
        return super().dequeue(tr, **kw)

    def lease_many(self, tr: Any, *a: Any, **kw: Any) -> Any:
        self.attempts += 1
        return super().lease_many(tr, *a, **kw)

    def _dequeue_own(self, *a: Any) -> Any:
        self.attempts += 1
        return super()._dequeue_own(*a)


def strict_with_head_leased(db: Database, **settings: Any) -> Queue:
    create_queue(db, "s", strict_order=True, **settings)
    q = Queue("s")
    for i in range(3):
        q.enqueue(db, f"m{i}".encode())
    assert q.lease(db, lease_seconds=30) is not None  # held by someone else for 30 s
    return q


def test_wait_does_not_return_while_the_head_is_leased(db: Database) -> None:
    q = strict_with_head_leased(db)
    rounds = 0
    end = time.monotonic() + 2.0
    while time.monotonic() < end:
        rounds += 1
        if q.wait(db, timeout=0.5):
            assert q.dequeue(db) is None
    assert rounds <= 6, f"{rounds} wait rounds in 2 s: the waiter spins"


def test_wait_returns_when_the_strict_lease_is_acked(db: Database) -> None:
    create_queue(db, "s", strict_order=True)
    q = Queue("s")
    q.enqueue(db, b"a")
    q.enqueue(db, b"b")
    m = q.lease(db, lease_seconds=30)
    assert m is not None
    threading.Timer(0.3, lambda: q.ack(db, m)).start()
    started = time.monotonic()
    assert q.wait(db, timeout=5)
    assert time.monotonic() - started < 3
    got = q.dequeue(db)
    assert got is not None and got.payload == b"b"


def test_blocking_dequeue_does_not_spin_while_the_head_is_leased(db: Database) -> None:
    strict_with_head_leased(db)
    cq = CountingQueue("s")
    started = time.monotonic()
    assert cq.dequeue(db, timeout=2.0) is None
    assert time.monotonic() - started >= 1.9
    assert cq.attempts <= 6, f"{cq.attempts} dequeue attempts in 2 s"


def test_wait_sleeps_until_the_head_has_waited_out_its_retry_delay(db: Database) -> None:
    create_queue(db, "s", strict_order=True, retry_delay=1.0)
    q = Queue("s")
    q.enqueue(db, b"a")
    m = q.lease(db, lease_seconds=30)
    assert m is not None
    q.nack(db, m)  # back at the head, not before 1 s from now
    rounds = 0
    started = time.monotonic()
    while not q.wait(db, timeout=0.25) or q.peek(db) is None or q.dequeue(db) is None:
        rounds += 1
        assert time.monotonic() - started < 5, "never became deliverable"
    took = time.monotonic() - started
    assert took >= 0.7, f"delivered after {took:.2f} s, before its retry delay"
    assert rounds <= 10, f"{rounds} wait rounds within one retry delay: the waiter spins"


@pytest.mark.parametrize("mode", ["lease", "exactly_once"])
def test_worker_does_not_spin_on_a_leased_strict_head(db: Database, mode: str) -> None:
    strict_with_head_leased(db)
    cq = CountingQueue("s")
    calls: list[Any] = []
    handler = (lambda tr, m: calls.append(m)) if mode == "exactly_once" else calls.append
    w = fdbqueue.Worker(db, cq, handler, mode=mode, idle_timeout=1.0)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    time.sleep(2.0)
    w.stop()
    t.join(10)
    assert not t.is_alive()
    assert not calls
    assert w.stats.wakeups <= 5, f"{w.stats.wakeups} wake-ups in 2 s: the worker spins"
    assert cq.attempts <= 12, f"{cq.attempts} attempts in 2 s: the worker spins"
