"""The common lease's and the common ack's own steps (issue 30, seventh pass:
``ops/leasing.py`` ``lease_short`` / ``lease_own``, ``ops/delivery.py`` ``ack_short``): what they
still guarantee.

On the embedded engine ``Queue.lease(db)`` of a queue whose head is the first record of the run
the last take kept runs a step of its own (the settings this process last found for the queue at
the metadata version read, the counters read with it, the record's fields, one call for the
writes), and ``Queue.ack(db, m)`` of a message this process leased, read back as the very bytes
that lease wrote, runs one too. Each test here changes what a step leans on - from another
process, another handle, a failed commit, the queue's settings - and checks that the next lease
or ack acts on it as the long way (``lease_batch``, ``ack_in``) would: the same message, the same
counts, the same refusals.
"""

from __future__ import annotations

import sqlite3
import struct
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, LeaseError, Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import LeaseExpiredError, QueueStoppedError, StoreError
from fdbqueue.ops import leasing, ratelimit
from fdbqueue.store.clock import fake_clock
from fdbqueue.store.config import error_queue_name
from tests.support.ways import Ways

OTHER = textwrap.dedent(
    """
    import sys, time
    import fdbqueue
    db = fdbqueue.open(sys.argv[1])
    what = sys.argv[2]
    q = fdbqueue.Queue("jobs")
    if what == "lease":
        m = q.lease(db)
        print(m.payload.decode())
    elif what == "lease_ack":
        m = q.lease(db)
        q.ack(db, m)
        print(m.payload.decode())
    elif what == "pause":
        from fdbqueue.api.admin import set_state
        set_state(db, "jobs", dequeue=False)
    elif what == "journal":
        from fdbqueue.api.admin import create_queue
        create_queue(db, "jobs", journal=True)
    elif what == "delay":
        q.enqueue(db, b"due", priority=5, delay=0.5)
    db.close()
    """
)


def other_process(url: str, what: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", OTHER, url, what], check=True, timeout=60, capture_output=True, text=True
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


def filled(db: Database, n: int = 20, **options: Any) -> Queue:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(n)], **options)
    return q


def counts(db: Database) -> tuple[int, int, int]:
    st = fdbqueue.queue_stats(db, "jobs")
    return st.ready, st.inflight, st.done


def lease_ack(db: Database, q: Queue, n: int) -> list[bytes]:
    out = []
    for _ in range(n):
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)
        out.append(m.payload)
    return out


