"""Bad input and misuse of worker-mode delivery, on the memory and sqlite engines.

Every refusal must be a clear QueueError subclass and must leave the queue exactly as it
was: no message lost, none written, no lease settled by mistake.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import (
    LeaseError,
    LeaseExpiredError,
    Message,
    Queue,
    QueueError,
    QueueFullError,
    QueueStoppedError,
)
from fdbqueue.engines.contract import Database
from fdbqueue.store.clock import FakeClock, fake_clock
from fdbqueue.store.codec import unpack_count
from tests.support.engines import engine_url


@pytest.fixture(params=["memory", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    database = fdbqueue.open(engine_url(str(request.param), tmp_path))
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with fake_clock() as c:
        yield c


def make(db: Database, name: str = "jobs", **settings: Any) -> Queue:
    fdbqueue.create_queue(db, name, **{"max_deliveries": 3, "lease_seconds": 30, **settings})
    return Queue(name)


def ids(q: Queue, db: Database) -> list[str]:
    return [m.id for m in q.browse(db)]


def inflight(q: Queue, db: Database) -> int:
    return unpack_count(db.get(q.keys.counter("inflight")))  # type: ignore[attr-defined]


def snapshot(q: Queue, db: Database) -> tuple[list[str], int, int]:
    """What a refused call must leave unchanged: ready ids in order, size, in-flight count."""
    return ids(q, db), q.size(db), inflight(q, db)


def settle(q: Queue, db: Database, op: str, m: Any) -> Any:
    if op == "ack":
        return q.ack(db, m)
    if op == "nack":
        return q.nack(db, m)
    return q.extend(db, m, 30)


SETTLE = ["ack", "nack", "extend"]


# -- acks of what is not a live lease ----------------------------------------------------------


@pytest.mark.parametrize("op", SETTLE)
def test_settling_a_dequeued_message_is_a_lease_error(db: Database, op: str) -> None:
    """dequeue() hands out a Message without a receipt: nothing to ack, and nothing comes back."""
    q = make(db)
    a, b = q.enqueue_many(db, [b"a", b"b"])
    m = q.dequeue(db)
    assert m is not None and m.id == a and m.receipt is None
    with pytest.raises(LeaseError):
        settle(q, db, op, m)
    assert q.get(db, a) is None, "a refused ack/nack/extend resurrected a dequeued message"
    assert snapshot(q, db) == ([b], 1, 0)


@pytest.mark.parametrize("op", SETTLE)
@pytest.mark.parametrize("forgery", ["unknown id", "wrong receipt", "other queue", "not a message"])
def test_settling_an_unknown_lease_is_a_lease_error(db: Database, op: str, forgery: str) -> None:
    q = make(db)
    other = make(db, "other")
    a, b = q.enqueue_many(db, [b"a", b"b"])
    m = q.lease(db)
    assert m is not None and m.id == a and m.receipt
    target: Queue = q
    bogus: Any
    if forgery == "unknown id":
        bogus = dataclasses.replace(m, id=uuid.uuid4().hex)
    elif forgery == "wrong receipt":
        bogus = dataclasses.replace(m, receipt=uuid.uuid4().hex)
    elif forgery == "other queue":
        bogus, target = m, other
    else:
        bogus = m.id
    with pytest.raises(QueueError) as info:
        settle(target, db, op, bogus)
    if forgery != "not a message":
        assert isinstance(info.value, LeaseError)
        assert not isinstance(info.value, LeaseExpiredError)
    # The real lease is untouched: still in flight, and its holder can settle it.
    assert snapshot(q, db) == ([b], 1, 1)
    leased = q.get(db, a)
    assert leased is not None and leased.lease_deadline == m.lease_deadline
    q.ack(db, m)
    assert snapshot(q, db) == ([b], 1, 0) and q.get(db, a) is None


@pytest.mark.parametrize(
    ("first", "then"),
    [
        ("ack", "ack"),
        ("ack", "nack"),
        ("ack", "extend"),
        ("nack", "ack"),
        ("nack", "nack"),
        ("nack", "extend"),
    ],
)
def test_settling_a_lease_twice_is_a_lease_error(db: Database, first: str, then: str) -> None:
    q = make(db)
    a, b = q.enqueue_many(db, [b"a", b"b"])
    m = q.lease(db)
    assert m is not None and m.id == a
    settle(q, db, first, m)
    after = snapshot(q, db)
    assert after == (([b], 1, 0) if first == "ack" else ([a, b], 2, 0))
    with pytest.raises(LeaseError) as info:
        settle(q, db, then, m)
    assert not isinstance(info.value, LeaseExpiredError)
    assert snapshot(q, db) == after, "the refused second settlement moved something"
    if first == "nack":
        again = q.get(db, a)
        assert again is not None and again.deliveries == 1, "the refused call counted a delivery"


def test_the_first_holders_settlement_after_another_lease_is_refused(db: Database, clock: FakeClock) -> None:
    """Worker 1's lease expires, worker 2 leases the message: worker 1 can no longer ack it."""
    q = make(db)
    a = q.enqueue(db, b"a")
    first = q.lease(db)
    clock.advance(31)
    second = q.lease(db)  # the expired lease is released by this lease itself
    assert first is not None and second is not None and second.id == a and second.deliveries == 2
    for op in SETTLE:
        with pytest.raises(LeaseError):
            settle(q, db, op, first)
    assert q.get(db, a).lease_deadline == second.lease_deadline  # type: ignore[union-attr]
    q.ack(db, second)
    assert q.get(db, a) is None and snapshot(q, db) == ([], 0, 0)


