"""The taken counter: the embedded engine's common dequeue (ops/head.py ``take_short``) counts a
take in one key, ``taken``, instead of the ready and done counters; every reader takes ready as
ready - taken and done as done + taken (store/layout.py). These tests hold every view to the
records it counts after short takes mixed with every other way a message leaves or comes back,
another handle's kept run to the takes it did not see, a store written before the key existed
to what it holds, and the engines that never take the short way to a taken counter of nothing."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue, create_queue, move, purge_queue, queue_stats
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import EngineError, QueueFullError
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.meta import read_meta
from tests.support.old_code import run_old

OLD = "0478719"  # main before the taken counter: its stores have no such key
ROOT = Path(__file__).resolve().parents[2]


def open_file(tmp_path: Path, name: str = "q.db") -> Database:
    return fdbqueue.open(f"sqlite://{tmp_path / name}?sync=normal")


@fdbqueue.transactional
def take(tr: Transaction, q: Queue) -> fdbqueue.Message | None:
    """A dequeue in the caller's transaction: the short step's case."""
    return q.dequeue(tr)


def raw(db: Database, q: Queue, name: str) -> int:
    return unpack_count(run_transaction(db, lambda tr: tr.get(q.keys.counter(name))))


def records(db: Database, q: Queue) -> tuple[int, int, int]:
    """(ready, leased, delayed) messages as stored: the keys a scan finds."""

    def count(tr: Transaction) -> tuple[int, ...]:
        ranges = [q.keys.q.range((tag,)) for tag in ("r", "f", "d")]
        return tuple(len(tr.get_range(r.start, r.stop)) for r in ranges)

    got = run_transaction(db, count)
    return got[0], got[1], got[2]


def assert_views(db: Database, q: Queue, done: int) -> None:
    """Every view of the counts (stats, size, the metadata every operation reads, the metrics'
    stats) equals the records; done equals the takes and acks made."""
    ready, leased, delayed = records(db, q)
    st = queue_stats(db, q.name)
    assert (st.ready, st.inflight, st.delayed, st.done) == (ready, leased, delayed, done), st
    assert q.size(db) == ready
    meta = run_transaction(db, lambda tr: read_meta(tr, q.keys))
    assert (meta.count("ready"), meta.count("inflight"), meta.count("delayed")) == (ready, leased, delayed)
    assert meta.counters["ready"] == ready
    assert raw(db, q, "ready") - raw(db, q, "taken") == ready  # the stored counters themselves


def test_every_view_counts_short_takes_among_every_other_way_out(tmp_path: Path) -> None:
    db = open_file(tmp_path)
    create_queue(db, "jobs", max_deliveries=2, retry_delay=0.0)
    q, elsewhere = Queue("jobs"), Queue("elsewhere")
    create_queue(db, "elsewhere")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(16)])
    done = 0
    for _ in range(4):
        assert take(db, q) is not None
        done += 1
    # the first take scans and keeps the run; the next three are the short step's: taken alone
    assert raw(db, q, "taken") == 3 and raw(db, q, "ready") == 15, "the short step counted in taken"
    assert_views(db, q, done)
    # leases, an ack, a nack back to ready, a long-way dequeue (a filter), short takes between
    a, b = q.lease(db), q.lease(db)
    assert a is not None and b is not None
    assert_views(db, q, done)
    q.ack(db, a)
    done += 1
    assert take(db, q) is not None
    done += 1
    assert q.nack(db, b, delay=0.0) == "ready"
    assert_views(db, q, done)
    assert q.dequeue(db, where={"none": "such"}) is None  # the long way, nothing matches
    got = q.dequeue(db)  # its own transaction
    assert got is not None
    done += 1
    assert take(db, q) is not None
    done += 1
    assert_views(db, q, done)
    # a delayed message, dead-lettering (max_deliveries 2), a TTL run out
    q.enqueue(db, b"later", delay=60.0)
    dead = queue_stats(db, "jobs").dead
    for _ in range(2):  # the head (a message nacked once already) goes to the error queue
        m = q.lease(db)
        assert m is not None
        q.nack(db, m, delay=0.0, reason="no")
    assert queue_stats(db, "jobs").dead > dead
    assert_views(db, q, done)
    # Enqueued after the leases above, not before them: ahead of everything (priority 9), it
    # would be what they lease whenever they run within its 1 ms (a fast machine), and never
    # expire.
    q.enqueue(db, b"short-lived", ttl=0.001, priority=9)
    time.sleep(0.01)
    assert take(db, q) is not None  # the expired one is moved aside on the way
    done += 1
    assert_views(db, q, done)
    assert queue_stats(db, "jobs").expired == 1
    # out of the queue: moved to another
    assert move(db, "jobs", "elsewhere", limit=2) == 2
    assert_views(db, q, done)
    assert take(db, q) is not None
    done += 1
    assert_views(db, q, done)
    # purge: taken folded into done, ready from zero again
    taken = raw(db, q, "taken")
    assert taken > 0
    held = records(db, q)
    assert purge_queue(db, "jobs") == sum(held)
    assert raw(db, q, "taken") == 0 and raw(db, q, "ready") == 0
    assert_views(db, q, done)
    q.enqueue_many(db, [b"x", b"y", b"z"])
    assert take(db, q) is not None and take(db, q) is not None
    done += 2
    assert_views(db, q, done)
    assert elsewhere.size(db) == 2
    db.close()


def test_a_purge_counts_what_the_counters_held_less_the_taken(tmp_path: Path) -> None:
    db = open_file(tmp_path)
    q = Queue("jobs")
    q.enqueue_many(db, [b"a", b"b", b"c", b"d", b"e"])
    for _ in range(3):  # a scan, then two short steps
        assert take(db, q) is not None
    assert raw(db, q, "taken") == 2
    assert purge_queue(db, "jobs") == 2
    st = queue_stats(db, "jobs")
    assert (st.ready, st.done) == (0, 3) and raw(db, q, "done") == 3 and raw(db, q, "taken") == 0
    db.close()


def test_a_full_queue_counts_its_ready_messages_less_the_taken(tmp_path: Path) -> None:
    db = open_file(tmp_path)
    create_queue(db, "jobs", max_size=5)
    q = Queue("jobs")
    for i in range(5):
        q.enqueue(db, f"m{i}".encode())
    with pytest.raises(QueueFullError):
        q.enqueue(db, b"one too many")
    for _ in range(3):  # a scan, then two short steps
        assert take(db, q) is not None
    assert raw(db, q, "taken") == 2
    for i in range(3):
        q.enqueue(db, f"n{i}".encode())  # room for three: the short takes made it
    with pytest.raises(QueueFullError):
        q.enqueue(db, b"one too many")
    assert q.size(db) == 5
    db.close()


def test_another_handles_short_takes_put_a_kept_run_out_of_date(tmp_path: Path) -> None:
    """Two handles on one store, each with its own kept run: b's short takes write only the
    taken counter (not ready, not wake), and a's next take or lease must see its run is out of
    date, not hand out what b took."""
    a, b = open_file(tmp_path), open_file(tmp_path)
    q = Queue("jobs")
    n = 40
    q.enqueue_many(a, [f"m{i}".encode() for i in range(n)])
    seen: list[bytes] = []
    leased: list[fdbqueue.Message] = []
    m = take(a, q)  # a keeps the rest of the run
    assert m is not None
    seen.append(m.payload)
    for i in range(n - 1):
        db = (a, b, b, a)[i % 4]
        if i % 3 == 2:
            got = q.lease(db)  # the lease path: its kept run, its counters
            if got is not None:
                leased.append(got)
        else:
            got = take(db, q)
        if got is not None:
            seen.append(got.payload)
    for m in leased:
        q.ack(a, m)
    while (m := take(b, q)) is not None:
        seen.append(m.payload)
    assert sorted(seen) == sorted(f"m{i}".encode() for i in range(n)), "a message twice or lost"
    assert_views(a, q, n)
    a.close()
    b.close()


def test_a_lease_after_another_handles_short_take_does_not_lease_it_again(tmp_path: Path) -> None:
    a, b = open_file(tmp_path), open_file(tmp_path)
    q = Queue("jobs")
    q.enqueue_many(a, [b"m0", b"m1", b"m2", b"m3"])
    first = q.lease(a)  # a keeps m1.. for its next lease
    assert first is not None and first.payload == b"m0"
    assert take(b, q) is not None  # b's first take reads and scans: m1
    assert (m := take(b, q)) is not None and m.payload == b"m2"  # b's short step, taken only
    second = q.lease(a)
    assert second is not None and second.payload == b"m3", "a leased a message b had taken"
    q.ack(a, first)
    q.ack(a, second)
    assert_views(a, q, 4)
    a.close()
    b.close()


_OLD_WRITER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    from fdbqueue import Queue

    db = fdbqueue.open(sys.argv[1])
    q = Queue("jobs")
    q.enqueue_many(db, [b"m%d" % i for i in range(12)])

    @fdbqueue.transactional
    def take(tr):
        return q.dequeue(tr)

    for _ in range(3):
        assert take(db) is not None
    assert q.dequeue(db) is not None
    m = q.lease(db)
    q.ack(db, m)
    kept = q.lease(db, lease_seconds=600)
    print(kept.id)
    db.close()
    """
)


