"""A retried ack, nack, release or extend learns whether its own earlier attempt landed.

A commit that ends in commit_unknown_result (1021) may or may not have been applied
(``fdb_error_predicate`` / ``maybe_committed`` in bindings/c/fdb_c.cpp). Between it and the
retry other clients go on: a lease expires and a sweep releases the message, another worker
leases it. The message's state then says nothing about whether *this* call landed: only a
receipt written in the same transaction does (``fdbqueue.ops.sweep.settle``).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator

import pytest

import fdbqueue
from fdbqueue import LeaseError, Queue
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.errors import CommitUnknownError
from fdbqueue.ops.receipts import RECEIPT_TTL_SECONDS
from fdbqueue.store.clock import fake_clock
from fdbqueue.store.codec import unpack_count
from fdbqueue.testing import FaultScript, on_backoff
from fdbqueue.types import Message

LEASE = 30


@pytest.fixture
def db() -> Iterator[SimDatabase]:
    db = fdbqueue.open("sim://?seed=1")
    assert isinstance(db, SimDatabase)
    fdbqueue.create_queue(db, "jobs", lease_seconds=LEASE, retry_delay=0)
    try:
        yield db
    finally:
        db.close()


def done(db: SimDatabase, q: Queue) -> int:
    return unpack_count(db.create_transaction().get(q.keys.counter("done")))


def leased(db: SimDatabase, q: Queue) -> Message:
    m = q.lease(db)
    assert m is not None
    return m


def test_an_ack_that_did_not_land_is_not_reported_done_after_a_sweep_released_it(db: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock, FaultScript(db) as script:
        m = leased(db, q)

        def lease_expires_and_a_sweep_releases_it() -> None:
            clock.advance(LEASE + 1)
            assert q.sweep(db).leases == 1

        on_backoff(db, lease_expires_and_a_sweep_releases_it)
        script.arm([("1021", False)])
        with pytest.raises(LeaseError):
            q.ack(db, m)
        assert script.fired == [("1021", False)]
    again = q.lease(db)
    assert again is not None and again.id == m.id and again.deliveries == 2
    assert done(db, q) == 0


def test_an_ack_that_landed_is_reported_done_although_the_message_is_gone(db: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock, FaultScript(db) as script:
        m = leased(db, q)
        on_backoff(db, lambda: (clock.advance(LEASE + 1), q.sweep(db)))
        script.arm([("1021", True)])
        q.ack(db, m)
    assert q.get(db, m.id) is None and done(db, q) == 1


@pytest.mark.parametrize("op", ["nack", "release"])
def test_a_nack_or_release_that_landed_is_not_refused_when_another_worker_leased_the_message(
    db: SimDatabase, op: str
) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"A")
    other: list[Message] = []
    with FaultScript(db) as script:
        m = leased(db, q)
        on_backoff(db, lambda: other.append(leased(db, q)))
        script.arm([("1021", True)])
        if op == "nack":
            assert q.nack(db, m, reason="failed once") == "ready"
        else:
            q.release(db, m)
        assert script.fired == [("1021", True)]
    assert len(other) == 1 and other[0].id == m.id
    # The other worker's lease is untouched by the retry.
    q.ack(db, other[0])
    assert done(db, q) == 1


def test_a_nack_that_did_not_land_is_refused_when_the_lease_was_swept(db: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock, FaultScript(db) as script:
        m = leased(db, q)
        on_backoff(db, lambda: (clock.advance(LEASE + 1), q.sweep(db)))
        script.arm([("1021", False)])
        with pytest.raises(LeaseError):
            q.nack(db, m, reason="never recorded")
    back = q.get(db, m.id)
    assert back is not None and "last_error" not in back.extra


def test_an_extend_that_landed_returns_its_lease_even_if_the_retry_finds_it_expired(db: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock, FaultScript(db) as script:
        m = leased(db, q)
        on_backoff(db, lambda: (clock.advance(6), q.sweep(db)))
        script.arm([("1021", True)])
        longer = q.extend(db, m, 5)  # landed: a 5 s lease, over by the time the retry runs
        assert longer.receipt == m.receipt and longer.lease_deadline is not None
        assert script.fired == [("1021", True)]


def test_an_extend_that_did_not_land_is_refused_once_the_lease_was_swept(db: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock, FaultScript(db) as script:
        m = leased(db, q)
        on_backoff(db, lambda: (clock.advance(LEASE + 1), q.sweep(db)))
        script.arm([("1021", False)])
        with pytest.raises(LeaseError):
            q.extend(db, m, 60)


def test_in_a_callers_transaction_no_receipt_is_written(db: SimDatabase) -> None:
    """The caller's own retry settles its transaction: the layer adds nothing to it."""
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with FaultScript(db):
        m = leased(db, q)
        tr = db.create_transaction()
        q.ack(tr, m)
        tr.commit()
    begin, end = q.keys.index_range("rc")
    assert db.create_transaction().get_range(begin, end) == []