# -- expired leases ---------------------------------------------------------------------------


@pytest.mark.parametrize("op", SETTLE)
def test_settling_an_expired_lease_is_refused_and_the_message_comes_back(
    db: Database, clock: FakeClock, op: str
) -> None:
    q = make(db)
    a, b = q.enqueue_many(db, [b"a", b"b"])
    m = q.lease(db)
    assert m is not None and m.id == a
    clock.advance(30)  # deadline == now: expired (a lease holds strictly before its deadline)
    with pytest.raises(LeaseExpiredError):
        settle(q, db, op, m)
    assert snapshot(q, db) == ([b], 1, 1), "the refused call moved the message before the sweep"
    stats = q.sweep(db)
    assert stats.leases == 1
    assert snapshot(q, db) == ([a, b], 2, 0), "the expired lease did not come back to its place"
    back = q.get(db, a)
    assert back is not None and back.deliveries == 1 and back.payload == b"a"
    again = q.lease(db)
    assert again is not None and again.id == a and again.deliveries == 2
    with pytest.raises(LeaseError):
        settle(q, db, op, m)  # the old receipt stays dead
    q.ack(db, again)
    assert snapshot(q, db) == ([b], 1, 0)


def test_extend_keeps_a_lease_alive_past_its_first_deadline(db: Database, clock: FakeClock) -> None:
    q = make(db)
    a = q.enqueue(db, b"a")
    m = q.lease(db)
    assert m is not None
    clock.advance(20)
    m2 = q.extend(db, m, 30)
    assert m2.lease_deadline == pytest.approx(clock.now + 30)
    clock.advance(20)  # 40 s after the lease: past the first deadline, before the new one
    assert q.sweep(db).leases == 0
    q.ack(db, m)  # the original handle still carries the (unchanged) receipt
    assert q.get(db, a) is None and snapshot(q, db) == ([], 0, 0)


# -- bad numbers --------------------------------------------------------------------------------


BAD_SECONDS = [-1, -0.001, float("nan"), "5"]
SECONDS_CALLS = [
    "enqueue delay",
    "enqueue ttl",
    "enqueue timeout",
    "enqueue_many delay",
    "enqueue_many ttl",
    "lease lease_seconds",
    "lease timeout",
    "dequeue timeout",
    "extend lease_seconds",
    "nack delay",
    "wait timeout",
]
# None means "none" or "the default" elsewhere (no ttl, no timeout, the queue's lease or retry delay).
NONE_REFUSED = ["enqueue delay", "enqueue_many delay", "extend lease_seconds"]


