"""A head kept between transactions: what a dequeue or lease learned of the ready set, used by
the next one without reading the range again, and every way the ready set can change under it.

The kept run (``fdbqueue.ops.head``) is trusted only after the transaction that read it
committed, and only while the queue's ready and wake counters, read with the metadata as every
dequeue reads them, are what that commit left: every message made ready adds to the wake
counter and every message leaving the ready set subtracts from the ready one. Each test here
changes the ready set another way and checks that no message is handed out twice, none is
skipped, priorities hold and a removed message is never delivered.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database, Transaction
from tests.support.sqlite_files import traced


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Database]:
    database = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    yield database
    database.close()


def range_reads(db: Database, call: Callable[[], Any]) -> tuple[list[str], Any]:
    """The range SELECTs ``call()`` runs on ``db``'s connection (a head read is one)."""
    statements, got = traced(db, call)
    return [s for s in statements if s.startswith("SELECT") and "ORDER BY k" in s], got


def filled(db: Database, n: int = 20) -> Queue:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(n)])
    return q


@fdbqueue.transactional
def take(tr: Transaction, q: Queue) -> fdbqueue.Message | None:
    return q.dequeue(tr)


def payloads(ms: list[fdbqueue.Message | None]) -> list[bytes]:
    return [m.payload for m in ms if m is not None]


def test_a_consumer_alone_reads_the_ready_range_once_in_several_dequeues(embedded: Database) -> None:
    """The steady state: the dequeues after the first take their head from what the one before
    read (no range SELECT), the counters exact, FIFO kept."""
    q = filled(embedded)
    got = [take(embedded, q) for _ in range(3)]
    reads, more = range_reads(embedded, lambda: [take(embedded, q) for _ in range(5)])
    assert len(reads) <= 1, reads
    assert payloads(got + more) == [f"m{i}".encode() for i in range(8)]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.done) == (12, 8)


def test_leases_alone_read_the_ready_range_once_in_several(embedded: Database) -> None:
    """A lease and its ack, turn after turn (nothing in flight at a lease: no lease index to
    look at): the leases after the first take their head from what the one before read."""
    q = filled(embedded)
    ms: list[fdbqueue.Message | None] = []

    def turn() -> None:
        m = q.lease(embedded)
        assert m is not None
        ms.append(m)
        q.ack(embedded, m)

    turn()
    turn()
    reads, _ = range_reads(embedded, lambda: [turn() for _ in range(5)])
    assert len(reads) <= 1, reads
    assert payloads(ms) == [f"m{i}".encode() for i in range(7)]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (13, 0, 7)


def test_another_consumer_taking_the_head_in_between_is_seen(embedded: Database) -> None:
    """Two handles (as two processes) take turns: every message once, in order."""
    q = filled(embedded)
    other = fdbqueue.open(embedded.url)  # type: ignore[attr-defined]
    try:
        seen: list[fdbqueue.Message | None] = []
        for i in range(20):
            if i % 3 == 2:
                seen.append(take(other, q))
            elif i % 3 == 1:
                m = q.lease(other)
                seen.append(m)
                assert m is not None
                q.ack(other, m)
            else:
                seen.append(take(embedded, q))
        assert payloads(seen) == [f"m{i}".encode() for i in range(20)]
        assert take(embedded, q) is None
    finally:
        other.close()


def test_the_same_handles_other_queue_object_taking_the_head_is_seen(embedded: Database) -> None:
    q = filled(embedded)
    twin = Queue("jobs")
    seen = [
        take(embedded, q),
        take(embedded, twin),
        take(embedded, q),
        q.lease(embedded),
        take(embedded, twin),
    ]
    assert payloads(seen) == [f"m{i}".encode() for i in range(5)]


