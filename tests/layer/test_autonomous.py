"""An autonomous enqueue's outcome reaches its caller.

On sim, memory and FoundationDB the autonomous enqueue commits at once in its own
transaction: its errors are raised to the caller. On the embedded engine the caller's
transaction holds the single writer, so the write waits until that transaction ends; what
can make it fail is checked in the caller's transaction before the id is handed out, and the
admitted write is then not refused for a full queue or a stopped one. What can still fail
(the database closed meanwhile, a full disk) is reported on ``AutonomousId.outcome``.
"""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue, QueueFullError, QueueStoppedError
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import PayloadTooLargeError, QueueError
from fdbqueue.types import AutonomousId
from tests.support.engines import engine_url


@pytest.fixture(params=["sqlite", "memory"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(engine_url(str(request.param), tmp_path))
    try:
        yield db
    finally:
        db.close()


def caller(db: Database) -> Transaction:
    """A caller's transaction that has written already: on the embedded engine it holds the writer."""
    tr = db.create_transaction()
    tr.set(b"app/state", b"changed")
    return tr


def ids(db: Database, q: Queue) -> list[str]:
    return [m.id for m in q.browse(db)]


def test_an_admitted_autonomous_enqueue_is_stored_when_the_callers_transaction_fills_the_queue(
    db: Database,
) -> None:
    fdbqueue.create_queue(db, "jobs", max_size=2)
    q = Queue("jobs")
    tr = caller(db)
    q.enqueue(tr, b"A")
    auto = q.enqueue(tr, b"B", autonomous=True)
    q.enqueue(tr, b"C")  # the caller's own enqueue takes the last place
    tr.commit()
    got = q.get(db, auto)
    assert got is not None and got.payload == b"B", (
        "the autonomous message was lost after its id was returned"
    )
    assert isinstance(auto, AutonomousId) and auto.outcome.result(timeout=5) == auto


def test_an_autonomous_enqueue_into_a_full_queue_is_refused_before_its_id_is_returned(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_size=1)
    q = Queue("jobs")
    tr = caller(db)
    q.enqueue(tr, b"A")  # fills the queue within the caller's transaction (embedded engine)
    if tr.db.may_conflict:  # type: ignore[attr-defined]
        tr.commit()  # memory://: the autonomous write commits at once, against what is committed
        tr = db.create_transaction()
    with pytest.raises(QueueFullError):
        q.enqueue(tr, b"B", autonomous=True)
    tr.commit()
    assert len(ids(db, q)) == 1


def test_two_autonomous_enqueues_in_one_transaction_count_each_other(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_size=1)
    q = Queue("jobs")
    tr = caller(db)
    first = q.enqueue(tr, b"A", autonomous=True)
    with pytest.raises(QueueFullError):
        q.enqueue(tr, b"B", autonomous=True)
    tr.cancel()
    assert ids(db, q) == [first]


def test_an_autonomous_enqueue_into_a_stopped_queue_is_refused_at_once(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs")
    fdbqueue.set_state(db, "jobs", enqueue=False)
    q = Queue("jobs")
    tr = caller(db)
    with pytest.raises(QueueStoppedError):
        q.enqueue(tr, b"A", autonomous=True)
    tr.cancel()


def test_an_autonomous_payload_past_max_payload_is_refused_at_once(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_payload=10)
    q = Queue("jobs")
    tr = caller(db)
    with pytest.raises(PayloadTooLargeError):
        q.enqueue(tr, b"x" * 11, autonomous=True)
    tr.cancel()
    assert ids(db, q) == []


def test_an_admitted_autonomous_enqueue_survives_the_caller_stopping_the_queue(db: Database) -> None:
    """Admitted while the queue took enqueues: written, though the caller then stopped it."""
    fdbqueue.create_queue(db, "jobs")
    q = Queue("jobs")
    tr = caller(db)
    auto = q.enqueue(tr, b"A", autonomous=True)
    fdbqueue.set_state(tr, "jobs", enqueue=False)
    tr.commit()
    assert ids(db, q) == [auto]


def test_an_autonomous_enqueue_with_a_seen_dedup_key_returns_the_first_id(db: Database) -> None:
    q = Queue("jobs")
    first = q.enqueue(db, b"A", dedup_key="k")
    tr = caller(db)
    again = q.enqueue(tr, b"A again", dedup_key="k", autonomous=True)
    tr.cancel()
    assert again == first and again.outcome.result(timeout=5) == first
    assert ids(db, q) == [first]


def test_an_autonomous_enqueue_whose_dedup_key_expired_still_meets_the_queues_bound(db: Database) -> None:
    """A dedup entry past its window matches nothing: the enqueue is then checked like any
    other, against max_size here, not admitted unchecked."""
    with fdbqueue.store.clock.fake_clock() as clock:
        fdbqueue.create_queue(db, "jobs", max_size=2, dedup_window=60)
        q = Queue("jobs")
        q.enqueue(db, b"A", dedup_key="k")
        clock.advance(61)
        tr = caller(db)
        q.enqueue(tr, b"B")  # the caller's own enqueue fills the queue (embedded engine)
        if tr.db.may_conflict:  # type: ignore[attr-defined]
            tr.commit()  # memory://: the autonomous write commits at once, against what is committed
            tr = db.create_transaction()
        with pytest.raises(QueueFullError):
            q.enqueue(tr, b"A, a minute later", dedup_key="k", autonomous=True)
        tr.commit()
    assert len(ids(db, q)) == 2


def test_a_deferred_write_that_fails_reports_it_on_the_outcome(tmp_path: Path) -> None:
    """The embedded engine: the database is closed before the deferred write can run."""
    db = fdbqueue.open(engine_url("sqlite", tmp_path))
    q = Queue("jobs")
    q.enqueue(db, b"first")  # the queue exists
    tr = caller(db)
    tr.on_finish(lambda _error: db.close())  # runs first: the application closes the database
    auto = q.enqueue(tr, b"A", autonomous=True)
    assert isinstance(auto.outcome, Future) and not auto.outcome.done()
    tr.commit()
    with pytest.raises(QueueError):
        auto.outcome.result(timeout=5)


def test_the_callers_own_dedup_entry_does_not_swallow_an_autonomous_enqueue(db: Database) -> None:
    """The caller's enqueue with the key goes when it aborts: the autonomous one must stay."""
    q = Queue("jobs")
    tr = caller(db)
    mine = q.enqueue(tr, b"A", dedup_key="k")
    auto = q.enqueue(tr, b"A, audited", dedup_key="k", autonomous=True)
    tr.cancel()
    assert auto != mine and auto.outcome.result(timeout=5) == auto
    assert ids(db, q) == [auto]