@pytest.mark.parametrize(
    ("call", "value"),
    [(c, v) for c in SECONDS_CALLS for v in BAD_SECONDS] + [(c, None) for c in NONE_REFUSED],
    ids=lambda x: repr(x) if not isinstance(x, str) or " " not in x else x,
)
def test_bad_seconds_are_refused_and_nothing_is_written(db: Database, call: str, value: Any) -> None:
    q = make(db, max_size=10, overflow="block")
    q.enqueue(db, b"first")
    m = q.lease(db)
    assert m is not None
    before = snapshot(q, db)
    calls: dict[str, Callable[[], Any]] = {
        "enqueue delay": lambda: q.enqueue(db, b"x", delay=value),
        "enqueue ttl": lambda: q.enqueue(db, b"x", ttl=value),
        "enqueue timeout": lambda: q.enqueue(db, b"x", timeout=value),
        "enqueue_many delay": lambda: q.enqueue_many(db, [b"x", b"y"], delay=value),
        "enqueue_many ttl": lambda: q.enqueue_many(db, [b"x", b"y"], ttl=value),
        "lease lease_seconds": lambda: q.lease(db, value),
        "lease timeout": lambda: q.lease(db, timeout=value),
        "dequeue timeout": lambda: q.dequeue(db, timeout=value),
        "extend lease_seconds": lambda: q.extend(db, m, value),
        "nack delay": lambda: q.nack(db, m, delay=value),
        "wait timeout": lambda: q.wait(db, timeout=value),
    }
    with pytest.raises(QueueError):
        calls[call]()
    assert snapshot(q, db) == before
    q.ack(db, m)  # the lease survived the refused call


@pytest.mark.parametrize("call", ["enqueue ttl", "lease lease_seconds", "extend lease_seconds"])
def test_zero_ttl_and_zero_lease_are_refused(db: Database, call: str) -> None:
    q = make(db)
    q.enqueue(db, b"first")
    m = q.lease(db)
    assert m is not None
    q.enqueue(db, b"second")
    before = snapshot(q, db)
    with pytest.raises(QueueError):
        if call == "enqueue ttl":
            q.enqueue(db, b"x", ttl=0)
        elif call == "lease lease_seconds":
            q.lease(db, 0)
        else:
            q.extend(db, m, 0)
    assert snapshot(q, db) == before


@pytest.mark.parametrize(
    "setting",
    [
        {"lease_seconds": -1},
        {"lease_seconds": 0},
        {"retry_delay": -1},
        {"ttl": -5},
        {"max_deliveries": 0},
        {"max_size": 0},
        {"overflow": "drop"},
        {"expiry_action": "explode"},
    ],
    ids=str,
)
def test_bad_queue_settings_are_refused(db: Database, setting: dict[str, Any]) -> None:
    make(db)
    before = fdbqueue.queue_config(db, "jobs")
    with pytest.raises(QueueError):
        fdbqueue.create_queue(db, "jobs", **setting)
    assert fdbqueue.queue_config(db, "jobs") == before
    with pytest.raises(QueueError):
        fdbqueue.create_queue(db, "fresh", **setting)
    assert "fresh" not in fdbqueue.list_queues(db)


def test_bad_nack_reason_is_refused(db: Database) -> None:
    q = make(db)
    a = q.enqueue(db, b"a")
    m = q.lease(db)
    assert m is not None
    with pytest.raises(QueueError):
        q.nack(db, m, reason=42)  # type: ignore[arg-type]
    assert snapshot(q, db) == ([], 0, 1)
    assert q.nack(db, m, reason="ok") == "ready" and ids(q, db) == [a]


# -- stopped queues --------------------------------------------------------------------------