def test_a_priority_enqueued_by_another_handle_comes_first(embedded: Database) -> None:
    q = filled(embedded)
    assert payloads([take(embedded, q), take(embedded, q)]) == [b"m0", b"m1"]
    other = fdbqueue.open(embedded.url)  # type: ignore[attr-defined]
    try:
        Queue("jobs").enqueue(other, b"urgent", priority=9)
    finally:
        other.close()
    assert payloads([take(embedded, q)]) == [b"urgent"]
    m = q.lease(embedded)
    assert m is not None and m.payload == b"m2"
    Queue("jobs").enqueue(embedded, b"urgent2", priority=5)
    m2 = q.lease(embedded)
    assert m2 is not None and m2.payload == b"urgent2"
    assert payloads([take(embedded, q)]) == [b"m3"]


def test_a_delay_coming_due_with_no_commit_comes_first(embedded: Database) -> None:
    q = Queue("jobs")
    q.enqueue(embedded, b"later", priority=9, delay=1.0)  # (long enough for a loaded machine)
    q.enqueue_many(embedded, [f"m{i}".encode() for i in range(10)])
    assert payloads([take(embedded, q), take(embedded, q)]) == [b"m0", b"m1"]
    time.sleep(1.1)  # nobody commits meanwhile: only time makes it ready
    assert payloads([take(embedded, q)]) == [b"later"]
    assert payloads([take(embedded, q)]) == [b"m2"]


def test_an_expired_lease_coming_back_comes_first(embedded: Database) -> None:
    q = filled(embedded, 10)
    held = q.lease(embedded, 1.0)  # (long enough for a loaded machine)
    assert held is not None and held.payload == b"m0"
    assert payloads([q.lease(embedded), take(embedded, q)]) == [b"m1", b"m2"]
    time.sleep(1.1)
    back = q.lease(embedded)
    assert back is not None and back.payload == b"m0" and back.deliveries == 2
    assert payloads([take(embedded, q)]) == [b"m3"]


def test_a_purge_leaves_nothing_to_hand_out(embedded: Database) -> None:
    q = filled(embedded)
    assert payloads([take(embedded, q), q.lease(embedded)]) == [b"m0", b"m1"]
    fdbqueue.purge_queue(embedded, "jobs")
    assert take(embedded, q) is None
    assert q.lease(embedded) is None
    q.enqueue(embedded, b"fresh")
    assert payloads([take(embedded, q)]) == [b"fresh"]


def test_a_message_deleted_after_the_head_was_read_is_never_delivered(embedded: Database) -> None:
    q = filled(embedded, 10)
    m0 = take(embedded, q)
    assert m0 is not None
    ids = [m.id for m in q.browse(embedded)]
    assert q.delete(embedded, ids[0])  # m1, the kept head
    assert payloads([take(embedded, q)]) == [b"m2"]
    assert q.delete(embedded, ids[2])  # m3
    m = q.lease(embedded)
    assert m is not None and m.payload == b"m4"


def test_a_delete_and_an_enqueue_in_one_transaction_are_both_seen(embedded: Database) -> None:
    """The ready count left as it was (one out, one in): the wake counter tells."""
    q = filled(embedded, 10)
    assert payloads([take(embedded, q)]) == [b"m0"]
    ids = [m.id for m in q.browse(embedded)]

    @fdbqueue.transactional
    def swap(tr: Transaction) -> None:
        assert q.delete(tr, ids[0])  # m1
        q.enqueue(tr, b"urgent", priority=3)

    swap(embedded)
    assert payloads([take(embedded, q), take(embedded, q)]) == [b"urgent", b"m2"]


def test_an_aborted_dequeue_gives_its_message_back_to_the_next(embedded: Database) -> None:
    q = filled(embedded, 10)
    assert payloads([take(embedded, q)]) == [b"m0"]

    class Boom(Exception):
        pass

    @fdbqueue.transactional
    def failing(tr: Transaction) -> None:
        m = q.dequeue(tr)
        assert m is not None and m.payload == b"m1"
        raise Boom

    with pytest.raises(Boom):
        failing(embedded)
    again = take(embedded, q)
    assert again is not None and again.payload == b"m1"
    assert payloads([take(embedded, q)]) == [b"m2"]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.done) == (7, 3)


