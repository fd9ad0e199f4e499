"""Conformance suite for the core queue, on every engine (the ``db`` fixture)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

import fdbqueue
from fdbqueue import EngineError, Queue
from fdbqueue.engines.contract import Database


@pytest.fixture
def jobs() -> Queue:
    return Queue("jobs")


def drain(q: Queue, db: Database) -> list[Any]:
    out = []
    while (m := q.dequeue(db)) is not None:
        out.append(m.payload)
    return out


def test_enqueue_dequeue_fifo_and_payload_kinds(db: Database, jobs: Queue) -> None:
    ids = [jobs.enqueue(db, b"raw"), jobs.enqueue(db, "text"), jobs.enqueue(db, {"json": 1})]
    assert len(set(ids)) == 3 and all(isinstance(i, str) for i in ids)
    assert jobs.size(db) == 3 and not jobs.empty(db)
    a, b, c = jobs.dequeue(db), jobs.dequeue(db), jobs.dequeue(db)
    assert a is not None and b is not None and c is not None
    assert (a.payload, a.id, a.content_type) == (b"raw", ids[0], fdbqueue.ContentType.BYTES)
    assert b.text() == "text" and c.json() == {"json": 1}
    assert a.queue == "jobs" and a.deliveries == 1 and abs(a.enqueued_at - time.time()) < 60
    assert jobs.dequeue(db) is None
    assert jobs.size(db) == 0 and jobs.empty(db)


def test_priorities_then_fifo(db: Database, jobs: Queue) -> None:
    for i, p in enumerate([0, 5, 0, -1, 5, 10, 0]):
        jobs.enqueue(db, f"{p}:{i}", priority=p)
    assert [x.decode() for x in drain(jobs, db)] == ["10:5", "5:1", "5:4", "0:0", "0:2", "0:6", "-1:3"]


def test_enqueue_many_is_one_ordered_transaction(db: Database, jobs: Queue) -> None:
    ids = jobs.enqueue_many(db, [b"1", b"2", b"3"])
    assert len(ids) == 3 and jobs.size(db) == 3
    assert drain(jobs, db) == [b"1", b"2", b"3"]
    assert jobs.enqueue_many(db, []) == []
    with pytest.raises(fdbqueue.InvalidPayloadError):
        jobs.enqueue_many(db, [b"ok", object()])
    assert jobs.empty(db)  # nothing of the failed batch was written


def test_in_transaction_commit_and_abort(db: Database, jobs: Queue) -> None:
    jobs.enqueue(db, b"m1")

    @fdbqueue.transactional
    def consume(tr: Any, fail: bool) -> Any:
        m = jobs.dequeue(tr)
        tr[b"app/processed"] = m.payload
        if fail:
            raise RuntimeError("the application aborts")
        return m

    with pytest.raises(RuntimeError):
        consume(db, True)
    assert db.get(b"app/processed") is None  # type: ignore[attr-defined]
    assert jobs.size(db) == 1 and jobs.peek(db).payload == b"m1"  # type: ignore[union-attr]
    assert consume(db, False).payload == b"m1"
    assert db.get(b"app/processed") == b"m1"  # type: ignore[attr-defined]
    assert jobs.dequeue(db) is None

    @fdbqueue.transactional
    def produce(tr: Any, fail: bool) -> str:
        mid = jobs.enqueue(tr, b"order")
        tr[b"app/order"] = b"placed"
        if fail:
            raise RuntimeError("abort")
        return mid

    with pytest.raises(RuntimeError):
        produce(db, True)
    assert jobs.empty(db) and db.get(b"app/order") is None  # type: ignore[attr-defined]
    mid = produce(db, False)
    assert jobs.get(db, mid) is not None and db.get(b"app/order") == b"placed"  # type: ignore[attr-defined]


def test_examine_without_consuming(db: Database, jobs: Queue) -> None:
    assert jobs.peek(db) is None and jobs.nth(db, 0) is None
    ids = [jobs.enqueue(db, f"m{i}") for i in range(5)]
    hi = jobs.enqueue(db, "high", priority=1)
    assert jobs.peek(db).id == hi  # type: ignore[union-attr]
    assert jobs.nth(db, 0).id == hi  # type: ignore[union-attr]
    assert jobs.nth(db, 3).id == ids[2]  # type: ignore[union-attr]
    assert jobs.nth(db, 6) is None
    assert jobs.get(db, ids[4]).text() == "m4"  # type: ignore[union-attr]
    assert jobs.get(db, "no-such-id") is None
    assert [m.id for m in jobs.browse(db)] == [hi, *ids]
    assert [m.id for m in jobs.browse(db, limit=2)] == [hi, ids[0]]
    assert jobs.size(db) == 6  # nothing consumed
    with pytest.raises(fdbqueue.QueueError):
        jobs.nth(db, -1)


def test_browse_keeps_place_and_moves_back_for_higher_priority(db: Database, jobs: Queue) -> None:
    ids = [jobs.enqueue(db, f"m{i}") for i in range(6)]
    cursor = jobs.browse(db, batch=2)
    first = [next(cursor).id, next(cursor).id]
    assert first == ids[:2]
    # Concurrent consumers take messages at and ahead of the cursor.
    jobs.dequeue(db)
    jobs.dequeue(db)
    jobs.dequeue(db)
    urgent = jobs.enqueue(db, "urgent", priority=9)  # sorts before the cursor
    late_low = jobs.enqueue(db, "late low")
    rest = [m.id for m in cursor]
    assert rest == [urgent, ids[3], ids[4], ids[5], late_low]


def test_dequeue_by_filter_with_fallback(db: Database, jobs: Queue) -> None:
    jobs.enqueue(db, "a", headers={"importance": "low"})
    b = jobs.enqueue(db, "b", headers={"importance": "high", "n": 1})
    jobs.enqueue(db, "c", headers={"importance": "high", "n": 2})
    assert jobs.dequeue(db, where={"importance": "high"}).id == b  # type: ignore[union-attr]
    assert jobs.dequeue(db, where={"importance": "urgent"}) is None
    got = jobs.dequeue(db, where={"importance": "urgent"}, fallback=True)
    assert got is not None and got.text() == "a"  # the oldest
    m = jobs.dequeue(db, where={"n": 2})
    assert m is not None and dict(m.headers) == {"importance": "high", "n": 2}
    assert jobs.empty(db)


def test_large_payloads_are_chunked(db: Database, jobs: Queue) -> None:
    big = bytes(range(256)) * 1000  # 256,000 bytes: more than one value can hold
    mid = jobs.enqueue(db, big)
    assert jobs.get(db, mid).payload == big  # type: ignore[union-attr]
    assert jobs.peek(db).payload == big  # type: ignore[union-attr]
    m = jobs.dequeue(db)
    assert m is not None and m.payload == big
    assert jobs.empty(db)
    leftover = db.get_range_startswith(jobs.keys.q.pack(("b",)))  # type: ignore[attr-defined]
    assert leftover == []  # chunks removed with the message


def test_oversized_payload_is_refused_and_nothing_written(db: Database, jobs: Queue) -> None:
    fdbqueue.create_queue(db, "small", max_payload=1000)
    small = Queue("small")
    with pytest.raises(fdbqueue.PayloadTooLargeError):
        small.enqueue(db, b"x" * 1001)
    small.enqueue(db, b"x" * 1000)
    assert small.size(db) == 1
    with pytest.raises(fdbqueue.PayloadTooLargeError):
        jobs.enqueue(db, b"x" * 1_048_577)  # past the default maximum (256 KiB)
    assert jobs.empty(db)


@pytest.mark.parametrize("payload", [object(), {1, 2}, float("nan")])
def test_wrong_payload_types(db: Database, jobs: Queue, payload: Any) -> None:
    with pytest.raises(fdbqueue.InvalidPayloadError):
        jobs.enqueue(db, payload)
    assert jobs.empty(db)


@pytest.mark.parametrize("name", ["", "x" * 201, "bad\nname", 7, None])
def test_invalid_queue_names(name: Any) -> None:
    with pytest.raises(fdbqueue.QueueError):
        Queue(name)


def test_bad_arguments(db: Database, jobs: Queue) -> None:
    for kwargs in ({"priority": "high"}, {"priority": 2**40}, {"headers": ["a"]}, {"headers": {"k": [1]}}):
        with pytest.raises(fdbqueue.QueueError):
            jobs.enqueue(db, b"x", **kwargs)
    with pytest.raises(fdbqueue.QueueError):
        jobs.dequeue(db, where="importance=high")  # type: ignore[arg-type]
    with pytest.raises(fdbqueue.QueueError):
        jobs.enqueue("not a db", b"x")  # type: ignore[arg-type]
    assert jobs.empty(db)


def test_blocking_dequeue_waits_for_an_enqueue(db: Database, jobs: Queue) -> None:
    start = time.monotonic()
    assert jobs.dequeue(db, timeout=0.2) is None
    assert 0.15 <= time.monotonic() - start < 2.0
    threading.Timer(0.1, lambda: jobs.enqueue(db, b"wake up")).start()
    start = time.monotonic()
    m = jobs.dequeue(db, timeout=10)
    assert m is not None and m.payload == b"wake up"
    assert time.monotonic() - start < 5.0


def test_blocking_dequeue_needs_a_database(db: Database, jobs: Queue) -> None:
    tr = db.create_transaction()
    with pytest.raises(fdbqueue.QueueError):
        jobs.dequeue(tr, timeout=1.0)
    tr.cancel()


def test_concurrent_enqueues_do_not_conflict(db: Database, jobs: Queue) -> None:
    if db.engine == "sqlite":
        pytest.skip("the embedded engine serialises transactions: there are no conflicts to observe")
    fdbqueue.create_queue(db, "jobs")  # creating on first use would conflict, as it should
    t1, t2 = db.create_transaction(), db.create_transaction()
    jobs.enqueue(t1, b"one")
    jobs.enqueue(t2, b"two")
    t1.commit()
    t2.commit()  # a snapshot read of the index: no conflict
    assert sorted(drain(jobs, db)) == [b"one", b"two"]


def test_concurrent_dequeues_conflict_only_on_the_same_message(db: Database, jobs: Queue) -> None:
    if db.engine == "sqlite":
        pytest.skip("the embedded engine serialises transactions: there are no conflicts to observe")
    jobs.enqueue_many(db, [b"a", b"b"])
    t1, t2 = db.create_transaction(), db.create_transaction()
    m1, m2 = jobs.dequeue(t1), jobs.dequeue(t2)
    assert m1 is not None and m2 is not None and m1.id == m2.id  # both saw the head
    t1.commit()
    with pytest.raises(EngineError) as err:
        t2.commit()
    assert err.value.code == 1020
    assert drain(jobs, db) == [b"b"]


def test_handles_are_namespaced_by_root(db: Database) -> None:
    a, b = Queue("jobs"), Queue("jobs", root=("myapp",))
    a.enqueue(db, b"default root")
    assert b.dequeue(db) is None
    b.enqueue(db, b"my root")
    assert a.dequeue(db).payload == b"default root"  # type: ignore[union-attr]
    assert fdbqueue.list_queues(db, root=("myapp",)) == ["jobs"]


def test_queue_manager_basics(db: Database) -> None:
    cfg = fdbqueue.create_queue(db, "orders", max_deliveries=3)
    assert cfg.max_deliveries == 3 and fdbqueue.queue_config(db, "orders").max_deliveries == 3
    Queue("orders").enqueue(db, b"x")
    assert "orders" in fdbqueue.list_queues(db)
    fdbqueue.destroy_queue(db, "orders")
    assert "orders" not in fdbqueue.list_queues(db)
    assert Queue("orders").empty(db)
    with pytest.raises(fdbqueue.QueueNotFoundError):
        fdbqueue.destroy_queue(db, "orders")
    with pytest.raises(TypeError):
        fdbqueue.create_queue(db, "orders", colour="blue")
    with pytest.raises(fdbqueue.QueueError):
        fdbqueue.create_queue(db, "orders", max_deliveries=0)
