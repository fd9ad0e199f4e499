"""The counted counter: the embedded engine's common enqueue (ops/enqueuing.py ``_plain_step``)
counts a message in one key, ``wake``, instead of the ready and wake counters; every other writer
of wake adds to ``counted`` too where it is present (moves.count_made_ready), so that every reader
takes the ready count as ready - taken + (wake - counted) (store/layout.py ``ready_count``). These
tests hold every view to the records it counts after short enqueues mixed with every other way a
message comes in, leaves or comes back, another handle's kept run to the enqueues it did not see,
a store written before the key existed to what it holds, and the engines that never take the
short way to no counted counter at all."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue, create_queue, move, purge_queue, queue_stats
from fdbqueue.api.admin import set_state
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import QueueFullError
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.layout import READY_PARTS, ready_count
from fdbqueue.store.meta import read_meta
from tests.support.old_code import run_old

OLD = "e3bc553"  # main before the counted counter: its stores have no such key
ROOT = Path(__file__).resolve().parents[2]


def open_file(tmp_path: Path, name: str = "q.db") -> Database:
    return fdbqueue.open(f"sqlite://{tmp_path / name}?sync=normal")


@fdbqueue.transactional
def take(tr: Transaction, q: Queue) -> fdbqueue.Message | None:
    """A dequeue in the caller's transaction: the short take's case."""
    return q.dequeue(tr)


def stored(db: Database, q: Queue, name: str) -> bytes | None:
    return run_transaction(db, lambda tr: tr.get(q.keys.counter(name)))


def raw(db: Database, q: Queue, name: str) -> int:
    return unpack_count(stored(db, q, name))


def records(db: Database, q: Queue) -> tuple[int, int, int]:
    """(ready, leased, delayed) messages as stored: the keys a scan finds."""

    def count(tr: Transaction) -> tuple[int, ...]:
        ranges = [q.keys.q.range((tag,)) for tag in ("r", "f", "d")]
        return tuple(len(tr.get_range(r.start, r.stop)) for r in ranges)

    got = run_transaction(db, count)
    return got[0], got[1], got[2]


def assert_views(db: Database, q: Queue) -> None:
    """Every view of the counts (stats, size, the metadata every operation reads, the stored
    counters by the formula, unclamped) equals the records."""
    ready, leased, delayed = records(db, q)
    st = queue_stats(db, q.name)
    assert (st.ready, st.inflight, st.delayed) == (ready, leased, delayed), st
    assert q.size(db) == ready
    meta = run_transaction(db, lambda tr: read_meta(tr, q.keys))
    assert (meta.count("ready"), meta.count("inflight"), meta.count("delayed")) == (ready, leased, delayed)
    assert meta.counters["ready"] == ready
    parts = [stored(db, q, c) for c in READY_PARTS]
    assert ready_count(*parts) == ready
    counted = parts[3]
    apart = raw(db, q, "wake") - unpack_count(counted) if counted is not None else 0
    assert raw(db, q, "ready") - raw(db, q, "taken") + apart == ready  # not clamped at 0


def short_enqueue(db: Database, q: Queue, payload: bytes) -> None:
    """An enqueue that takes the short step: the ready counter is left as it is."""
    before = stored(db, q, "ready")
    q.enqueue(db, payload)
    assert stored(db, q, "ready") == before, "the short step counted in wake alone"


def test_every_view_counts_short_enqueues_among_every_other_writer(tmp_path: Path) -> None:
    db = open_file(tmp_path)
    create_queue(db, "jobs", max_deliveries=2, retry_delay=0.0)
    create_queue(db, "elsewhere")
    q, elsewhere = Queue("jobs"), Queue("elsewhere")
    q.enqueue(db, b"first")  # the priority's marker: the long way
    q.enqueue(db, b"second")  # the settings at the marker's metadata version: the long way
    assert stored(db, q, "counted") is None
    q.enqueue(db, b"third")  # the first short one of the queue: it writes counted
    assert stored(db, q, "counted") == stored(db, q, "wake")
    for i in range(6):
        short_enqueue(db, q, f"s{i}".encode())
    assert raw(db, q, "wake") - raw(db, q, "counted") == 6
    assert_views(db, q)
    # the long ways: enqueue_many, a new priority, options, a delayed message
    q.enqueue_many(db, [b"many 1", b"many 2"])
    q.enqueue(db, b"high", priority=5)
    q.enqueue(db, b"headers", headers={"k": "v"})
    q.enqueue(db, b"later", delay=0.05)
    assert raw(db, q, "wake") - raw(db, q, "counted") == 6, "every other writer kept counted in step"
    assert_views(db, q)
    short_enqueue(db, q, b"s6")
    # takes (short and long), leases, an ack, a nack and a release back to ready
    assert take(db, q) is not None and take(db, q) is not None
    assert q.dequeue(db) is not None
    a, b, c = q.lease(db), q.lease(db), q.lease(db)
    assert a is not None and b is not None and c is not None
    assert_views(db, q)
    q.ack(db, a)
    assert q.nack(db, b, delay=0.0) == "ready"
    q.release(db, c)
    short_enqueue(db, q, b"s7")
    assert_views(db, q)
    # the delayed message promoted when due, dead-lettering, a TTL run out
    time.sleep(0.06)
    assert take(db, q) is not None
    assert_views(db, q)
    dead = queue_stats(db, "jobs").dead
    for _ in range(2):  # a message nacked twice goes to the error queue (max_deliveries 2)
        m = q.lease(db)
        assert m is not None
        q.nack(db, m, delay=0.0, reason="no")
    assert queue_stats(db, "jobs").dead > dead
    short_enqueue(db, q, b"s8")
    assert_views(db, q)
    # Enqueued after the leases above, not before them: ahead of everything (priority 9), it
    # would be what they lease whenever they run within its 1 ms (a fast machine), and never
    # expire.
    q.enqueue(db, b"short-lived", ttl=0.001, priority=9)
    time.sleep(0.01)
    assert take(db, q) is not None  # the expired one is moved aside on the way
    assert queue_stats(db, "jobs").expired == 1
    assert_views(db, q)
    # dequeue paused and enabled again: wake moves, no message made ready
    set_state(db, "jobs", dequeue=False)
    set_state(db, "jobs", dequeue=True)
    assert_views(db, q)
    short_enqueue(db, q, b"s9")
    # moved to another queue (its own counters), and back
    assert move(db, "jobs", "elsewhere", limit=3) == 3
    assert_views(db, q)
    assert_views(db, elsewhere)
    assert move(db, "elsewhere", "jobs", limit=1) == 1
    assert_views(db, q)
    # purge: counted cleared, the ready count from zero again; the short step writes it anew
    held = records(db, q)
    assert purge_queue(db, "jobs") == sum(held)
    assert stored(db, q, "counted") is None and raw(db, q, "ready") == 0
    assert_views(db, q)
    q.enqueue(db, b"x")  # the priority's marker again: the long way
    q.enqueue(db, b"y")  # the settings at the marker's version: the long way
    q.enqueue(db, b"z")  # counted written anew
    assert stored(db, q, "counted") == stored(db, q, "wake")
    short_enqueue(db, q, b"w")
    assert_views(db, q)
    got = []
    while (m := take(db, q)) is not None:
        got.append(m.payload)
    assert got == [b"x", b"y", b"z", b"w"]
    assert_views(db, q)
    db.close()


def test_a_purge_counts_the_short_enqueues(tmp_path: Path) -> None:
    db = open_file(tmp_path)
    q = Queue("jobs")
    for p in (b"a", b"b", b"c", b"d", b"e"):
        q.enqueue(db, p)
    assert raw(db, q, "ready") == 3  # the long way's two and the first short one's
    assert take(db, q) is not None
    assert purge_queue(db, "jobs") == 4
    assert (queue_stats(db, "jobs").ready, q.size(db)) == (0, 0)
    db.close()


def test_a_full_queue_counts_the_short_enqueues_made_before_its_bound(tmp_path: Path) -> None:
    db = open_file(tmp_path)
    q = Queue("jobs")
    for i in range(5):
        q.enqueue(db, f"m{i}".encode())
    assert raw(db, q, "ready") == 3, "two short enqueues in wake alone"
    create_queue(db, "jobs", max_size=7)  # a bound: every enqueue takes the long way now
    q.enqueue(db, b"n0")
    q.enqueue(db, b"n1")
    with pytest.raises(QueueFullError):
        q.enqueue(db, b"one too many")
    assert q.size(db) == 7
    assert take(db, q) is not None
    q.enqueue(db, b"n2")  # room for one
    with pytest.raises(QueueFullError):
        q.enqueue(db, b"one too many")
    assert_views(db, q)
    db.close()


def test_another_handles_short_enqueues_put_a_kept_run_out_of_date(tmp_path: Path) -> None:
    """Two handles on one store: b's short enqueues write only the wake counter; a's kept run
    (its take and its lease) must see the ready set changed, and the counts stay exact. (A
    process keeps one handle's settings a queue: a handle's first enqueue after the other's
    operation takes the long way, its second the short step.)"""
    a, b = open_file(tmp_path), open_file(tmp_path)
    q = Queue("jobs")
    q.enqueue_many(a, [f"m{i:02}".encode() for i in range(10)])
    warm = [b"warm b", b"warm a", b"warm a2"]  # each handle's settings; a2 writes counted
    for db, payload in zip((b, a, a), warm, strict=True):
        q.enqueue(db, payload)
    assert stored(a, q, "counted") == stored(a, q, "wake")
    want = [f"m{i:02}".encode() for i in range(10)] + warm
    seen: list[bytes] = []
    leased: list[fdbqueue.Message] = []
    for i in range(30):
        h = b if i % 3 else a
        q.enqueue(h, f"n{i:02}a".encode())
        short_enqueue(h, q, f"n{i:02}b".encode())
        want += [f"n{i:02}a".encode(), f"n{i:02}b".encode()]
        db = (a, b, a)[i % 3]
        got = q.lease(db) if i % 4 == 3 else take(db, q)
        if got is not None:
            seen.append(got.payload)
            if i % 4 == 3:
                leased.append(got)
        assert_views(a, q)
    for m in leased:
        q.ack(a, m)
    while (m := take(b, q)) is not None:
        seen.append(m.payload)
    assert seen == want, "a message out of order, twice or lost"
    assert_views(a, q)
    a.close()
    b.close()


_OLD_WRITER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    from fdbqueue import Queue

    db = fdbqueue.open(sys.argv[1])
    q = Queue("jobs")
    q.enqueue_many(db, [b"m%d" % i for i in range(6)])
    for i in range(6, 12):
        q.enqueue(db, b"m%d" % i)  # the old short step: ready and wake

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


def test_a_store_written_before_the_counted_counter_is_read_exactly_and_served_once(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    kept_id = run_old(tmp_path, OLD, _OLD_WRITER, url).strip()
    db = fdbqueue.open(url)
    q = Queue("jobs")
    assert stored(db, q, "counted") is None, "an old store"
    st = queue_stats(db, "jobs")
    assert (st.ready, st.inflight, st.done) == (6, 1, 5), st
    assert_views(db, q)
    q.enqueue(db, b"new 1")  # the first short enqueue of an old queue: counted from here on
    assert stored(db, q, "counted") == stored(db, q, "wake")
    short_enqueue(db, q, b"new 2")
    assert_views(db, q)
    got = []
    while (m := take(db, q)) is not None:
        got.append(m.payload)
    assert got == [*(f"m{i}".encode() for i in range(6, 12)), b"new 1", b"new 2"]
    assert_views(db, q)
    leased = run_transaction(db, lambda tr: q.get(tr, kept_id))
    assert leased is not None and leased.payload == b"m5"
    db.close()


def test_sim_never_writes_a_counted_counter() -> None:
    """sim:// conflicts as FoundationDB does: the short step never runs there, every enqueue
    counts in ready and wake, and no counted counter is ever written (nor read)."""
    db = fdbqueue.open("sim://?seed=17&faults=0")
    check_no_counted(db)
    db.close()


def test_fdb_never_writes_a_counted_counter(fdb_db: Database) -> None:
    """fdb:// (a real cluster's store, or the double's): no new key a message, as on sim://."""
    check_no_counted(fdb_db)


def check_no_counted(db: Database) -> None:
    q = Queue("jobs")
    for i in range(5):
        q.enqueue(db, f"m{i}".encode())
    q.enqueue_many(db, [b"many 1", b"many 2"])
    m = q.lease(db)
    assert m is not None
    q.release(db, m)
    assert take(db, q) is not None
    assert stored(db, q, "counted") is None
    assert (raw(db, q, "ready"), raw(db, q, "wake")) == (6, 8)
    assert_views(db, q)