def test_a_callers_writes_around_the_dequeue_are_seen(embedded: Database) -> None:
    q = filled(embedded, 10)
    assert payloads([take(embedded, q)]) == [b"m0"]

    @fdbqueue.transactional
    def then_enqueue(tr: Transaction) -> fdbqueue.Message | None:
        m = q.dequeue(tr)
        q.enqueue(tr, b"after", priority=2)
        return m

    @fdbqueue.transactional
    def enqueue_then(tr: Transaction) -> fdbqueue.Message | None:
        q.enqueue(tr, b"before", priority=4)
        return q.dequeue(tr)

    @fdbqueue.transactional
    def two(tr: Transaction) -> list[fdbqueue.Message | None]:
        return [q.dequeue(tr), q.dequeue(tr)]

    assert payloads([then_enqueue(embedded)]) == [b"m1"]
    assert payloads([take(embedded, q)]) == [b"after"]
    assert payloads([enqueue_then(embedded)]) == [b"before"]
    assert payloads(two(embedded)) == [b"m2", b"m3"]
    assert payloads([take(embedded, q), q.lease(embedded)]) == [b"m4", b"m5"]


def test_a_nack_puts_the_message_back_ahead_of_the_kept_head(embedded: Database) -> None:
    q = filled(embedded, 10)
    m = q.lease(embedded)
    assert m is not None and m.payload == b"m0"
    assert payloads([take(embedded, q)]) == [b"m1"]
    assert q.nack(embedded, m, delay=0) == "ready"
    back = q.lease(embedded)
    assert back is not None and back.payload == b"m0"
    q.release(embedded, back)
    assert payloads([take(embedded, q), take(embedded, q)]) == [b"m0", b"m2"]


def test_an_expired_kept_head_is_moved_aside_not_delivered(embedded: Database) -> None:
    q = Queue("jobs")
    q.enqueue(embedded, b"m0")
    q.enqueue(embedded, b"short", ttl=0.3)
    q.enqueue(embedded, b"m2")
    assert payloads([take(embedded, q)]) == [b"m0"]
    time.sleep(0.4)
    assert payloads([take(embedded, q)]) == [b"m2"]
    assert take(embedded, q) is None


def test_counters_written_as_read_stay_exact_in_a_callers_transaction(embedded: Database) -> None:
    """Acks, leases and dequeues in one transaction each read the counters through the writes
    before them: the counts after are what adds would have left."""
    q = filled(embedded, 10)
    a, b = q.lease(embedded), q.lease(embedded)
    assert a is not None and b is not None

    @fdbqueue.transactional
    def mixed(tr: Transaction) -> list[fdbqueue.Message]:
        q.ack(tr, a)
        got = [q.dequeue(tr), q.dequeue(tr)]
        q.ack(tr, b)
        got += q.lease_many(tr, 2)
        q.enqueue(tr, b"new")
        got.append(q.dequeue(tr))
        return [m for m in got if m is not None]

    got = mixed(embedded)
    assert [m.payload for m in got] == [b"m2", b"m3", b"m4", b"m5", b"m6"]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (4, 2, 5)
    assert q.ack_many(embedded, got[2:4]) == got[2:4]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (4, 0, 7)


def test_what_a_process_keeps_is_bounded_however_many_queues_it_takes_from(embedded: Database) -> None:
    # A kept run holds up to KEPT_BYTES of values a (handle, queue): a process taking from
    # thousands of queues with large messages must not hold thousands of them.
    from fdbqueue.ops import head

    names = [f"q{i}" for i in range(head.KEPT_QUEUES + 20)]
    for name in names:
        fdbqueue.create_queue(embedded, name)
        Queue(name).enqueue_many(embedded, [b"x" * 1000] * 3)
    for name in names:
        assert Queue(name).dequeue(embedded) is not None
    assert 0 < len(head._kept) <= head.KEPT_QUEUES
    # the newest are the ones kept: the last queue's next dequeue reads no range
    reads, got = range_reads(embedded, lambda: Queue(names[-1]).dequeue(embedded))
    assert got is not None and reads == []


