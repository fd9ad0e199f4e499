"""A lease batch and an ack batch do what a batch shares once (issue 30, sixth pass, second
round): ``leasing.lease_heads`` makes the deadline, ``until``, the lease entries' prefix and the
queue's settings once a batch (``moves.put_leased_batch`` writes them); ``ack_many_in`` takes
the records and keys of this process's own leases as they were written, checks their deadline,
and clears the plain ones in one ``moves.end_leases`` call. Each test changes what those steps
lean on - a lease taken over by another process, ended, aborted, nacked or dead-lettered; a TTL,
chunks, a journal, strict order, an id away from home - and checks that the batch acts as one
message at a time would.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Database, Queue, create_queue, queue_stats
from fdbqueue.engines.contract import Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.ops.txn import run_once
from fdbqueue.store.budget import Budget


def _left(db: Database, tag: str, queue: str = "jobs") -> int:
    r = Queue(queue).keys.q.range((tag,))
    return int(run_once(db, lambda t, _: len(t.get_range(r.start, r.stop, 1000))))


def _counts(db: Database, queue: str = "jobs") -> tuple[int, int, int]:
    st = queue_stats(db, queue)
    return st.ready, st.inflight, st.done


def test_a_batch_leases_each_message_until_one_deadline_and_acks_them_all(db: Database) -> None:
    q = Queue("jobs")
    ids = q.enqueue_many(db, [f"m{i}" for i in range(20)])
    ms = q.lease_many(db, 20, 30)
    assert [m.id for m in ms] == ids
    assert len({m.receipt for m in ms}) == 20
    assert len({m.lease_deadline for m in ms}) == 1  # one batch, one deadline
    assert all(m.deliveries == 1 and m.expires_at is None for m in ms)
    assert [m.payload for m in ms] == [f"m{i}".encode() for i in range(20)]
    assert (_left(db, "f"), _left(db, "l"), _counts(db)) == (20, 20, (0, 20, 0))
    assert q.ack_many(db, ms) == ms
    assert (_left(db, "f"), _left(db, "l"), _counts(db)) == (0, 0, (0, 0, 20))


def test_a_ttl_messages_lease_clears_its_ttl_entry_and_shows_when_it_expires(db: Database) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"plain")
    q.enqueue(db, b"ttl", ttl=60.0)
    assert _left(db, "x") == 1
    ms = q.lease_many(db, 2, 30)
    assert [m.payload for m in ms] == [b"plain", b"ttl"]
    assert ms[0].expires_at is None
    assert ms[1].expires_at is not None and ms[1].expires_at > time.time() + 30
    assert _left(db, "x") == 0  # a lease ends before the TTL matters (put_leased_batch)
    assert q.ack_many(db, ms) == ms
    assert (_left(db, "f"), _left(db, "l"), _left(db, "x")) == (0, 0, 0)


def test_a_chunked_message_in_a_batch_is_leased_whole_and_its_chunks_go_with_its_ack(db: Database) -> None:
    q = Queue("jobs")
    big = bytes(range(256)) * 200  # chunked
    q.enqueue_many(db, [b"a", big, b"c"])
    assert _left(db, "b") > 0
    ms = q.lease_many(db, 3, 30)
    assert [m.payload for m in ms] == [b"a", big, b"c"]
    assert q.ack_many(db, ms) == ms
    assert (_left(db, "b"), _left(db, "f"), _left(db, "l")) == (0, 0, 0)


def test_a_journaled_queues_batch_journals_each_lease_and_ack(db: Database) -> None:
    create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    ids = q.enqueue_many(db, ["a", "b", "c"])
    ms = q.lease_many(db, 3, 30)
    assert q.ack_many(db, ms) == ms
    entries = [e for e in fdbqueue.journal(db, "jobs") if e.message_id is not None]
    assert [(e.op, e.message_id) for e in entries] == [
        *[("enqueue", i) for i in ids],
        *[("lease", i) for i in ids],
        *[("ack", i) for i in ids],
    ]


def test_a_strict_queues_ack_in_a_batch_wakes_the_next_delivery(db: Database) -> None:
    create_queue(db, "jobs", strict_order=True)
    q = Queue("jobs")
    q.enqueue_many(db, ["a", "b"])
    ms = q.lease_many(db, 2, 30)
    assert [m.payload for m in ms] == [b"a"]  # one in flight at a time
    assert q.lease(db) is None
    wake = q.keys.wake
    before = run_transaction(db, lambda tr: tr.get(wake))
    assert q.ack_many(db, ms) == ms
    assert run_transaction(db, lambda tr: tr.get(wake)) != before  # blocked consumers woken
    m = q.lease(db)
    assert m is not None and m.payload == b"b"


def test_messages_away_from_home_leave_no_id_entry_behind(db: Database) -> None:
    """An autonomous enqueue's id is made before its place (an id entry points at it): its
    lease clears that entry (put_leased's), the others have none."""
    q = Queue("jobs")

    @fdbqueue.transactional
    def autonomous(tr: Transaction, payload: bytes) -> str:
        return q.enqueue(tr, payload, autonomous=True)

    ids = [autonomous(db, b"away0"), *q.enqueue_many(db, ["home"]), autonomous(db, b"away1")]
    assert _left(db, "id") == 2
    ms = q.lease_many(db, 3, 30)
    assert [m.id for m in ms] == ids
    assert _left(db, "id") == 0
    assert q.ack_many(db, ms) == ms
    assert [q.get(db, i) for i in ids] == [None] * 3


def test_an_ended_lease_in_a_batch_is_left_out_and_not_counted(db: Database) -> None:
    q = Queue("jobs")
    q.enqueue_many(db, ["a", "b", "c"])
    ms = q.lease_many(db, 3, 0.3)
    time.sleep(0.5)  # every lease ends (database time; nothing timed is asserted)
    assert q.ack_many(db, ms) == []
    assert _counts(db)[2] == 0  # nothing counted done
    q.sweep(db)
    again = q.lease_many(db, 3, 30)
    assert sorted(m.id for m in again) == sorted(m.id for m in ms)  # every one came back
    assert all(m.deliveries == 2 for m in again)


def test_a_nack_and_a_dead_letter_in_a_batch_are_left_out(db: Database) -> None:
    create_queue(db, "jobs", max_deliveries=1, retry_delay=0.0)
    q = Queue("jobs")
    q.enqueue_many(db, ["a", "b", "c"])
    ms = q.lease_many(db, 3, 30)
    q.nack(db, ms[1])  # its first and last delivery: dead-lettered
    assert q.ack_many(db, ms) == [ms[0], ms[2]]
    assert _counts(db) == (0, 0, 2)
    dead = Queue("jobs.error").dequeue(db)
    assert dead is not None and dead.id == ms[1].id


def test_an_aborted_batch_lease_and_an_aborted_batch_ack_change_nothing(db: Database) -> None:
    """A lease batch whose transaction never lands leaves this process holding leases that are
    not the store's: the same messages leased again (other receipts) are not acked through the
    old ones, and an ack batch whose transaction never lands acks them again."""
    q = Queue("jobs")
    q.enqueue_many(db, ["a", "b", "c"])
    tr = db.create_transaction()
    lost = q.lease_many(tr, 3, 30)
    tr.cancel()
    ms = q.lease_many(db, 3, 30)
    assert [m.id for m in ms] == [m.id for m in lost]
    assert q.ack_many(db, lost) == []  # not leased under those receipts
    assert _counts(db) == (0, 3, 0)
    tr = db.create_transaction()
    assert q.ack_many(tr, ms) == ms
    tr.cancel()
    assert _counts(db) == (0, 3, 0)
    assert q.ack_many(db, ms) == ms
    assert (_left(db, "f"), _left(db, "l"), _counts(db)) == (0, 0, (0, 0, 3))


_OTHER = """
import sys
import fdbqueue
from fdbqueue import ContentType, Message, Queue
db = fdbqueue.open(sys.argv[1])
m = Message(sys.argv[3], b"", "jobs", 0, 0.0, 1, {}, ContentType.TEXT, receipt=sys.argv[4])
q = Queue("jobs")
if sys.argv[2] == "ack":
    assert q.ack_many(db, [m]) == [m]
else:
    q.nack(db, m)
db.close()
"""


@pytest.mark.parametrize("what", ["ack", "nack"])
def test_a_lease_settled_by_another_process_is_left_out_of_the_batch(tmp_path: Path, what: str) -> None:
    url = f"sqlite:///{tmp_path}/q.db"
    db = fdbqueue.open(url)
    try:
        q = Queue("jobs")
        q.enqueue_many(db, ["a", "b", "c"])
        ms = q.lease_many(db, 3, 30)
        other = [sys.executable, "-c", _OTHER, url, what, ms[1].id, str(ms[1].receipt)]
        subprocess.run(other, check=True, timeout=120)
        assert q.ack_many(db, ms) == [ms[0], ms[2]]
        if what == "ack":
            assert (_left(db, "f"), _left(db, "l"), _counts(db)) == (0, 0, (0, 0, 3))
        else:  # back in the ready set, leased again under a new receipt
            assert (_left(db, "f"), _left(db, "l"), _counts(db)) == (0, 0, (1, 0, 2))
            m = q.lease(db)
            assert m is not None and m.id == ms[1].id and m.deliveries == 2
            assert q.ack_many(db, [ms[1]]) == []  # the old receipt acks nothing
            assert q.ack_many(db, [m]) == [m]
    finally:
        db.close()


def test_a_batch_over_several_priorities_gives_each_message_its_own(db: Database) -> None:
    """The priorities of a batch are decoded once a run of one priority (``priorities_of``)."""
    q = Queue("jobs")
    wanted = [300, 300, 7, 0, 0, -1, -255, -256, -70000]
    for i, p in enumerate(wanted):
        q.enqueue(db, f"p{i}".encode(), priority=p)
    ms = q.lease_many(db, len(wanted), 30)
    assert [(m.payload, m.priority) for m in ms] == [(f"p{i}".encode(), p) for i, p in enumerate(wanted)]
    keys = Queue("jobs").keys
    assert keys.priorities_of([m.key for m in ms]) == [keys.priority_of(m.key) for m in ms] == wanted


def test_a_budgets_read_counts_every_rows_bytes_from_a_list_or_an_iterator() -> None:
    rows = [(b"k1", b"value"), (b"key2", b""), (b"", b"v")]
    for given in (rows, iter(rows)):
        budget = Budget(0)
        budget.read(given)
        assert (budget.read_bytes, budget.read_rows) == (2 + 5 + 4 + 0 + 0 + 1, 3)
