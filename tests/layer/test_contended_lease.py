"""The common lease among other consumers (``ops/leasing.py`` ``lease_contended``): what it
still guarantees.

Where other consumers lease from the queue between this handle's leases (processes draining
one queue with lease + ack), the kept run is out of date at almost every lease and keeping
pauses (``ops/head.py``, ``KEPT_PAUSE``); over the pause ``Queue.lease(db)`` runs a step of its
own: the metadata version and the counters in one read, the lease index where leases are in
flight, the head alone, ``lease_short``'s writes. Each test puts a handle into the pause with a
second handle on the same store, then changes what the step leans on from another process (a
handle of this process would make this process's settings its own, and send the next lease the
long way whatever the step checks) and checks that the next lease acts on it as the long way
(``lease_batch``) would: the same message, the same counts, the same refusals.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, Queue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import QueueStoppedError
from fdbqueue.ops import leasing, ratelimit
from fdbqueue.ops.head import KEPT_PAUSE, _kept
from fdbqueue.store.clock import fake_clock
from tests.support.sqlite_files import traced
from tests.support.ways import Ways

OTHER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    db = fdbqueue.open(sys.argv[1])
    what = sys.argv[2]
    q = fdbqueue.Queue("jobs")
    if what == "lease":
        m = q.lease(db, float(sys.argv[3]))
        print(m.payload.decode())
    elif what == "ttl":
        q.enqueue(db, b"short-lived", ttl=0.001, priority=9)
    elif what == "headers":
        q.enqueue(db, b"with-headers", headers={"h": 1}, priority=9)
    elif what == "delay":
        q.enqueue(db, b"due", priority=9, delay=float(sys.argv[3]))
    db.close()
    """
)


def other_process(url: str, *what: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", OTHER, url, *what], check=True, timeout=60, capture_output=True, text=True
    )
    return done.stdout.strip()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


@pytest.fixture
def other(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


def lease_ack(db: Database, q: Queue, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)
        out.append(m.payload)
    return out


def counts(db: Database) -> tuple[int, int, int]:
    st = fdbqueue.queue_stats(db, "jobs")
    assert st.exact
    return st.ready, st.inflight, st.done


def kept_paused(db: Database, q: Queue) -> bool:
    """Whether ``db``'s own kept run of the queue is paused (not one an earlier test's closed
    handle left under the same id: ``head.kept_run`` checks the entry's database as well)."""
    entry = _kept.get((id(db), q.keys.packed))
    return entry is not None and entry.db() is db and entry.pause > 0


def paused(db: Database, other: Database, q: Queue) -> list[bytes]:
    """Leases (and acks) by ``db`` and ``other`` in turn until ``db``'s kept run is paused, then
    one more by ``db`` (the settings this process found for the queue are kept for one handle
    at a time: ``db``'s long way finds them again, as a process of its own would not need
    to); what they leased, in order."""
    got = []
    # (Rounds enough for a paused run an earlier test's closed handle left under the same id
    # to be counted down first: head.keeps_head counts it.)
    for _ in range(2 * KEPT_PAUSE + 4):
        for handle in (db, other):
            got += lease_ack(handle, q, 1)
        if kept_paused(db, q):
            got += lease_ack(db, q, 1)
            assert kept_paused(db, q)
            return got
    raise AssertionError("never paused")


def filled(db: Database, n: int) -> Queue:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(n)])
    return q


