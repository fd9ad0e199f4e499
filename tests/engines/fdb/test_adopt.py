"""Raw objects of the bindings handed to fdbqueue: an fdb.Database is wrapped (fdbqueue commits
and retries), an fdb.Transaction joined (the caller's ``@fdb.transactional`` loop commits and
retries); anything else that is not an engine's database or transaction is refused."""

from __future__ import annotations

from typing import Any

import pytest

import fdbqueue
from fdbqueue.engines import fdb as fdb_engine
from fdbqueue.engines.transactional import run_transaction, transactional
from fdbqueue.errors import QueueError


def test_a_raw_fdb_database_is_wrapped_and_retried(fdb_db: fdb_engine.FDBDatabase) -> None:
    raw_db = fdb_db.fdb_database
    attempts = 0

    @transactional
    def put(tr: Any) -> Any:
        nonlocal attempts
        attempts += 1
        assert tr.get(b"missing") is None  # a wrapped transaction: None, not an fdb Value
        tr.get(b"k")
        if attempts == 1:
            fdb_db[b"k"] = b"other"  # a conflict: the commit fails with 1020 and is retried
        tr[b"k"] = b"mine"
        return tr

    tr = put(raw_db)
    assert isinstance(tr, fdb_engine.FDBTransaction) and attempts == 2
    assert fdb_db[b"k"] == b"mine"
    assert run_transaction(raw_db, lambda tr: tr.get(b"k")) == b"mine"  # type: ignore[arg-type]


def test_a_raw_fdb_transaction_is_joined(fdb_db: fdb_engine.FDBDatabase) -> None:
    import fdb

    jobs = fdbqueue.Queue("jobs")
    fdbqueue.create_queue(fdb_db, "jobs")

    @transactional
    def put(tr: Any, key: bytes) -> Any:
        tr[key] = b"joined"
        return tr

    @fdb.transactional
    def outer(tr: Any) -> tuple[Any, str]:
        # The caller's transaction: fdbqueue writes into it; fdb's loop commits and retries.
        inner = put(tr, b"j")
        msg_id = jobs.enqueue(tr, b"job-1")
        assert fdb_db[b"j"] is None  # not committed yet
        return inner, msg_id

    inner, msg_id = outer(fdb_db.fdb_database)
    assert isinstance(inner, fdb_engine.FDBTransaction)
    assert fdb_db[b"j"] == b"joined"
    got = jobs.dequeue(fdb_db)
    assert got is not None and got.id == msg_id and got.payload == b"job-1"
    with pytest.raises(QueueError, match="a Database"):
        run_transaction(fdb_db.create_transaction().fdb_transaction, lambda tr: None)  # type: ignore[arg-type]


def test_anything_else_gets_a_clear_error(fdb_db: fdb_engine.FDBDatabase) -> None:
    class LooksLikeADatabase:
        def create_transaction(self) -> Any:
            raise AssertionError("must not be used")

    @transactional
    def put(tr: Any) -> None:
        tr[b"k"] = b"v"

    for bad in (LooksLikeADatabase(), {"tr": 1}, None):
        with pytest.raises(QueueError, match=r"fdbqueue\.open"):
            put(bad)
        with pytest.raises(QueueError, match=r"fdbqueue\.open"):
            run_transaction(bad, lambda tr: None)  # type: ignore[arg-type]
        with pytest.raises(QueueError, match=r"fdbqueue\.open"):
            fdbqueue.Queue("jobs").enqueue(bad, b"x")  # type: ignore[arg-type]


def test_a_raw_fdb_transaction_can_dequeue_inside_the_callers_transaction(
    fdb_db: fdb_engine.FDBDatabase,
) -> None:
    import fdb

    jobs = fdbqueue.Queue("jobs")
    fdbqueue.create_queue(fdb_db, "jobs")
    jobs.enqueue(fdb_db, b"job-1")

    @fdb.transactional
    def take(tr: Any) -> Any:
        return jobs.dequeue(tr)

    got = take(fdb_db.fdb_database)
    assert got is not None and got.payload == b"job-1"
    assert jobs.dequeue(fdb_db) is None


def test_journaled_operations_in_one_raw_fdb_transaction_keep_every_entry(
    fdb_db: fdb_engine.FDBDatabase,
) -> None:
    # Each call wraps the raw transaction afresh: the entries' order within the commit must
    # belong to the raw transaction, not to a wrapper, or entries of one commit share a key.
    import fdb

    from fdbqueue.store.layout import DEFAULT_ROOT, JournalKeys

    jobs = fdbqueue.Queue("jobs")
    fdbqueue.create_queue(fdb_db, "jobs", journal=True)
    attempts = 0

    @fdb.transactional
    def put(tr: Any) -> list[str]:
        nonlocal attempts
        attempts += 1
        tr.get(b"k").wait()
        ids = [jobs.enqueue(tr, b"job-%d" % i) for i in range(16)]
        if attempts == 1:
            fdb_db[b"k"] = b"other"  # a conflict: fdb's loop calls on_error and runs this again
        return ids

    ids = put(fdb_db.fdb_database)
    assert attempts == 2
    entries = list(fdbqueue.journal(fdb_db, "jobs"))[1:]
    assert [(e.op, e.message_id) for e in entries] == [("enqueue", i) for i in ids]
    # The retried attempt numbered its entries from 0 again, and rang the queue's bell.
    assert [e.version[10:] for e in entries] == [i.to_bytes(2, "big") for i in range(16)]
    assert fdb_db[JournalKeys.make(DEFAULT_ROOT).bell("jobs")] == entries[0].version[:10]
    for i in ids:
        assert [(e.op, e.message_id) for e in fdbqueue.history(fdb_db, i)] == [("enqueue", i)]

    # A raw transaction reused after reset() numbers from 0 too.
    raw = fdb_db.fdb_database.create_transaction()
    for _ in range(2):
        more = [jobs.enqueue(raw, b"again") for _ in range(3)]
        raw.commit().wait()
        raw.reset()
        got = [e for e in fdbqueue.journal(fdb_db, "jobs") if e.message_id in more]
        assert [e.version[10:] for e in got] == [i.to_bytes(2, "big") for i in range(3)]
