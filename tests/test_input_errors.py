"""Bad input gets a clear QueueError and writes nothing; a staged result put back is not done."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.clock import VERSIONS_PER_SECOND, db_now, fake_clock
from fdbqueue.contention import fulfil
from fdbqueue.engines.base import Database
from fdbqueue.errors import QueueError
from fdbqueue.layout import unpack_count
from fdbqueue.receipts import RESULT_TTL_VERSIONS


@pytest.fixture
def db() -> Iterator[Database]:
    db = fdbqueue.open("sim://?seed=1")
    try:
        yield db
    finally:
        db.close()


def counter(db: Database, q: Queue, name: str) -> int:
    return unpack_count(db.create_transaction().get(q.keys.counter(name)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"payload": "lone \ud800 surrogate"},
        {"payload": b"x", "dedup_key": "lone \udc00"},
        {"payload": b"x", "headers": {"n": 10**5000}},
        {"payload": b"x", "headers": {1: "a", "1": "b"}},
        {"payload": b"x", "headers": {("a",): "b"}},
    ],
    ids=[
        "payload-surrogate",
        "dedup-key-surrogate",
        "header-int-5000-digits",
        "int-header-name",
        "tuple-name",
    ],
)
def test_bad_message_input_is_a_queue_error_and_writes_nothing(db: Database, kwargs: dict[str, Any]) -> None:
    q = Queue("jobs")
    with pytest.raises(QueueError) as info:
        q.enqueue(db, **kwargs)
    assert type(info.value).__module__.startswith("fdbqueue")
    assert q.peek(db) is None


def test_a_header_int_past_pythons_digit_limit_names_the_header(db: Database) -> None:
    with pytest.raises(QueueError, match="'big'"):
        Queue("jobs").enqueue(db, b"x", headers={"big": -(10**5000)})


@pytest.mark.parametrize("name", ["lone \ud800", "\udfff"])
def test_a_queue_name_with_a_lone_surrogate_is_a_queue_error(db: Database, name: str) -> None:
    with pytest.raises(QueueError, match="UTF-8"):
        Queue(name)
    with pytest.raises(QueueError, match="UTF-8"):
        fdbqueue.create_queue(db, name)


def test_a_filter_with_a_non_str_header_name_is_refused(db: Database) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"x", headers={"1": "a"})
    with pytest.raises(QueueError, match="header names"):
        q.dequeue(db, where={1: "a"})
    assert q.size(db) == 1


def test_a_staged_result_put_back_after_its_ttl_is_not_counted_done(db: Database) -> None:
    """A result nobody collected (its requester died) goes back to the queue: it was counted
    done when it was paired, and must not stay counted when it is delivered again."""
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock:
        tr = db.create_transaction()
        tr.set(q.keys.pop_key(db_now(tr), os.urandom(8)), b"")  # a requester that then died
        tr.commit()
        assert fulfil(db, q) == 1
        assert q.size(db) == 0
        clock.advance(RESULT_TTL_VERSIONS / VERSIONS_PER_SECOND + 1)
        assert q.sweep(db).results == 1
    assert q.size(db) == 1 and counter(db, q, "done") == 0
    m = q.dequeue(db)
    assert m is not None and m.payload == b"A"
    assert counter(db, q, "done") == 1, "one message taken once, counted done twice"