def test_a_store_written_before_the_taken_counter_is_read_exactly_and_served_once(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    kept_id = run_old(tmp_path, OLD, _OLD_WRITER, url).strip()
    db = fdbqueue.open(url)
    q = Queue("jobs")
    assert run_transaction(db, lambda tr: tr.get(q.keys.counter("taken"))) is None, "an old store"
    st = queue_stats(db, "jobs")
    assert (st.ready, st.inflight, st.done) == (6, 1, 5), st
    assert_views(db, q, 5)
    got = []
    while (m := take(db, q)) is not None:
        got.append(m.payload)
    assert got == [f"m{i}".encode() for i in range(6, 12)]
    assert_views(db, q, 11)
    leased = run_transaction(db, lambda tr: q.get(tr, kept_id))
    assert leased is not None and leased.payload == b"m5"
    q.enqueue(db, b"new")
    m = take(db, q)
    assert m is not None and m.payload == b"new"
    assert_views(db, q, 12)
    db.close()


def test_conflicting_takes_on_sim_leave_no_drift_and_no_taken_counter() -> None:
    """sim:// conflicts as FoundationDB does: the short step never runs there (nothing is
    kept), every take counts in ready and done, and they equal the records after pairs of
    dequeues and leases in callers' transactions collided on the same head (one commits, the
    other is refused and tried again), and dequeues in their own transactions."""
    db = fdbqueue.open("sim://?seed=17&faults=0")
    q = Queue("jobs")
    n = 60
    q.enqueue_many(db, [f"m{i}".encode() for i in range(n)])
    got: list[bytes] = []
    refused = 0
    for i in range(n):
        first, second = db.create_transaction(), db.create_transaction()
        m1 = q.dequeue(first) if i % 2 else q.lease(first)
        m2 = q.dequeue(second)
        if m1 is None and m2 is None:
            break
        assert m1 is not None and m2 is not None and m1.id == m2.id  # the same head
        first.commit()
        got.append(m1.payload)
        if i % 2 == 0:
            q.ack(db, m1)
        with pytest.raises(EngineError):
            second.commit()
        refused += 1
        second.cancel()
        m = q.dequeue(db) if i % 3 == 0 else None  # its own transaction, between
        if m is not None:
            got.append(m.payload)
    assert refused > 0
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(n))
    assert run_transaction(db, lambda tr: tr.get(q.keys.counter("taken"))) is None
    assert (raw(db, q, "ready"), raw(db, q, "done")) == (0, n)
    assert_views(db, q, n)
