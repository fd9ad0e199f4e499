"""A lost notification delays a waiter and never hangs it.

Removing the embedded engine's notification file under running processes, or a watch
dropped on the way, used to leave ``wait()`` without a timeout waiting forever while
messages arrived. Every wait now looks at the queue again at least every
``LOST_WAKEUP_RECHECK`` seconds; here that interval is shortened and the sim engine's
registered watches are dropped, so that none of them ever fires.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.ops import waiting
from fdbqueue.runtime.handling import wait_any


@pytest.fixture
def db():
    d = fdbqueue.open("sim://?seed=1&faults=0")
    yield d
    d.close()


def lose_watches(db: Any) -> None:
    """Drop every registered watch without firing it: the notification is lost."""
    with db._lock:
        db._watches.clear()
        db._watch_count = 0


def waiting_thread(target: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []
    t = threading.Thread(target=lambda: out.append(target()), daemon=True)
    t.start()
    return t, out


@pytest.fixture
def short_recheck(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(waiting, "LOST_WAKEUP_RECHECK", 0.5)


def test_unbounded_wait_survives_a_lost_notification(db: Any, short_recheck: None) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"x")
    assert q.dequeue(db) is not None  # the queue exists and is empty
    t, out = waiting_thread(lambda: q.wait(db))
    time.sleep(0.2)
    assert t.is_alive()
    lose_watches(db)
    q.enqueue(db, b"y")
    t.join(3.0)
    assert not t.is_alive(), "wait() never returned after its notification was lost"
    assert out == [True]


def test_watcher_without_timeout_survives_a_lost_notification(db: Any, short_recheck: None) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"x")
    assert q.dequeue(db) is not None
    stop = threading.Event()
    t, out = waiting_thread(lambda: wait_any(db, [q], None, stop))
    time.sleep(0.2)
    lose_watches(db)
    q.enqueue(db, b"y")
    t.join(3.0)
    stop.set()
    assert not t.is_alive(), "the watcher never returned after its notification was lost"
    assert out == [True]


def test_kept_watcher_rearms_after_a_lost_notification(db: Any, short_recheck: None) -> None:
    """A watcher kept across waits re-arms a watch that has waited the re-check interval."""
    q = Queue("jobs")
    q.enqueue(db, b"x")
    assert q.dequeue(db) is not None
    watcher = waiting.QueueWatcher(db, [q.keys])
    stop = threading.Event()
    try:
        assert watcher.wait(0.1, stop) is False  # armed, nothing ready
        lose_watches(db)
        q.enqueue(db, b"y")
        started = time.monotonic()
        while not watcher.wait(0.2, stop):
            assert time.monotonic() - started < 3, "the lost watch was never re-armed"
    finally:
        watcher.close()