def test_a_run_kept_again_take_after_take_survives_aborts_and_retries_between(embedded: Database) -> None:
    """A run read once serves take after take (its entry kept again with its rest each time):
    a take from it whose transaction aborts, one whose first attempt fails with a retryable
    error and runs again, and a lease from it that aborts each give their message to the next
    take, and the run is read afresh after them; every message once, in order, counts exact."""
    from fdbqueue.errors import EngineError

    q = filled(embedded, 20)
    got = [take(embedded, q) for _ in range(3)]  # m0 read with m1..m7; m1, m2 from the kept run

    class Boom(Exception):
        pass

    @fdbqueue.transactional
    def failing(tr: Transaction) -> None:
        m = q.dequeue(tr)
        assert m is not None and m.payload == b"m3"
        raise Boom

    with pytest.raises(Boom):
        failing(embedded)
    attempts: list[bytes] = []

    @fdbqueue.transactional
    def retried(tr: Transaction) -> fdbqueue.Message | None:
        m = q.dequeue(tr)
        assert m is not None
        attempts.append(m.payload)
        if len(attempts) == 1:
            raise EngineError(1020)  # not_committed: the decorator runs it again
        return m

    got += [take(embedded, q), retried(embedded), take(embedded, q)]
    assert attempts == [b"m4", b"m4"]
    # The aborted take counted as a failed delivery (poison handling); the attempt the
    # decorator ran again (1020): not (as before).
    assert [m.deliveries for m in got[3:5] if m is not None] == [2, 1]

    @fdbqueue.transactional
    def lease_then_fail(tr: Transaction) -> None:
        m = q.lease(tr)
        assert m is not None and m.payload == b"m6"
        raise Boom

    with pytest.raises(Boom):
        lease_then_fail(embedded)
    m = q.lease(embedded)
    assert m is not None and m.payload == b"m6" and m.deliveries == 1
    q.ack(embedded, m)
    got += [take(embedded, q) for _ in range(4)]
    assert payloads(got) == [f"m{i}".encode() for i in (0, 1, 2, 3, 4, 5, 7, 8, 9, 10)]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.inflight, st.done) == (9, 0, 11)


def test_a_dequeue_that_finds_its_kept_run_out_of_date_twice_keeps_nothing_through_the_pause(
    tmp_path: Path, embedded: Database
) -> None:
    """Another handle dequeues between this handle's dequeues (contention: another process in
    the field, as four draining processes are). Found out of date once, the run is read and
    kept again (a consumer alone meets that after its own lease_many or release); found out of
    date again by the next take, keeping pauses (head.KEPT_PAUSE takes), as a lease's does.
    Over the pause each dequeue reads the head alone (one record, not a run of KEPT_RUN) and
    keeps no run, so that no take pays for a run the other handle's next take makes stale;
    every message once, in order, the counts exact."""
    from fdbqueue.ops.head import KEPT_PAUSE, kept_paused

    q = filled(embedded, 40)
    assert payloads([take(embedded, q) for _ in range(2)]) == [b"m0", b"m1"]  # a run kept (m2 ...)
    other = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        assert payloads([take(other, q)]) == [b"m2"]
        assert payloads([take(embedded, q)]) == [b"m3"]  # out of date once: a run kept again
        assert not kept_paused(embedded, q.keys)
        assert payloads([take(other, q)]) == [b"m4"]
        assert payloads([take(embedded, q)]) == [b"m5"]  # out of date twice in a row: paused
        assert kept_paused(embedded, q.keys)
        reads, got = range_reads(embedded, lambda: [take(embedded, q) for _ in range(KEPT_PAUSE - 2)])
        assert payloads(got) == [f"m{i}".encode() for i in range(6, 6 + KEPT_PAUSE - 2)]
        assert kept_paused(embedded, q.keys)  # still paused: no run kept over it
        assert len(reads) == KEPT_PAUSE - 2 and all(s.endswith("LIMIT 1") for s in reads), reads
    finally:
        other.close()
    rest = payloads([take(embedded, q) for _ in range(40 - 6 - (KEPT_PAUSE - 2))])
    assert rest == [f"m{i}".encode() for i in range(6 + KEPT_PAUSE - 2, 40)]
    st = fdbqueue.queue_stats(embedded, "jobs")
    assert (st.ready, st.done) == (0, 40)