def test_a_stopped_queue_refuses_both_directions_and_keeps_its_messages(db: Database) -> None:
    q = make(db)
    a, b = q.enqueue_many(db, [b"a", b"b"])
    m = q.lease(db)
    assert m is not None and m.id == a
    fdbqueue.stop_queue(db, "jobs")
    before = snapshot(q, db)
    refused: list[Callable[[], Any]] = [
        lambda: q.enqueue(db, b"x"),
        lambda: q.enqueue(db, b"x", dedup_key="while-stopped"),
        lambda: q.enqueue(db, b"x", delay=5),
        lambda: q.enqueue_many(db, [b"x", b"y"]),
        lambda: q.dequeue(db),
        lambda: q.lease(db),
    ]
    for call in refused:
        with pytest.raises(QueueStoppedError):
            call()
    assert snapshot(q, db) == before == ([b], 1, 1)
    assert q.get(db, a) is not None and q.get(db, b) is not None
    fdbqueue.start_queue(db, "jobs")
    # The refused dedup enqueue recorded nothing: the key is free.
    fresh = q.enqueue(db, b"c", dedup_key="while-stopped")
    assert ids(q, db) == [b, fresh]
    q.nack(db, m)
    assert ids(q, db) == [a, b, fresh]
    assert [q.dequeue(db).payload for _ in range(3)] == [b"a", b"b", b"c"]  # type: ignore[union-attr]


def test_dequeue_disabled_refuses_only_dequeue(db: Database) -> None:
    q = make(db)
    a = q.enqueue(db, b"a")
    fdbqueue.set_state(db, "jobs", dequeue=False)
    for call in (lambda: q.dequeue(db), lambda: q.lease(db)):
        with pytest.raises(QueueStoppedError):
            call()
    b = q.enqueue(db, b"b")
    assert ids(q, db) == [a, b]
    fdbqueue.set_state(db, "jobs", dequeue=True, enqueue=False)
    with pytest.raises(QueueStoppedError):
        q.enqueue(db, b"c")
    assert q.dequeue(db).id == a  # type: ignore[union-attr]


@pytest.mark.parametrize("op", ["dequeue", "lease"])
def test_a_blocked_consumer_resumes_promptly_when_dequeue_is_enabled_again(db: Database, op: str) -> None:
    """set_state(dequeue=True) bumps the wake key "to wake blocked dequeuers" (admin.py): a
    consumer blocking while dequeue is disabled waits, then takes the message at once."""
    q = make(db)
    fdbqueue.set_state(db, "jobs", dequeue=False)
    out: dict[str, Any] = {}

    def consumer() -> None:
        start = time.monotonic()
        try:
            out["m"] = q.dequeue(db, timeout=5) if op == "dequeue" else q.lease(db, timeout=5)
        except Exception as exc:
            out["error"] = exc
        out["after"] = time.monotonic() - start

    t = threading.Thread(target=consumer)
    t.start()
    time.sleep(0.3)
    fdbqueue.set_state(db, "jobs", dequeue=True)
    woke_at = time.monotonic()
    mid = q.enqueue(db, b"work")
    t.join(10)
    assert not t.is_alive()
    assert "error" not in out, (
        f"the blocking {op} gave up after {out['after']:.3f} s with {out['error']!r} instead of "
        "waiting for dequeue to be enabled again"
    )
    got = out["m"]
    assert got is not None and got.id == mid
    assert time.monotonic() - woke_at < 1.5, "the consumer was not woken promptly"


def test_a_blocking_consumer_on_a_disabled_queue_times_out_without_taking_anything(db: Database) -> None:
    q = make(db)
    a = q.enqueue(db, b"a")
    fdbqueue.set_state(db, "jobs", dequeue=False)
    start = time.monotonic()
    try:
        got = q.dequeue(db, timeout=0.3)
    except QueueStoppedError:
        got = None  # refusing at the deadline is as good as returning nothing
    waited = time.monotonic() - start
    assert got is None and 0.25 <= waited < 1.5, f"got {got} after {waited:.3f} s"
    fdbqueue.set_state(db, "jobs", dequeue=True)
    assert ids(q, db) == [a]


