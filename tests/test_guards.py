"""Settings and names that would wedge a queue later are refused, or cannot wedge it.

A queue's derived names (its error queue) and every duration it keeps are checked where
they enter: a value accepted once is read by every later sweep, dequeue and lease.
"""

from __future__ import annotations

import pytest

import fdbqueue
from fdbqueue import Queue, create_queue
from fdbqueue.config import QueueConfig
from fdbqueue.errors import QueueError
from fdbqueue.layout import QueueKeys, validate_queue_name


@pytest.fixture
def db():
    d = fdbqueue.open("memory://")
    yield d
    d.close()


# -- derived names ---------------------------------------------------------------------------


@pytest.mark.parametrize("length", [194, 195, 198, 200])
def test_long_queue_name_dead_letters_without_wedging(db, length: int) -> None:
    """A name of up to 200 characters has a valid error queue: the first dead letter
    reaches it and the queue keeps working (a name of 195-200 characters once wedged)."""
    name = "q" * length
    create_queue(db, name, max_deliveries=1)
    q = Queue(name)
    q.enqueue(db, b"a")
    q.enqueue(db, b"b")
    m = q.lease(db, lease_seconds=5)
    assert m is not None
    q.nack(db, m)  # max_deliveries=1: dead-lettered
    m2 = q.dequeue(db)
    assert m2 is not None and m2.payload == b"b"
    assert fdbqueue.queue_stats(db, name).errors == 1
    eq = QueueConfig().error_queue_for(name)
    validate_queue_name(eq)
    dead = Queue(eq).dequeue(db)
    assert dead is not None and dead.payload == b"a"


def test_error_queue_names_stay_valid_down_the_chain() -> None:
    """An error queue's own error queue, and its error queue, are valid names too; two
    long names that share a prefix do not share an error queue."""
    name = "e" * 200
    seen = set()
    for _ in range(4):
        name = QueueConfig().error_queue_for(name)
        assert validate_queue_name(name) == name
        seen.add(name)
    assert len(seen) == 4
    a, b = "x" * 199 + "a", "x" * 199 + "b"
    assert QueueConfig().error_queue_for(a) != QueueConfig().error_queue_for(b)
    assert QueueConfig().error_queue_for("orders") == "orders.error"


@pytest.mark.parametrize("bad", ["\x01bad", "", "x" * 201, "a\x7f", 7])
def test_explicit_error_queue_is_validated_as_a_queue_name(db, bad: object) -> None:
    with pytest.raises(QueueError, match="error_queue"):
        create_queue(db, "orders", error_queue=bad)
    with pytest.raises(QueueError, match="error_queue"):
        QueueConfig(error_queue=bad)  # type: ignore[arg-type]


def test_stored_invalid_error_queue_does_not_wedge(db) -> None:
    """Settings stored before the check (an invalid error_queue) still read, and a dead
    letter goes to the default error queue."""
    create_queue(db, "orders", max_deliveries=1)
    keys = QueueKeys.make("orders")
    raw = QueueConfig(max_deliveries=1).encode().replace(b'"error_queue":null', b'"error_queue":"\\u0001bad"')
    assert b"u0001bad" in raw

    def put(t, _):
        t.set(keys.config, raw)
        from fdbqueue.config import bump_metadata_version

        bump_metadata_version(t, keys)

    from fdbqueue.txn import run_once

    run_once(db, put)
    q = Queue("orders")
    q.enqueue(db, b"a")
    m = q.lease(db, lease_seconds=5)
    assert m is not None
    q.nack(db, m)
    dead = Queue("orders.error").dequeue(db)
    assert dead is not None and dead.payload == b"a"
    assert q.dequeue(db) is None