def test_leases_over_the_pause_are_the_contended_steps_and_hand_out_what_the_long_way_would(
    db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = filled(db, 80)
    got = paused(db, other, q)
    n = len(got)
    ways = Ways(monkeypatch)
    before = time.time()
    m = q.lease(db, 30)
    assert m is not None and ways.leases == 0  # the step's
    assert (m.payload, m.deliveries, m.priority, m.expires_at) == (f"m{n}".encode(), 1, 0, None)
    assert m.receipt is not None and m.receipt.endswith(".0")
    assert before + 29 < m.lease_deadline < time.time() + 31  # type: ignore[operator]
    assert counts(db) == (80 - n - 1, 1, n)
    q.ack(db, m)
    got += [m.payload, *lease_ack(db, q, KEPT_PAUSE - 3)]
    assert ways.leases == 0 and ways.acks == 0  # every lease over the pause the step's
    assert kept_paused(db, q)
    while (m := q.lease(db if len(got) % 3 else other)) is not None:
        q.ack(db, m)
        got.append(m.payload)
    assert got == [f"m{i}".encode() for i in range(80)]  # in order, once
    assert counts(db) == (0, 0, 80)


def test_the_pause_ends_after_its_leases_and_a_consumer_alone_keeps_a_run_again(
    db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each contended lease counts one of the pause (as the long way's ``keeps_head``): after
    KEPT_PAUSE leases a consumer alone reads and keeps a run again, and leases from it."""
    q = filled(db, 100)
    paused(db, other, q)
    ways = Ways(monkeypatch)
    lease_ack(db, q, KEPT_PAUSE)
    assert not kept_paused(db, q)
    short = []
    real = leasing.lease_short

    def counted(*args: Any) -> Any:
        msg = real(*args)
        short.append(msg is not None)
        return msg

    monkeypatch.setattr(leasing, "lease_short", counted)
    lease_ack(db, q, 10)
    assert ways.leases <= 2  # the one that kept a run again
    assert sum(short) >= 8  # the rest lease_short's, from the run
    ready, inflight, done = counts(db)
    assert inflight == 0 and ready + done == 100


def test_a_nack_of_a_contended_lease_counts_its_delivery(db: Database, other: Database) -> None:
    fdbqueue.create_queue(db, "jobs", retry_delay=0)
    q = filled(db, 60)
    n = len(paused(db, other, q))
    m = q.lease(db)
    assert m is not None and m.payload == f"m{n}".encode()
    q.nack(db, m)
    again = q.lease(db)
    assert again is not None and again.payload == m.payload and again.deliveries == 2
    q.ack(db, again)
    assert counts(db) == (60 - n - 1, 0, n + 1)


def test_a_journaled_queue_journals_every_contended_lease_and_ack(
    db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = filled(db, 60)
    paused(db, other, q)
    ways = Ways(monkeypatch)
    lease_ack(db, q, 4)
    assert ways.leases == 0
    entries = list(fdbqueue.journal(db, "jobs"))
    done = counts(db)[2]
    assert len([e for e in entries if e.op == "lease"]) == done
    assert len([e for e in entries if e.op == "ack"]) == done


def test_an_expired_lease_of_another_process_comes_back_first(
    url: str, db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Leases in flight may have expired: the lease index is read, and an expired one sends the
    lease the long way, which releases it first (its second delivery)."""
    q = filled(db, 60)
    n = len(paused(db, other, q))
    assert other_process(url, "lease", "1.5") == f"m{n}"
    ways = Ways(monkeypatch)
    assert lease_ack(db, q, 1) == [f"m{n + 1}".encode()]  # in flight, not yet expired: the step
    assert ways.leases == 0
    time.sleep(1.6)
    m = q.lease(db)
    assert m is not None and (m.payload, m.deliveries) == (f"m{n}".encode(), 2)
    assert ways.leases == 1
    q.ack(db, m)
    assert counts(db) == (60 - n - 2, 0, n + 2)


def test_a_delay_come_due_is_leased_first(url: str, db: Database, other: Database) -> None:
    """A delayed message counted: the step leaves the due check to the long way, which makes it
    ready once due (a second process's delayed enqueue: this process's settings stay)."""
    q = filled(db, 60)
    n = len(paused(db, other, q))
    other_process(url, "delay", "1.5")
    assert lease_ack(db, q, 1) == [f"m{n}".encode()]  # not yet due
    time.sleep(1.6)
    assert lease_ack(db, q, 2) == [b"due", f"m{n + 1}".encode()]
    assert counts(db) == (60 - n - 2, 0, n + 3)


def test_a_ready_counter_never_written_sends_the_lease_the_long_way(db: Database, other: Database) -> None:
    q = filled(db, 60)
    n = len(paused(db, other, q))
    run_transaction(db, lambda tr: tr.clear(q.keys.counter("ready")))
    assert lease_ack(db, q, 2) == [f"m{n}".encode(), f"m{n + 1}".encode()]


def test_a_ttl_or_headers_at_the_head_take_the_long_way(
    url: str, db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = filled(db, 60)
    n = len(paused(db, other, q))
    other_process(url, "ttl")
    time.sleep(0.01)
    ways = Ways(monkeypatch)
    assert lease_ack(db, q, 1) == [f"m{n}".encode()]  # the expired head moved aside
    assert ways.leases == 1 and fdbqueue.queue_stats(db, "jobs").expired == 1
    other_process(url, "headers")
    m = q.lease(db)
    assert m is not None and m.payload == b"with-headers" and dict(m.headers) == {"h": 1}
    q.ack(db, m)
    assert ways.leases == 2
    assert counts(db) == (60 - n - 1, 0, n + 2)


def test_a_rate_limit_set_by_another_handle_holds_contended_leases_back(
    db: Database, other: Database
) -> None:
    with fake_clock() as clock:
        q = filled(db, 100)
        n = len(paused(db, other, q))
        fdbqueue.create_queue(other, "jobs", rate_limit="20/s")
        assert lease_ack(db, q, 2) == [f"m{n}".encode(), f"m{n + 1}".encode()]  # the burst
        assert kept_paused(db, q)
        assert q.lease(db) is None
        clock.advance(0.1)
        assert lease_ack(db, q, 2) == [f"m{n + 2}".encode(), f"m{n + 3}".encode()]
        assert q.lease(db) is None
        fdbqueue.create_queue(other, "jobs", rate_limit=None)
        assert lease_ack(db, q, 2) == [f"m{n + 4}".encode(), f"m{n + 5}".encode()]
        with ratelimit.extra(ratelimit.rate_of("20/s"), "mine"):  # a thread's own (a Worker's)
            assert lease_ack(db, q, 2) == [f"m{n + 6}".encode(), f"m{n + 7}".encode()]
            assert q.lease(db) is None
        assert kept_paused(db, q)


def test_a_pause_or_an_owner_set_by_another_handle_refuses_the_next_contended_lease(
    url: str, db: Database, other: Database
) -> None:
    q = filled(db, 60)
    n = len(paused(db, other, q))
    fdbqueue.set_state(other, "jobs", dequeue=False)
    with pytest.raises(QueueStoppedError):
        q.lease(db)
    fdbqueue.set_state(other, "jobs", dequeue=True)
    assert lease_ack(db, q, 1) == [f"m{n}".encode()]
    fdbqueue.create_queue(other, "jobs", owner="svc-a")
    with pytest.raises(AccessDeniedError):
        q.lease(db)
    owner = fdbqueue.open(url, principal="svc-a")
    try:
        assert counts(owner) == (60 - n - 1, 0, n + 1)
    finally:
        owner.close()


def test_a_delayed_enqueue_not_yet_due_sends_leases_the_long_way(
    url: str, db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A delayed message counted (not yet due): the step leaves the due check to the long way."""
    q = filled(db, 60)
    n = len(paused(db, other, q))
    other_process(url, "delay", "30")
    ways = Ways(monkeypatch)
    assert lease_ack(db, q, 1) == [f"m{n}".encode()]
    assert ways.leases == 1
    delayed = run_transaction(db, lambda tr: tr.get(q.keys.counter("delayed")))
    assert delayed is not None and delayed != bytes(8)


WORKER = textwrap.dedent(
    """
    import sys, time
    import fdbqueue
    from fdbqueue.ops import leasing
    db = fdbqueue.open(sys.argv[1])
    time.sleep(max(0.0, float(sys.argv[2]) - time.time()))  # all three at once
    q = fdbqueue.Queue("jobs")
    served = []
    real = leasing.lease_contended

    def counted(*args):
        m = real(*args)
        served.append(m is not None)
        return m

    leasing.lease_contended = counted
    got = []
    while (m := q.lease(db)) is not None:
        q.ack(db, m)
        got.append(m.payload.decode())
    print(sum(served), " ".join(got))
    db.close()
    """
)


def test_processes_draining_with_lease_and_ack_take_every_message_once(url: str, db: Database) -> None:
    """Three processes draining one queue with lease + ack (each of them in the pause most of
    the time): every message once, each process's in order, the counters exact."""
    q = Queue("jobs")
    n = 1200
    q.enqueue_many(db, [f"m{i:04d}".encode() for i in range(n)])
    start = str(time.time() + 2)
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, url, start], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    everything = [m for out in outs for m in out[1:]]
    assert sorted(everything) == [f"m{i:04d}" for i in range(n)]
    for out in outs:
        assert out[1:] == sorted(out[1:])
    assert sum(int(out[0]) for out in outs) > 0  # the step served leases among the others
    assert counts(db) == (0, 0, n)


def test_a_handle_whose_settings_another_handle_found_last_reads_the_metadata_once(
    db: Database, other: Database
) -> None:
    """The settings this process found for a queue are kept for one handle at a time
    (``meta.read_take``): a lease over the pause by the other handle goes the long way, which
    reads the metadata and counters itself, so the step reads nothing before it knows that
    (one read of point keys, not two)."""
    q = filled(db, 60)
    paused(db, other, q)
    got = lease_ack(other, q, 1)  # other's settings now
    statements, m = traced(db, lambda: q.lease(db))
    assert m is not None and [m.payload] != got
    points = [s for s in statements if s.startswith("SELECT k, v FROM kv WHERE k = ")]
    assert len(points) == 1, [s[:80] for s in statements]
