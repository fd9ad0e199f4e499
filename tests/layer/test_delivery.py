"""Delivery guarantees on every engine: leases, retries, poison messages, timeouts, delays, dedup."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fdbqueue
from fdbqueue import LeaseError, Queue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.store.clock import FakeClock, fake_clock


@pytest.fixture
def clock(db: Database) -> Iterator[FakeClock]:
    """The test's clock: it moves the wall clock and database time (read versions) together.

    Deadlines are in database time, which a test clock moves on the local engines (and on
    whatever reads their clock); a real cluster's versions follow its own time: skipped there.
    """
    with fake_clock() as c:
        before = _read_version(db)
        c.advance(1.0)
        moved = _read_version(db) - before
        if not VERSIONS_PER_SECOND <= moved < 1.1 * VERSIONS_PER_SECOND:
            pytest.skip("this database's time cannot be moved by a test clock (a real cluster)")
        yield c


def _read_version(db: Database) -> int:
    tr = db.create_transaction()
    try:
        return tr.get_read_version()
    finally:
        tr.cancel()


def make(db: Database, name: str = "jobs", **settings: Any) -> Queue:
    fdbqueue.create_queue(db, name, **settings)
    return Queue(name)


def texts(q: Queue, db: Database) -> list[str]:
    out = []
    while (m := q.dequeue(db)) is not None:
        out.append(m.text())
    return out


def test_lease_hides_until_ack(db: Database, clock: FakeClock) -> None:
    q = make(db)
    q.enqueue(db, "a")
    q.enqueue(db, "b")
    m = q.lease(db)
    assert m is not None and m.text() == "a" and m.deliveries == 1 and m.receipt
    assert m.lease_deadline == pytest.approx(clock.now + 30.0)
    assert q.size(db) == 1 and q.peek(db).text() == "b"  # type: ignore[union-attr]
    leased = q.get(db, m.id)
    assert leased is not None and leased.text() == "a"  # found while in flight
    q.ack(db, m)
    assert q.get(db, m.id) is None
    with pytest.raises(LeaseError):
        q.ack(db, m)  # settled already
    assert texts(q, db) == ["b"]


def test_nack_returns_the_message_to_its_place(db: Database, clock: FakeClock) -> None:
    q = make(db)
    for t in "abc":
        q.enqueue(db, t)
    a = q.lease(db)
    assert a is not None
    assert q.nack(db, a, reason="try later") == "ready"
    again = q.lease(db)
    assert again is not None and again.id == a.id and again.deliveries == 2
    assert again.extra.get("last_error") == "try later"
    q.nack(db, again)
    assert texts(q, db) == ["a", "b", "c"]  # order kept through the message's lifetime


def test_retry_delay_with_backoff(db: Database, clock: FakeClock) -> None:
    q = make(db, retry_delay=10.0, retry_backoff=2.0, max_deliveries=10, retry_jitter=0.0)  # exact
    q.enqueue(db, "a")
    q.enqueue(db, "b")
    a = q.lease(db)
    assert a is not None and q.nack(db, a) == "delayed"
    b = q.lease(db)
    assert b is not None and b.text() == "b"  # a is not handed out before its retry delay
    q.ack(db, b)
    assert q.lease(db) is None
    clock.advance(9.9)
    assert q.lease(db) is None
    clock.advance(0.2)
    a2 = q.lease(db)  # due: promoted by the dequeue itself, no sweep needed
    assert a2 is not None and a2.id == a.id and a2.deliveries == 2
    q.nack(db, a2)
    clock.advance(19.0)
    assert q.lease(db) is None  # the second retry waits 10 * 2 = 20 s
    clock.advance(1.1)
    assert q.lease(db).id == a.id  # type: ignore[union-attr]


def test_computed_retry_delays_get_jitter_and_never_exceed_their_settings(
    db: Database, clock: FakeClock
) -> None:
    # Twenty messages failing together come back spread over the last quarter of their delay,
    # not in one wave; none waits longer than retry_delay; an explicit delay is kept exactly.
    q = make(db, retry_delay=100.0, max_deliveries=10, retry_jitter=0.25)
    q.enqueue_many(db, [f"m{i}" for i in range(21)])
    start = clock.now
    for _ in range(20):
        m = q.lease(db)
        assert m is not None and q.nack(db, m) == "delayed"
    exact = q.lease(db)
    assert exact is not None and q.nack(db, exact, delay=100.0) == "delayed"
    clock.advance(74.9)
    assert q.lease(db) is None  # at most a quarter off
    back: dict[str, float] = {}

    def collect() -> None:
        while (m := q.lease(db)) is not None:
            back[m.id] = clock.now - start

    for _ in range(25):  # to 99.9 s, a second at a time
        clock.advance(1.0)
        collect()
    assert exact.id not in back
    clock.advance(0.2)
    collect()
    assert len(back) == 21 and back[exact.id] >= 100.0  # every one back by 100 s, the explicit at it
    spread = {int(t) for mid, t in back.items() if mid != exact.id}
    assert len(spread) >= 8  # not one wave


def test_poison_message_goes_to_the_error_queue(db: Database, clock: FakeClock) -> None:
    q = make(db, max_deliveries=2)
    big = b"x" * 25_000  # chunked: the chunks must travel too
    mid = q.enqueue(db, big, headers={"kind": "bad"})
    q.enqueue(db, "good")
    for expected in ("ready", "dead"):
        m = q.lease(db)
        assert m is not None and m.id == mid
        assert q.nack(db, m) == expected
    assert texts(q, db) == ["good"]
    dead = Queue("jobs.error").dequeue(db)
    assert dead is not None and dead.id == mid and dead.payload == big
    assert dead.reason == "max_deliveries" and dead.origin == "jobs"
    assert dict(dead.headers) == {"kind": "bad"} and dead.extra["deliveries"] == 2


def test_nack_reason_tags_the_dead_letter_and_custom_error_queue(db: Database, clock: FakeClock) -> None:
    q = make(db, max_deliveries=1, error_queue="graveyard")
    q.enqueue(db, "a")
    m = q.lease(db)
    assert m is not None and q.nack(db, m, reason="ValueError: bad input") == "dead"
    dead = Queue("graveyard").dequeue(db)
    assert dead is not None and dead.reason == "ValueError: bad input"


def test_expired_lease_comes_back(db: Database, clock: FakeClock) -> None:
    q = make(db, lease_seconds=5.0)
    q.enqueue(db, "a")
    m = q.lease(db)
    assert m is not None
    clock.advance(4.0)
    m = q.extend(db, m, 5.0)  # renewed: now due at +9 s
    clock.advance(4.0)
    assert q.lease(db) is None  # still leased
    clock.advance(2.0)
    again = q.lease(db)  # the expired lease is taken back even before a sweep
    assert again is not None and again.id == m.id and again.deliveries == 2
    with pytest.raises(LeaseError):
        q.ack(db, m)  # the old receipt is void
    q.ack(db, again)


def test_sweep_moves_everything_due_and_is_idempotent(db: Database, clock: FakeClock) -> None:
    q = make(db, lease_seconds=5.0, max_deliveries=1)
    q.enqueue(db, "leased")
    q.enqueue(db, "delayed", delay=10.0)
    q.enqueue(db, "short-lived", ttl=3.0)
    assert q.lease(db).text() == "leased"  # type: ignore[union-attr]
    assert q.size(db) == 1
    clock.advance(11.0)
    st = q.sweep(db)
    assert (st.leases, st.delayed, st.expired, st.dead) == (1, 1, 1, 1)
    again = q.sweep(db)
    assert again.total() == 0  # nothing moved twice
    assert texts(q, db) == ["delayed"]
    errors = {m.text(): m.reason for m in Queue("jobs.error").browse(db)}
    assert errors == {"leased": "max_deliveries", "short-lived": "expired"}


def test_expired_messages_are_never_handed_out(db: Database, clock: FakeClock) -> None:
    q = make(db, ttl=60.0, expiry_action="discard")
    q.enqueue(db, "default ttl")
    q.enqueue(db, "own ttl", ttl=5.0)
    q.enqueue(db, "forever", ttl=1000.0)
    clock.advance(61.0)
    m = q.dequeue(db)  # no sweep ran: the two expired ones are discarded on the way
    assert m is not None and m.text() == "forever"
    assert Queue("jobs.error").empty(db)  # discarded, not dead-lettered


def test_delayed_messages_appear_at_their_due_time(db: Database, clock: FakeClock) -> None:
    q = make(db)
    mid = q.enqueue(db, "later", delay=30.0, priority=5)
    q.enqueue(db, "now")
    delayed = q.get(db, mid)
    assert delayed is not None and delayed.text() == "later"
    assert q.size(db) == 1
    assert q.dequeue(db).text() == "now"  # type: ignore[union-attr]
    assert q.dequeue(db) is None
    clock.advance(30.0)
    m = q.dequeue(db)
    assert m is not None and m.id == mid and m.priority == 5


def test_blocking_dequeue_wakes_for_a_delayed_message(db: Database) -> None:
    q = make(db)
    q.enqueue(db, "soon", delay=0.3)
    start = time.monotonic()
    m = q.dequeue(db, timeout=10.0)
    assert m is not None and m.text() == "soon"
    assert 0.25 <= time.monotonic() - start < 5.0


def test_dedup_key_makes_enqueue_idempotent(db: Database, clock: FakeClock) -> None:
    q = make(db, dedup_window=60.0)
    first = q.enqueue(db, "payment", dedup_key="pay-42")
    assert q.enqueue(db, "payment again", dedup_key="pay-42") == first
    assert q.size(db) == 1
    q.dequeue(db)
    assert q.enqueue(db, "still a duplicate", dedup_key="pay-42") == first  # consumed, still known
    assert q.empty(db)
    clock.advance(61.0)
    q.sweep(db)
    assert q.enqueue(db, "new window", dedup_key="pay-42") != first
    assert texts(q, db) == ["new window"]


def test_in_transaction_poison_reaches_the_error_queue(db: Database, clock: FakeClock) -> None:
    q = make(db, max_deliveries=3)
    mid = q.enqueue(db, "always fails")

    @fdbqueue.transactional
    def handler(tr: Any) -> None:
        m = q.dequeue(tr)
        if m is not None:
            tr[b"side-effect"] = b"x"
            raise RuntimeError("the handler fails every time")

    for _ in range(3):
        with pytest.raises(RuntimeError):
            handler(db)
    assert q.empty(db)
    dead = Queue("jobs.error").get(db, mid)
    assert dead is not None and dead.reason == "max_deliveries" and dead.extra["deliveries"] == 3
    assert db.get(b"side-effect") is None  # type: ignore[attr-defined]


def test_in_transaction_dequeue_counts_deliveries(db: Database, clock: FakeClock) -> None:
    q = make(db, max_deliveries=5)
    q.enqueue(db, "m")

    @fdbqueue.transactional
    def attempt(tr: Any, fail: bool) -> int:
        m = q.dequeue(tr)
        assert m is not None
        if fail:
            raise RuntimeError("abort")
        return m.deliveries

    with pytest.raises(RuntimeError):
        attempt(db, True)
    assert attempt(db, False) == 2


def test_strict_order_allows_one_delivery_at_a_time(db: Database, clock: FakeClock) -> None:
    q = make(db, strict_order=True, retry_delay=5.0, max_deliveries=5)
    for t in "abc":
        q.enqueue(db, t)
    a = q.lease(db)
    assert a is not None and a.text() == "a"
    assert q.lease(db) is None  # b waits while a is in flight
    assert q.dequeue(db) is None
    assert q.nack(db, a) == "ready"  # keeps its place...
    assert q.lease(db) is None  # ...and holds the queue through its retry delay
    clock.advance(5.1)
    a2 = q.lease(db)
    assert a2 is not None and a2.id == a.id
    q.ack(db, a2)
    assert [q.lease(db).text()] == ["b"]  # type: ignore[union-attr]
    with pytest.raises(fdbqueue.QueueError):
        q.dequeue(db, where={"k": "v"})


def test_autonomous_enqueue_survives_the_callers_abort(db: Database) -> None:
    audit = Queue("audit")

    @fdbqueue.transactional
    def violation(tr: Any) -> None:
        audit.enqueue(tr, "security violation by user 7", autonomous=True)
        tr[b"app/state"] = b"changed"
        raise PermissionError("denied")

    with pytest.raises(PermissionError):
        violation(db)
    assert db.get(b"app/state") is None  # type: ignore[attr-defined]
    m = audit.dequeue(db)
    assert m is not None and m.text() == "security violation by user 7"


def test_settings_change_and_destroy_removes_every_key(db: Database) -> None:
    q = make(db, max_deliveries=3)
    assert fdbqueue.create_queue(db, "jobs", max_deliveries=7).max_deliveries == 7
    assert fdbqueue.queue_config(db, "jobs").max_deliveries == 7
    q.enqueue(db, "x", ttl=100.0, dedup_key="k")
    q.enqueue(db, "y", delay=100.0)
    q.enqueue(db, b"z" * 30_000)
    q.lease(db)
    fdbqueue.destroy_queue(db, "jobs")
    begin, end = q.keys.all_range()
    assert db.get_range(begin, end) == []  # type: ignore[attr-defined]
    assert "jobs" not in fdbqueue.list_queues(db)


def test_stop_and_start_each_direction(db: Database) -> None:
    q = make(db)
    q.enqueue(db, "kept")
    fdbqueue.set_state(db, "jobs", dequeue=False)
    with pytest.raises(fdbqueue.QueueStoppedError):
        q.dequeue(db)
    with pytest.raises(fdbqueue.QueueStoppedError):
        q.lease(db)
    q.enqueue(db, "still accepted")
    fdbqueue.stop_queue(db, "jobs")
    with pytest.raises(fdbqueue.QueueStoppedError):
        q.enqueue(db, "refused")
    fdbqueue.start_queue(db, "jobs")
    assert texts(q, db) == ["kept", "still accepted"]


def test_in_transaction_poison_with_retry_delay(db: Database, clock: FakeClock) -> None:
    """Each retry is promoted from the delayed set by the failing dequeue itself, and the
    abort rolls that promotion back too: the failed delivery must still be counted."""
    q = make(db, max_deliveries=3, retry_delay=1.0)
    mid = q.enqueue(db, "always fails")
    seen: list[int] = []

    @fdbqueue.transactional
    def handler(tr: Any) -> None:
        m = q.dequeue(tr)
        if m is not None:
            seen.append(m.deliveries)
            raise RuntimeError("fails")

    for _ in range(5):
        with contextlib.suppress(RuntimeError):
            handler(db)
        clock.advance(1.1)
    assert seen == [1, 2, 3]
    dead = Queue("jobs.error").get(db, mid)
    assert dead is not None and dead.reason == "max_deliveries"