def test_the_common_lease_and_ack_are_the_short_steps_and_hand_out_what_the_long_way_would(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A consumer alone: after the first lease (the long way, which keeps the run), the leases
    of the run and every ack of them are the short steps'; every message once, in order."""
    q = filled(db, 10)
    ways = Ways(monkeypatch)
    assert lease_ack(db, q, 10) == [f"m{i}".encode() for i in range(10)]
    assert ways.leases == 1 and ways.acks == 0
    assert q.lease(db) is None
    assert counts(db) == (0, 0, 10)


def test_the_short_steps_give_the_message_and_store_the_long_way_gives(tmp_path: Path) -> None:
    """Two stores, the same messages: one leased and acked by the short steps, the other by the
    long way (a fresh handle each time keeps no run). The messages are equal but for their ids,
    keys, receipts and deadlines; the leased records' bytes are the long way's; the stores
    hold the same counters."""
    results = []
    for name, fresh in (("a", False), ("b", True)):
        u = f"sqlite://{tmp_path / name}.db?sync=normal"
        d = fdbqueue.open(u)
        q = Queue("jobs")
        q.enqueue_many(d, [b"x", b"y", b"z"])
        got = []
        for _ in range(3):
            if fresh:
                d.close()
                d = fdbqueue.open(u)
            m = q.lease(d)
            assert m is not None
            raw = run_transaction(d, lambda tr, m=m, q=q: tr.get(q.keys.inflight_key(m.id)))  # type: ignore[misc]
            got.append((m, raw))
        mid = counts(d)
        for m, _ in got:
            q.ack(d, m)
        results.append((got, mid, counts(d)))
        d.close()
    (short, s_mid, s_end), (long, l_mid, l_end) = results
    assert s_mid == l_mid == (0, 3, 0) and s_end == l_end == (0, 0, 3)

    def fields(m: fdbqueue.Message) -> dict[str, Any]:
        out = dict(m.__dict__)
        for varying in ("id", "key", "enqueued_at", "receipt", "lease_deadline", "extra"):
            out.pop(varying)
        out["extra"] = sorted(m.extra)
        return out

    assert [fields(m) for m, _ in short] == [fields(m) for m, _ in long]
    for m, raw in short:  # the long way's encoder writes the same bytes for this record
        from fdbqueue.store.record import Record

        rec = Record.decode(raw)
        assert rec.encode() == raw and rec.extra["receipt"] == m.receipt and rec.deliveries == 1


def test_an_expired_lease_of_another_process_taken_here_refuses_that_holders_ack(
    url: str, db: Database
) -> None:
    """Another process leases the head and lets its lease expire; this process leases it
    again (its due check releases it first); that holder's ack is then refused, and this
    process's leases go on from the next message. (This way round, database time is the real
    clock's in the holder: this test process may have moved its own ahead, a fake clock's.)"""
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    script = textwrap.dedent(
        """
        import dataclasses, sys
        import fdbqueue
        from fdbqueue import LeaseError
        db = fdbqueue.open(sys.argv[1])
        q = fdbqueue.Queue("jobs")
        if sys.argv[2] == "lease":
            m = q.lease(db, 0.3)
            print(m.id, m.receipt)
        else:
            m = dataclasses.replace(q.get(db, sys.argv[3]), receipt=sys.argv[4])
            try:
                q.ack(db, m)
                print("acked")
            except LeaseError:
                print("refused")
        db.close()
        """
    )

    def run(*args: str) -> str:
        done = subprocess.run(
            [sys.executable, "-c", script, url, *args], check=True, timeout=60, capture_output=True, text=True
        )
        return done.stdout.strip()

    msg_id, receipt = run("lease").split()
    time.sleep(0.8)
    again = q.lease(db, 60)
    assert again is not None and again.id == msg_id and again.payload == b"m2" and again.deliveries == 2
    assert run("ack", msg_id, receipt) == "refused"
    q.ack(db, again)
    assert lease_ack(db, q, 2) == [b"m3", b"m4"]
    assert counts(db) == (5, 0, 5)


def test_an_expired_lease_taken_by_another_handle_refuses_the_old_holders_ack(url: str, db: Database) -> None:
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    held = q.lease(db, 0.5)
    assert held is not None
    time.sleep(1.0)
    other = fdbqueue.open(url)
    try:
        again = q.lease(other)
        assert again is not None and again.id == held.id and again.deliveries == 2
        with pytest.raises(LeaseError):
            q.ack(db, held)
        q.ack(other, again)
    finally:
        other.close()
    assert counts(db) == (7, 0, 3)


def test_an_expired_lease_not_taken_yet_is_not_acked(db: Database) -> None:
    q = filled(db, 10)
    assert lease_ack(db, q, 1) == [b"m0"]
    held = q.lease(db, 0.3)
    assert held is not None
    time.sleep(0.8)
    with pytest.raises(LeaseExpiredError):
        q.ack(db, held)
    back = q.lease(db)
    assert back is not None and back.id == held.id and back.deliveries == 2
    q.ack(db, back)
    assert counts(db) == (8, 0, 2)


def test_a_lease_acked_twice_or_an_ack_of_another_queues_message_is_refused(db: Database) -> None:
    q = filled(db, 10)
    other = Queue("other")
    other.enqueue(db, b"o")
    m = q.lease(db)
    assert m is not None
    q.ack(db, m)
    with pytest.raises(LeaseError):
        q.ack(db, m)
    o = other.lease(db)
    assert o is not None
    with pytest.raises(fdbqueue.QueueError):
        q.ack(db, o)  # not leased in this queue
    other.ack(db, o)
    assert counts(db) == (9, 0, 1)


def test_leases_and_acks_of_another_process_between_are_seen(url: str, db: Database) -> None:
    """Another process leases and acks between this handle's: the kept run is out of date (the
    ready counter) and this handle's ack reads a store whose last commit is not its own."""
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    m = q.lease(db)
    assert m is not None and m.payload == b"m2"
    assert other_process(url, "lease_ack") == "m3"
    q.ack(db, m)
    assert lease_ack(db, q, 2) == [b"m4", b"m5"]
    assert counts(db) == (4, 0, 6)


def test_a_refused_lease_commit_takes_nothing_and_a_refused_ack_commit_acks_nothing(
    tmp_path: Path,
) -> None:
    """SQLite refuses the commit (a trigger on the store file): the short lease wrote nothing
    that lands and keeps no run (the next lease hands out the same message, first delivery);
    the short ack, whose kept lease it forgot, acks nothing, and the ack after it (the long
    way) acks."""
    d = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        q = filled(d, 10)
        assert lease_ack(d, q, 2) == [b"m0", b"m1"]
        head = next(iter(q.browse(d)))
        conn = sqlite3.connect(tmp_path / "q.db")
        conn.execute(
            f"CREATE TRIGGER refuse BEFORE DELETE ON kv WHEN OLD.k = x'{head.key.hex()}' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        conn.commit()
        with pytest.raises(StoreError):
            q.lease(d)
        conn.execute("DROP TRIGGER refuse")
        conn.commit()
        m = q.lease(d)
        assert m is not None and m.payload == b"m2" and m.deliveries == 1
        conn.execute(
            f"CREATE TRIGGER refuse BEFORE DELETE ON kv WHEN OLD.k = x'{q.keys.inflight_key(m.id).hex()}' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        conn.commit()
        with pytest.raises(StoreError):
            q.ack(d, m)
        conn.execute("DROP TRIGGER refuse")
        conn.commit()
        conn.close()
        assert counts(d) == (7, 1, 2)
        q.ack(d, m)
        with pytest.raises(LeaseError):
            q.ack(d, m)
        assert lease_ack(d, q, 7) == [f"m{i}".encode() for i in range(3, 10)]
        assert counts(d) == (0, 0, 10)
    finally:
        d.close()


def test_an_extended_lease_is_acked_after_its_first_deadline(db: Database) -> None:
    """extend rewrites the leased record (a new deadline): the ack reads other bytes than the
    lease wrote and takes the long way, which finds the lease still held."""
    q = filled(db, 5)
    assert lease_ack(db, q, 1) == [b"m0"]
    m = q.lease(db, 0.5)
    assert m is not None
    m2 = q.extend(db, m, 30)
    time.sleep(0.8)
    q.ack(db, m2)
    assert counts(db) == (3, 0, 2)


def test_a_nack_of_a_short_lease_counts_and_dead_letters_at_max_deliveries(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=2, retry_delay=0)
    q = filled(db, 5)
    assert lease_ack(db, q, 1) == [b"m0"]
    first = q.lease(db)
    assert first is not None and first.payload == b"m1"
    assert q.nack(db, first, reason="boom") == "ready"
    second = q.lease(db)
    assert second is not None and second.id == first.id and second.deliveries == 2
    assert q.nack(db, second, reason="boom") == "dead"
    dead = Queue(error_queue_name("jobs")).lease(db)
    assert dead is not None and dead.payload == b"m1"
    assert lease_ack(db, q, 3) == [b"m2", b"m3", b"m4"]


def test_an_expired_lease_comes_back_before_the_kept_run_and_dead_letters(db: Database) -> None:
    """A lease in flight (the inflight counter) may expire with no commit: the next lease
    makes it ready first; at max_deliveries its expiry dead-letters it."""
    fdbqueue.create_queue(db, "jobs", max_deliveries=2, retry_delay=0)
    q = filled(db, 10)
    assert lease_ack(db, q, 1) == [b"m0"]
    held = q.lease(db, 1.0)
    assert held is not None and held.payload == b"m1"
    assert lease_ack(db, q, 2) == [b"m2", b"m3"]
    time.sleep(1.2)
    back = q.lease(db, 1.0)
    assert back is not None and back.payload == b"m1" and back.deliveries == 2
    time.sleep(1.2)
    assert lease_ack(db, q, 1) == [b"m4"]  # m1's second expiry: dead-lettered on the way
    assert counts(db) == (5, 0, 4)
    dead = Queue(error_queue_name("jobs")).lease(db)
    assert dead is not None and dead.payload == b"m1"


def test_a_pause_by_another_process_refuses_the_next_lease(url: str, db: Database) -> None:
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    other_process(url, "pause")
    with pytest.raises(QueueStoppedError):
        q.lease(db)
    assert counts(db) == (8, 0, 2)


def test_a_journal_set_by_another_process_is_written_by_the_next_lease_and_ack(
    url: str, db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    other_process(url, "journal")
    ways = Ways(monkeypatch)
    got = []
    for _ in range(4):  # the first reads the new settings; the others find them cached
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)
        got.append(m)
    assert [m.payload for m in got] == [b"m2", b"m3", b"m4", b"m5"]
    # The kept run found out of date by the settings' change pauses the short lease
    # (head.keeps_head: KEPT_PAUSE takes): the first lease the long way, which reads the new
    # settings, the others over the pause the contended step's (ops/contended.py
    # lease_contended, journaled as the long way journals); the acks of leases held here are
    # the short step's, journaled since issue 30's eighth pass
    # (tests/layer/test_journal_short_steps.py).
    assert ways.leases == 1 and ways.acks == 0
    for m in got:
        ops = [(e.op, e.message_id) for e in fdbqueue.journal(db, "jobs") if e.message_id == m.id]
        assert ops == [("lease", m.id), ("ack", m.id)]


def test_a_delay_enqueued_by_another_process_comes_first_once_due(url: str, db: Database) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"first", priority=5)
    q.enqueue_many(db, [f"m{i}".encode() for i in range(10)])
    assert lease_ack(db, q, 3) == [b"first", b"m0", b"m1"]
    other_process(url, "delay")
    time.sleep(0.6)
    assert lease_ack(db, q, 2) == [b"due", b"m2"]


def test_an_owned_queue_checks_the_principal_of_every_lease_and_ack(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", owner="svc-a")
    db.principal = "svc-a"  # type: ignore[misc]
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    m = q.lease(db)
    assert m is not None
    db.principal = "svc-b"  # type: ignore[misc]
    with pytest.raises(AccessDeniedError):
        q.ack(db, m)
    with pytest.raises(AccessDeniedError):
        q.lease(db)
    db.principal = "svc-a"  # type: ignore[misc]
    q.ack(db, m)
    assert lease_ack(db, q, 1) == [b"m3"]


def test_a_strict_queue_leases_one_at_a_time(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", strict_order=True)
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    m = q.lease(db)
    assert m is not None and m.payload == b"m2"
    assert q.lease(db) is None
    q.ack(db, m)
    assert lease_ack(db, q, 2) == [b"m3", b"m4"]


def test_a_strict_queues_ack_wakes_a_lease_waiting_for_it(db: Database) -> None:
    """Strict order: the ack of the message in flight wakes a consumer blocked on the queue
    (its lease record carries the strict mark, which sends the ack the long way)."""
    fdbqueue.create_queue(db, "jobs", strict_order=True)
    q = filled(db, 3)
    m = q.lease(db)
    assert m is not None and m.payload == b"m0"
    got: list[fdbqueue.Message | None] = []
    waiter = threading.Thread(target=lambda: got.append(q.lease(db, timeout=20)))
    waiter.start()
    time.sleep(0.3)  # (blocked on the queue's wake key by now, or it finds m1 when it looks)
    q.ack(db, m)
    waiter.join(30)
    assert len(got) == 1 and got[0] is not None and got[0].payload == b"m1"


def test_a_volatile_queues_leases_and_acks_skip_the_fsync(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import os

    import fdbqueue.engines.sqlite.walsync as walsync

    calls: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(walsync.os, "fdatasync", counted)
    d = fdbqueue.open(f"sqlite:///{tmp_path / 'q.db'}")  # sync=full: a durable commit syncs
    try:
        fdbqueue.create_queue(d, "jobs", volatile=True)
        q = filled(d, 10)
        before = len(calls)
        assert lease_ack(d, q, 5) == [f"m{i}".encode() for i in range(5)]
        assert len(calls) == before
    finally:
        d.close()


def test_a_ttl_chunks_headers_or_a_rate_limit_take_the_long_way(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"m0")
    q.enqueue(db, b"ttl", ttl=60.0)
    q.enqueue(db, b"big" * 40_000)
    q.enqueue(db, b"hdr", headers={"h": 1})
    q.enqueue(db, b"m4")
    ways = Ways(monkeypatch)
    got = []
    for _ in range(5):
        m = q.lease(db)
        assert m is not None
        got.append(m)
        q.ack(db, m)
    assert [len(m.payload) for m in got] == [2, 3, 120_000, 3, 2]
    assert got[1].expires_at is not None and dict(got[3].headers) == {"h": 1}
    assert ways.leases == 4  # m0 (no run kept yet), ttl, big, hdr; m4 the step's
    assert ways.acks == 2  # ttl and big; hdr's leased record is as plain to ack as m4's
    assert counts(db) == (0, 0, 5)
    assert run_transaction(db, lambda tr: tr.get_range(*q.keys.index_range("x"))) == []


def test_a_rate_limited_queue_takes_its_tokens(db: Database) -> None:
    """A queue's rate limit, and a thread's own (a Worker's ``rate_limit``: ``ratelimit.extra``),
    hold leases back as ever: the short step takes no lease that needs a token."""
    with fake_clock() as clock:
        fdbqueue.create_queue(db, "jobs", rate_limit="20/s")
        q = filled(db, 10)
        assert lease_ack(db, q, 2) == [b"m0", b"m1"]  # the burst: two tokens
        assert q.lease(db) is None
        clock.advance(0.1)
        assert lease_ack(db, q, 2) == [b"m2", b"m3"]
        assert q.lease(db) is None
        fdbqueue.create_queue(db, "jobs", rate_limit=None)
        assert lease_ack(db, q, 2) == [b"m4", b"m5"]
        with ratelimit.extra(ratelimit.rate_of("20/s"), "mine"):
            assert lease_ack(db, q, 2) == [b"m6", b"m7"]
            assert q.lease(db) is None
        assert lease_ack(db, q, 2) == [b"m8", b"m9"]


def test_counters_at_their_limit_are_counted_as_an_add_would(db: Database) -> None:
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    inflight, done = q.keys.counter("inflight"), q.keys.counter("done")
    run_transaction(db, lambda tr: tr.set(inflight, struct.pack("<q", 2**63 - 1)))
    m = q.lease(db)
    assert m is not None and m.payload == b"m2"
    assert run_transaction(db, lambda tr: tr.get(inflight)) == struct.pack("<q", -(2**63))
    run_transaction(db, lambda tr: tr.set(done, struct.pack("<q", 2**63 - 1)))
    q.ack(db, m)
    assert run_transaction(db, lambda tr: tr.get(done)) == struct.pack("<q", -(2**63))
    assert run_transaction(db, lambda tr: tr.get(inflight)) == struct.pack("<q", 2**63 - 1)


def test_threads_leasing_and_acking_on_one_handle_take_every_message_once(db: Database) -> None:
    q = filled(db, 300)
    got: list[bytes] = []
    errors: list[BaseException] = []

    def drain() -> None:
        try:
            while (m := q.lease(db)) is not None:
                q.ack(db, m)
                got.append(m.payload)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert sorted(got) == sorted(f"m{i}".encode() for i in range(300))
    assert counts(db) == (0, 0, 300)


def test_a_lease_in_a_callers_transaction_that_aborts_keeps_nothing(db: Database) -> None:
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]

    class Boom(Exception):
        pass

    @fdbqueue.transactional
    def failing(tr: Transaction) -> None:
        m = q.lease(tr)
        assert m is not None and m.payload == b"m2"
        q.ack(tr, m)
        raise Boom

    with pytest.raises(Boom):
        failing(db)
    assert lease_ack(db, q, 3) == [b"m2", b"m3", b"m4"]
    assert counts(db) == (5, 0, 5)


def test_on_sim_the_steps_stand_aside_and_a_conflicting_lease_retries() -> None:
    """Where transactions may conflict the short steps do not apply (``lease_own`` None): two
    consumers leasing the head at once conflict, one retries, each message is leased once."""
    d = fdbqueue.open("sim://?seed=3&faults=0")
    try:
        q = filled(d, 4)
        assert leasing.lease_own(d, q.keys, None) is None
        a, b = d.create_transaction(), d.create_transaction()
        ma, mb = q.lease(a), q.lease(b)
        assert ma is not None and mb is not None and ma.id == mb.id
        a.commit()
        with pytest.raises(fdbqueue.EngineError) as err:
            b.commit()
        assert err.value.code == 1020
        assert lease_ack(d, q, 3) == [b"m1", b"m2", b"m3"]
        q.ack(d, ma)
        assert counts(d) == (0, 0, 4)
    finally:
        d.close()


def test_a_message_away_from_home_leaves_no_id_entry_behind(db: Database) -> None:
    """An autonomous enqueue's id is made before its place (an id entry points at it): its lease
    clears that entry, as the long way's put_leased does, and its ack finds it by id."""
    q = Queue("jobs")

    @fdbqueue.transactional
    def autonomous(tr: Transaction, payload: bytes) -> str:
        return q.enqueue(tr, payload, autonomous=True)

    ids = [autonomous(db, f"a{i}".encode()) for i in range(4)]
    got = []
    for _ in range(4):
        m = q.lease(db)
        assert m is not None
        assert run_transaction(db, lambda tr, m=m: tr.get(q.keys.id_key(m.id))) is None  # type: ignore[misc]
        got.append(m.id)
        q.ack(db, m)
    assert got == ids
    assert counts(db) == (0, 0, 4)


def test_a_lease_aborted_then_leased_again_is_not_acked_through_the_old_receipt(db: Database) -> None:
    """A lease in a caller's transaction that aborts kept what it would have written (this
    process's held lease); the same message leased again under another receipt is not acked
    through the old one: the bytes read back are not those the old lease wrote."""
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]

    class Boom(Exception):
        pass

    old: list[fdbqueue.Message] = []

    @fdbqueue.transactional
    def failing(tr: Transaction) -> None:
        m = q.lease(tr, 60)
        assert m is not None
        old.append(m)
        raise Boom

    with pytest.raises(Boom):
        failing(db)
    again = q.lease(db, 60)
    assert again is not None and again.id == old[0].id and again.receipt != old[0].receipt
    with pytest.raises(LeaseError):
        q.ack(db, old[0])
    assert counts(db) == (7, 1, 2)
    q.ack(db, again)
    assert counts(db) == (7, 0, 3)


def test_a_lease_nacked_by_another_process_and_leased_again_is_not_acked_through_the_old_receipt(
    url: str, db: Database
) -> None:
    """The holder's lease is nacked by another process (given the message) and leased again
    there before it expires: this process still holds what its lease wrote, but the bytes it
    reads back are the new lease's."""
    q = filled(db, 10)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]
    m = q.lease(db, 60)
    assert m is not None and m.receipt is not None
    script = textwrap.dedent(
        """
        import dataclasses, sys
        import fdbqueue
        db = fdbqueue.open(sys.argv[1])
        q = fdbqueue.Queue("jobs")
        m = dataclasses.replace(q.get(db, sys.argv[2]), receipt=sys.argv[3])  # the holder's message
        q.nack(db, m, delay=0)
        again = q.lease(db, 60)
        print(again.id == m.id)
        db.close()
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script, url, m.id, m.receipt],
        check=True,
        timeout=60,
        capture_output=True,
        text=True,
    )
    assert done.stdout.strip() == "True"
    with pytest.raises(LeaseError):
        q.ack(db, m)
    assert counts(db) == (7, 1, 2)


def test_a_lease_that_finds_its_kept_run_out_of_date_keeps_nothing_through_the_pause(
    url: str, db: Database
) -> None:
    """Another handle leases between this handle's leases (contention): the lease that finds
    the kept run out of date pauses keeping (head.KEPT_PAUSE takes), reads the head alone and
    keeps no new run over the pause - every message once, in order."""
    from fdbqueue.ops.head import KEPT_PAUSE, kept_paused

    q = filled(db, 40)
    assert lease_ack(db, q, 2) == [b"m0", b"m1"]  # a run kept (m2 ...)
    other = fdbqueue.open(url)
    try:
        assert lease_ack(other, q, 1) == [b"m2"]
        assert lease_ack(db, q, 1) == [b"m3"]  # the run was out of date: the head read afresh
        assert kept_paused(db, q.keys)
        got = lease_ack(db, q, KEPT_PAUSE - 2)
        assert got == [f"m{i}".encode() for i in range(4, 4 + KEPT_PAUSE - 2)]
        assert kept_paused(db, q.keys)  # still paused: no run kept over it
    finally:
        other.close()
    rest = lease_ack(db, q, 40 - 4 - (KEPT_PAUSE - 2))
    assert rest == [f"m{i}".encode() for i in range(4 + KEPT_PAUSE - 2, 40)]
    assert counts(db) == (0, 0, 40)
