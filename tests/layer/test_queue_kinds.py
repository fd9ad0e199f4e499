"""A queue named where it is unknown or of the wrong kind is an error, not an empty answer:
``journal`` of a queue that keeps no journal, ``redrive`` of a queue that is no error queue,
``forward`` of a source queue that does not exist (issue 29, "names that go unnoticed")."""

from __future__ import annotations

import pytest

import fdbqueue
from fdbqueue import Database, Queue


def _dead_letter(db: Database, queue: str) -> None:
    """A message of ``queue`` (max_deliveries=1) dead-lettered by a nack."""
    q = Queue(queue)
    q.enqueue(db, b"x")
    m = q.lease(db)
    assert m is not None
    q.nack(db, m, reason="boom")


def test_journal_of_a_queue_that_keeps_none_or_of_no_queue_is_an_error(db: Database) -> None:
    fdbqueue.create_queue(db, "plain")
    with pytest.raises(fdbqueue.NotJournaledError, match="'plain' keeps no journal") as info:
        list(fdbqueue.journal(db, "plain"))
    assert isinstance(info.value, fdbqueue.QueueError)
    with pytest.raises(fdbqueue.QueueNotFoundError, match="no queue named 'nosuch'"):
        list(fdbqueue.journal(db, "nosuch"))
    tr = db.create_transaction()
    with pytest.raises(fdbqueue.NotJournaledError):
        list(fdbqueue.journal(tr, "plain"))  # in a caller's transaction too
    tr.cancel()
    assert list(fdbqueue.journal(db, None)) == []  # every journaled queue: none, no error


def test_a_journal_once_kept_stays_readable(db: Database) -> None:
    fdbqueue.create_queue(db, "was", journal=True)
    Queue("was").enqueue(db, b"x")
    fdbqueue.create_queue(db, "was", journal=False)  # turned off: its entries remain until trimmed
    assert [e.op for e in fdbqueue.journal(db, "was")][:2] == ["create", "enqueue"]
    fdbqueue.create_queue(db, "gone", journal=True)
    fdbqueue.destroy_queue(db, "gone")  # the journal outlives the queue (docs/api.md)
    assert [e.op for e in fdbqueue.journal(db, "gone")] == ["create", "destroy"]


def test_redrive_of_a_queue_that_is_no_error_queue_is_an_error(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    Queue("jobs").enqueue(db, b"live")
    with pytest.raises(fdbqueue.NotAnErrorQueueError, match="'jobs' is not an error queue") as info:
        fdbqueue.redrive(db, "jobs")
    assert isinstance(info.value, fdbqueue.QueueError)
    with pytest.raises(fdbqueue.NotAnErrorQueueError):
        fdbqueue.redrive(db, "jobs", to="elsewhere")
    assert Queue("jobs").size(db) == 1 and "elsewhere" not in fdbqueue.list_queues(db)
    with pytest.raises(fdbqueue.QueueNotFoundError):
        fdbqueue.redrive(db, "nosuch")


def test_every_kind_of_error_queue_is_redriven(db: Database) -> None:
    # The default name before any dead letter made it: nothing to redrive, not "no queue".
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    assert fdbqueue.redrive(db, "jobs.error") == 0
    assert "jobs.error" not in fdbqueue.list_queues(db)
    fdbqueue.create_queue(db, "later", error_queue="later.dlq")
    assert fdbqueue.redrive(db, "later.dlq") == 0
    # The default name, made before any dead letter: empty, still an error queue.
    fdbqueue.create_queue(db, "jobs.error")
    assert fdbqueue.redrive(db, "jobs.error") == 0
    # A queue another names as its error queue.
    fdbqueue.create_queue(db, "orders", max_deliveries=1, error_queue="dlq")
    fdbqueue.create_queue(db, "dlq")
    assert fdbqueue.redrive(db, "dlq") == 0
    _dead_letter(db, "orders")
    assert fdbqueue.redrive(db, "dlq") == 1
    # One that holds dead letters though its origin now dead-letters elsewhere.
    _dead_letter(db, "orders")
    fdbqueue.create_queue(db, "orders", error_queue="dlq2")
    assert fdbqueue.redrive(db, "dlq") == 1

    @fdbqueue.transactional
    def in_tr(tr: fdbqueue.Transaction) -> int:
        return fdbqueue.redrive(tr, "jobs.error")

    assert in_tr(db) == 0


def test_forward_of_an_unknown_source_queue_is_an_error() -> None:
    src, dst = fdbqueue.open("memory://"), fdbqueue.open("memory://")
    try:
        with pytest.raises(fdbqueue.QueueNotFoundError, match="no queue named 'nosuch'"):
            fdbqueue.forward(src, "nosuch", dst, "jobs")
        assert fdbqueue.list_queues(dst) == []
        Queue("jobs").enqueue(src, b"x")
        assert fdbqueue.forward(src, "jobs", dst, "jobs").forwarded == 1
    finally:
        src.close()
        dst.close()
