"""Settings and names that would wedge a queue later are refused, or cannot wedge it.

A queue's derived names (its error queue) and every duration it keeps are checked where
they enter: a value accepted once is read by every later sweep, dequeue and lease.
"""

from __future__ import annotations

import math

import pytest

import fdbqueue
from fdbqueue import Queue, create_queue
from fdbqueue.errors import QueueError
from fdbqueue.store.clock import fake_clock
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import QueueKeys, validate_queue_name
from fdbqueue.types import MAX_DURATION_SECONDS


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
        from fdbqueue.store.config import bump_metadata_version

        bump_metadata_version(t, keys)

    from fdbqueue.ops.txn import run_once

    run_once(db, put)
    q = Queue("orders")
    q.enqueue(db, b"a")
    m = q.lease(db, lease_seconds=5)
    assert m is not None
    q.nack(db, m)
    dead = Queue("orders.error").dequeue(db)
    assert dead is not None and dead.payload == b"a"
    assert q.dequeue(db) is None


# -- durations -------------------------------------------------------------------------------

DURATIONS = ("retry_delay", "max_retry_delay", "lease_seconds", "ttl", "dedup_window")
TOO_LONG = [math.inf, MAX_DURATION_SECONDS * 2, 1e300]


@pytest.mark.parametrize("setting", DURATIONS)
@pytest.mark.parametrize("value", [*TOO_LONG, -math.inf, math.nan])
def test_queue_durations_are_bounded(db, setting: str, value: float) -> None:
    with pytest.raises(QueueError, match=setting):
        create_queue(db, "orders", **{setting: value})
    with pytest.raises(QueueError, match=setting):
        QueueConfig(**{setting: value})


@pytest.mark.parametrize("setting", DURATIONS)
def test_the_maximum_duration_is_accepted_and_works(db, setting: str) -> None:
    """Ten years is accepted, and a queue using it keeps working after an expiry."""
    create_queue(db, "orders", **{setting: MAX_DURATION_SECONDS})
    q = Queue("orders")
    q.enqueue(db, b"a", ttl=MAX_DURATION_SECONDS, delay=0)
    with fake_clock() as clock:
        m = q.lease(db, lease_seconds=1)
        assert m is not None
        clock.advance(2)
        q.sweep(db)
        q.enqueue(db, b"b")
        q.dequeue(db)
        q.lease(db)
        q.sweep(db)


@pytest.mark.parametrize("bad", ["retry_backoff"])
@pytest.mark.parametrize("value", [math.inf, 1e300, math.nan])
def test_retry_backoff_is_bounded(db, bad: str, value: float) -> None:
    with pytest.raises(QueueError, match=bad):
        create_queue(db, "orders", **{bad: value})


def test_retry_wait_never_overflows() -> None:
    """A large backoff raised to many deliveries stays at max_retry_delay."""
    cfg = QueueConfig(retry_delay=1.0, retry_backoff=1000.0, max_retry_delay=60.0, max_deliveries=10_000)
    assert 60.0 * 0.9 <= cfg.retry_wait(5000) <= 60.0  # the default jitter takes up to a tenth off
    assert cfg.replace(retry_jitter=0.0).retry_wait(5000) == 60.0


@pytest.mark.parametrize("bad", [-0.1, 1.5, "0.1", True, math.nan])
def test_retry_jitter_is_a_fraction(bad: object) -> None:
    with pytest.raises(QueueError, match="retry_jitter must be a number from 0 to 1"):
        QueueConfig(retry_jitter=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("value", [*TOO_LONG, math.nan, -1.0])
def test_enqueue_durations_are_validation_errors(db, value: float) -> None:
    q = Queue("orders")
    with pytest.raises(QueueError, match="delay"):
        q.enqueue(db, b"a", delay=value)
    with pytest.raises(QueueError, match="ttl"):
        q.enqueue(db, b"a", ttl=value)
    with pytest.raises(QueueError, match="timeout"):
        q.dequeue(db, timeout=value)
    with pytest.raises(QueueError, match="timeout"):
        q.wait(db, timeout=value)
    with pytest.raises(QueueError, match="lease"):
        q.lease(db, lease_seconds=value)
    assert q.size(db) == 0


def test_nack_delay_and_extend_are_bounded(db) -> None:
    q = Queue("orders")
    q.enqueue(db, b"a")
    m = q.lease(db, lease_seconds=5)
    assert m is not None
    with pytest.raises(QueueError, match="lease"):
        q.extend(db, m, math.inf)
    with pytest.raises(QueueError, match="delay"):
        q.nack(db, m, delay=math.inf)
    q.ack(db, m)


@pytest.mark.parametrize("param", ["lease_seconds", "sweep_interval", "idle_timeout"])
@pytest.mark.parametrize("value", [math.inf, math.nan, -1.0])
def test_worker_and_dispatcher_durations_are_checked(db, param: str, value: float) -> None:
    with pytest.raises(QueueError, match=param):
        fdbqueue.Worker(db, "orders", lambda m: None, **{param: value})
    with pytest.raises(QueueError, match=param):
        fdbqueue.Dispatcher(db, "orders", **{param: value})


@pytest.mark.parametrize("value", [math.inf, math.nan, 0.0])
def test_dispatcher_interval_is_checked(db, value: float) -> None:
    with pytest.raises(QueueError, match="interval"):
        fdbqueue.Dispatcher(db, "orders", schedule="interval", interval=value)


def test_stored_infinite_duration_reads_as_the_maximum(db) -> None:
    """Settings stored before the bound (JSON ``Infinity``) read as ten years, and the
    queue keeps working past an expiry."""
    from fdbqueue.ops.txn import run_once
    from fdbqueue.store.config import bump_metadata_version

    create_queue(db, "orders", retry_delay=1.0)
    keys = QueueKeys.make("orders")
    raw = QueueConfig(retry_delay=1.0).encode().replace(b'"retry_delay":1.0', b'"retry_delay":Infinity')
    assert b"Infinity" in raw

    def put(t, _):
        t.set(keys.config, raw)
        bump_metadata_version(t, keys)

    run_once(db, put)
    assert fdbqueue.queue_config(db, "orders").retry_delay == MAX_DURATION_SECONDS
    q = Queue("orders")
    q.enqueue(db, b"a")
    q.enqueue(db, b"b")
    with fake_clock() as clock:
        m = q.lease(db, lease_seconds=1)
        assert m is not None
        clock.advance(2)
        q.sweep(db)
        m2 = q.dequeue(db)
        assert m2 is not None and m2.payload == b"b"