# -- full queues ------------------------------------------------------------------------------


def test_a_full_queue_rejects_and_writes_nothing(db: Database) -> None:
    q = make(db, max_size=2, overflow="reject")
    a, b = q.enqueue_many(db, [b"a", b"b"])
    refused: list[Callable[[], Any]] = [
        lambda: q.enqueue(db, b"c"),
        lambda: q.enqueue(db, b"c", dedup_key="full"),
        lambda: q.enqueue(db, b"c", delay=5),
        lambda: q.enqueue(db, b"c", timeout=0.2),  # "reject" does not wait, whatever the timeout
    ]
    for call in refused:
        start = time.monotonic()
        with pytest.raises(QueueFullError) as info:
            call()
        assert not info.value.block and time.monotonic() - start < 0.15
    assert snapshot(q, db) == ([a, b], 2, 0)
    assert not db.get_range_startswith(q.keys.q.pack(("d",)))  # type: ignore[attr-defined]
    m = q.lease(db)
    assert m is not None
    with pytest.raises(QueueFullError):
        q.enqueue(db, b"c")  # a leased message still takes room ...
    q.ack(db, m)  # ... until it is done
    c = q.enqueue(db, b"c", dedup_key="full")  # the refused dedup enqueue left no entry
    assert snapshot(q, db) == ([b, c], 2, 0)


def test_a_full_queue_rejects_a_batch_that_does_not_fit_as_a_whole(db: Database) -> None:
    q = make(db, max_size=2)
    a = q.enqueue(db, b"a")
    with pytest.raises(QueueFullError):
        q.enqueue_many(db, [b"b", b"c"])
    assert snapshot(q, db) == ([a], 1, 0)
    q.enqueue_many(db, [b"b"])
    assert q.size(db) == 2


def test_a_full_blocking_queue_times_out(db: Database) -> None:
    q = make(db, max_size=2, overflow="block")
    q.enqueue_many(db, [b"a", b"b"])
    before = snapshot(q, db)
    start = time.monotonic()
    with pytest.raises(QueueFullError) as info:
        q.enqueue(db, b"c", timeout=0.3)
    waited = time.monotonic() - start
    assert 0.25 <= waited < 1.5, f"waited {waited:.3f} s for a 0.3 s timeout"
    assert "full" in str(info.value)
    assert snapshot(q, db) == before


def test_a_timed_out_blocking_enqueue_still_says_the_policy_is_block(db: Database) -> None:
    """QueueFullError.block tells the caller that waiting may help (overflow "block")."""
    q = make(db, max_size=1, overflow="block")
    q.enqueue(db, b"a")
    with pytest.raises(QueueFullError) as without_waiting:
        q.enqueue(db, b"b", timeout=0)  # no timeout at all waits until there is room
    assert without_waiting.value.block
    with pytest.raises(QueueFullError) as after_waiting:
        q.enqueue(db, b"b", timeout=0.05)
    assert after_waiting.value.block, "the error raised after waiting lost block=True"


def test_a_full_blocking_queue_accepts_when_a_consumer_makes_room(db: Database) -> None:
    q = make(db, max_size=2, overflow="block")
    a, b = q.enqueue_many(db, [b"a", b"b"])
    taken: list[Message | None] = []

    def consumer() -> None:
        time.sleep(0.3)
        taken.append(q.dequeue(db))

    t = threading.Thread(target=consumer)
    t.start()
    start = time.monotonic()
    c = q.enqueue(db, b"c", timeout=5)
    waited = time.monotonic() - start
    t.join(5)
    assert taken and taken[0] is not None and taken[0].id == a
    assert 0.25 <= waited < 2.0, f"the blocked enqueue took {waited:.3f} s once room was made at 0.3 s"
    assert snapshot(q, db) == ([b, c], 2, 0)