@pytest.mark.parametrize("seed", range(1, 9))
def test_property_every_message_is_acked_exactly_once_under_faults(seed: int) -> None:
    """Several workers lease, ack and nack with sweeps and expiring leases, at faults=0.3
    (1020, 1007 and 1021 applied or not): every message is acked exactly once, an ack that
    returns has removed its message, and a nack refused with LeaseError did not land."""
    rng = random.Random(seed)
    db = fdbqueue.open(f"sim://?seed={seed}&faults=0.3")
    assert isinstance(db, SimDatabase)
    n_messages = 60
    q = Queue("jobs")
    fdbqueue.create_queue(db, "jobs", lease_seconds=LEASE, retry_delay=0, max_deliveries=10_000)
    ids = q.enqueue_many(db, [f"m{i}".encode() for i in range(n_messages)])
    acked: Counter[str] = Counter()
    held: list[Message] = []
    refused_nacks = 0
    unknown = 0
    busy = False

    with fake_clock() as clock:

        def meanwhile() -> None:
            # Other clients in a retry's backoff: leases run out and a sweep releases them.
            nonlocal busy
            if busy or rng.random() < 0.3:
                return
            busy = True
            try:
                clock.advance(rng.choice([1, LEASE + 1, LEASE + 1]))
                q.sweep(db)
            except CommitUnknownError:
                pass
            finally:
                busy = False

        on_backoff(db, meanwhile, times=100_000)
        steps = 0
        while sum(acked.values()) < n_messages and steps < 5_000:
            steps += 1
            action = rng.random()
            try:
                if action < 0.35 or not held:
                    m = q.lease(db)
                    if m is not None:
                        held.append(m)
                    else:
                        clock.advance(LEASE + 1)
                        q.sweep(db)
                elif action < 0.75:
                    m = held.pop(rng.randrange(len(held)))
                    try:
                        q.ack(db, m)
                    except LeaseError:
                        continue
                    acked[m.id] += 1
                    assert q.get(db, m.id) is None, f"ack of {m.id} returned but did not land"
                elif action < 0.95:
                    m = held.pop(rng.randrange(len(held)))
                    reason = f"nack {steps}"
                    try:
                        q.nack(db, m, reason=reason)
                    except LeaseError:
                        refused_nacks += 1
                        now = q.get(db, m.id)
                        last = None if now is None else now.extra.get("last_error")
                        assert last != reason, f"nack of {m.id} was refused but it landed"
                else:
                    clock.advance(rng.choice([1, 10, LEASE + 1]))
                    q.sweep(db)
            except CommitUnknownError:
                unknown += 1
        assert unknown == 0, "every retry came within the receipt TTL: none may be unknown"
    assert sorted(acked) == sorted(ids), f"not acked: {set(ids) - set(acked)}"
    assert set(acked.values()) == {1}, f"acked twice: {[k for k, v in acked.items() if v > 1]}"
    assert db.stats.faults.get(1021), db.stats.faults
    db.close()


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
@pytest.mark.parametrize("op", ["ack", "nack", "release", "extend"])
def test_a_retry_past_the_receipt_ttl_raises_instead_of_guessing(
    db: SimDatabase, op: str, applied: bool
) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock, FaultScript(db) as script:
        m = leased(db, q)

        def late() -> None:  # the retry comes after its receipt may have been cleared
            clock.advance(RECEIPT_TTL_SECONDS + 1)
            q.sweep(db)

        on_backoff(db, late)
        script.arm([("1021", applied)])
        with pytest.raises(CommitUnknownError):
            if op == "extend":
                q.extend(db, m, 60)
            else:
                getattr(q, op)(db, m)


def test_ack_many_that_landed_reports_every_message_acked(db: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue_many(db, [b"A", b"B", b"C"])
    with fake_clock() as clock, FaultScript(db) as script:
        ms = q.lease_many(db, 3)
        # Between the unknown commit and its retry the leases run out and a sweep acts.
        on_backoff(db, lambda: (clock.advance(LEASE + 1), q.sweep(db)))
        script.arm([("1021", True)])
        assert [m.id for m in q.ack_many(db, ms)] == [m.id for m in ms]
    assert q.size(db) == 0 and done(db, q) == 3


def test_ack_many_that_did_not_land_acks_only_the_leases_still_held(db: SimDatabase) -> None:
    q = Queue("jobs")
    q.enqueue_many(db, [b"A", b"B"])
    with fake_clock() as clock, FaultScript(db) as script:
        a, b = q.lease_many(db, 2)
        q.extend(db, b, LEASE * 3)  # b's lease outlives the sweep below, a's does not
        on_backoff(db, lambda: (clock.advance(LEASE + 1), q.sweep(db)))
        script.arm([("1021", False)])
        assert [m.id for m in q.ack_many(db, [a, b])] == [b.id]
    assert [m.id for m in q.browse(db)] == [a.id] and done(db, q) == 1
