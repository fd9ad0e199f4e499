"""Bounded queues: a batch that does not fit, ``overflow="block"`` with and without a timeout,
and a paused queue seen by a blocking and a non-blocking dequeue."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue, QueueFullError, QueueStoppedError
from fdbqueue.engines.contract import Database
from tests.support.engines import engine_url


@pytest.fixture(params=["memory", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    database = fdbqueue.open(engine_url(request.param, tmp_path))
    yield database
    database.close()


def make(db: Database, **settings: Any) -> Queue:
    fdbqueue.create_queue(db, "jobs", **settings)
    return Queue("jobs")


def test_a_batch_that_does_not_fit_is_refused_whole_and_says_why(db: Database) -> None:
    q = make(db, max_size=10)
    q.enqueue_many(db, [b"x"] * 3)
    with pytest.raises(QueueFullError) as info:
        q.enqueue_many(db, [b"y"] * 8)
    text = str(info.value)
    assert "3 of max_size 10" in text and "batch of 8" in text and "nothing was enqueued" in text, text
    assert q.size(db) == 3
    assert len(q.enqueue_many(db, [b"y"] * 7)) == 7  # what fits, fits


def test_a_batch_larger_than_max_size_is_refused_at_once_even_when_blocking(db: Database) -> None:
    q = make(db, max_size=10, overflow="block")
    start = time.monotonic()
    with pytest.raises(QueueFullError) as info:
        q.enqueue_many(db, [b"y"] * 25)  # no timeout: would wait forever for room that never comes
    assert time.monotonic() - start < 1.0
    assert "batch of 25" in str(info.value) and "never" in str(info.value) and not info.value.block
    assert q.size(db) == 0


def test_block_without_timeout_waits_until_there_is_room(db: Database) -> None:
    q = make(db, max_size=1, overflow="block")
    first = q.enqueue(db, b"a")
    done: list[str] = []
    t = threading.Thread(target=lambda: done.append(q.enqueue(db, b"b")), daemon=True)
    t.start()
    time.sleep(0.4)
    assert not done, "overflow='block' with no timeout returned while the queue was full"
    m = q.dequeue(db)
    assert m is not None and m.id == first
    t.join(5)
    assert done and q.size(db) == 1


def test_block_with_timeout_zero_does_not_wait(db: Database) -> None:
    q = make(db, max_size=1, overflow="block")
    q.enqueue(db, b"a")
    start = time.monotonic()
    with pytest.raises(QueueFullError) as info:
        q.enqueue(db, b"b", timeout=0)
    assert info.value.block and time.monotonic() - start < 0.2


def test_a_paused_queue_says_so_to_blocking_and_plain_dequeues(db: Database) -> None:
    q = make(db)
    q.enqueue(db, b"a")
    fdbqueue.set_state(db, "jobs", dequeue=False)
    for call in (
        lambda: q.dequeue(db),
        lambda: q.dequeue(db, timeout=0.2),
        lambda: q.lease(db),
        lambda: q.lease(db, timeout=0.2),
    ):
        with pytest.raises(QueueStoppedError, match="dequeue is disabled"):
            call()


def test_a_blocking_dequeue_on_a_paused_queue_gets_the_message_once_resumed(db: Database) -> None:
    q = make(db)
    q.enqueue(db, b"a")
    fdbqueue.set_state(db, "jobs", dequeue=False)
    threading.Timer(0.2, lambda: fdbqueue.set_state(db, "jobs", dequeue=True)).start()
    m = q.dequeue(db, timeout=5)
    assert m is not None and m.payload == b"a"
