"""A journaled queue's common lease and common ack on their own steps (issue 30, eighth pass:
``ops/leasing.py`` ``lease_short``, ``ops/delivery.py`` ``ack_short``, which until then left a
journaled queue to the long way): each writes the leased record's bytes, the counters and the
journal entry the long way (``lease_batch``, ``ack_in``) writes; the journal's mark in the
leased record still tells a nack, a release and an ack to journal; a refused commit leaves no
entry and its retry one; a journal turned off by another process is seen by the next lease."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import StoreError
from fdbqueue.ops import delivery
from fdbqueue.store.record import Record
from tests.support.ways import Ways


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


def journaled(db: Database, n: int) -> Queue:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(n)])
    return q


def counts(db: Database) -> tuple[int, int, int]:
    st = fdbqueue.queue_stats(db, "jobs")
    return st.ready, st.inflight, st.done


def fields(e: fdbqueue.JournalEntry) -> tuple[object, ...]:
    return (e.op, e.queue, e.principal, e.deliveries, e.reason, e.details)


def test_a_journaled_lease_and_ack_are_the_short_steps_and_journal_what_the_long_way_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stores, the same journaled messages: one leased and acked by the short steps (one
    handle), the other by the long way (a fresh handle for each lease keeps no run, and its
    acks are made in a caller's transaction after a lease it made there). The journals hold
    the same entries but for ids, times and versions; every value is ``json.dumps`` of its
    fields; each message's history is its enqueue, lease and ack; the leased records carry the
    journal's mark and are the general encoder's bytes; the counters agree."""
    results = []
    for name, short in (("a", True), ("b", False)):
        u = f"sqlite://{tmp_path / name}.db?sync=normal"
        d = fdbqueue.open(u)
        q = journaled(d, 4)
        ways = Ways(monkeypatch)
        leased = []
        for _ in range(4):
            if not short:
                d.close()
                d = fdbqueue.open(u)
            m = q.lease(d)
            assert m is not None
            raw = run_transaction(d, lambda tr, m=m, q=q: tr.get(q.keys.inflight_key(m.id)))  # type: ignore[misc]
            leased.append((m, raw))
        mid = counts(d)
        for m, _ in leased:
            if short:
                q.ack(d, m)
            else:
                d.close()
                d = fdbqueue.open(u)
                delivery._held.clear()  # nothing held: the ack reads the leased record
                run_transaction(d, lambda tr, m=m, q=q: q.ack(tr, m))  # type: ignore[misc]
        if short:  # the first lease keeps the run; the other three and every ack are the steps'
            assert (ways.leases, ways.acks) == (1, 0)
        else:
            assert ways.leases == 4 and ways.acks == 4
        entries = list(fdbqueue.journal(d, "jobs"))
        for e in entries:
            raw_entry = run_transaction(d, lambda tr, e=e: tr.get(_entry_key(e)))  # type: ignore[misc]
            assert raw_entry == json.dumps(json.loads(raw_entry), separators=(",", ":")).encode()
        for m, raw in leased:
            rec = Record.decode(raw)
            assert rec.encode() == raw and rec.extra["j"] == 1 and rec.deliveries == 1
            assert [(h.op, h.deliveries) for h in fdbqueue.history(d, m.id)] == [
                ("enqueue", 0),
                ("lease", 1),
                ("ack", 1),
            ]
        results.append(([fields(e) for e in entries], [m.payload for m, _ in leased], mid, counts(d)))
        d.close()
    (s_entries, s_got, s_mid, s_end), (l_entries, l_got, l_mid, l_end) = results
    assert s_entries == l_entries and len(s_entries) == 13  # create, 4 x (enqueue, lease, ack)
    assert s_got == l_got == [b"m0", b"m1", b"m2", b"m3"]
    assert s_mid == l_mid == (0, 4, 0) and s_end == l_end == (0, 0, 4)


def _entry_key(e: fdbqueue.JournalEntry) -> bytes:
    from fdbqueue.store.layout import DEFAULT_ROOT, QUEUE_SHARD, JournalKeys

    # (the embedded engine's: in the queue's own keys since issue 30's ninth pass)
    return JournalKeys.make(DEFAULT_ROOT).entry_key(e.queue, QUEUE_SHARD, e.version)


def test_a_short_journaled_lease_is_nacked_released_and_acked_with_their_entries(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The journal's mark the short lease writes is what a nack, a release and an ack (the
    long way's, reading no settings) journal by: the entries the long way's leases get
    (a release gives its delivery back, as ever)."""
    q = journaled(db, 6)
    first = q.lease(db)  # the long way: keeps the run
    assert first is not None
    q.ack(db, first)
    ways = Ways(monkeypatch)
    a, b, c = q.lease(db), q.lease(db), q.lease(db)
    assert a is not None and b is not None and c is not None
    assert ways.leases == 0  # the three are the short step's
    q.nack(db, a)
    q.release(db, b)
    q.ack(db, c)
    ops = {m.id: [(h.op, h.deliveries) for h in fdbqueue.history(db, m.id)] for m in (a, b, c)}
    assert ops[a.id][:3] == [("enqueue", 0), ("lease", 1), ("nack", 1)]
    assert ops[b.id] == [("enqueue", 0), ("lease", 1), ("release", 0)]  # (the delivery given back)
    assert ops[c.id] == [("enqueue", 0), ("lease", 1), ("ack", 1)]


def test_a_refused_journaled_commit_leaves_no_entry_and_its_retry_one(tmp_path: Path) -> None:
    """SQLite refuses the short lease's commit, then the short ack's (a trigger on the store
    file): neither leaves a journal entry; the lease and the ack after them leave one each."""
    d = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        q = journaled(d, 5)
        for _ in range(2):
            m = q.lease(d)
            assert m is not None
            q.ack(d, m)
        head = next(iter(q.browse(d)))
        conn = sqlite3.connect(tmp_path / "q.db")

        def refuse(key: bytes) -> None:
            conn.execute(
                f"CREATE TRIGGER refuse BEFORE DELETE ON kv WHEN OLD.k = x'{key.hex()}' "
                "BEGIN SELECT RAISE(ABORT, 'refused'); END"
            )
            conn.commit()

        def allow() -> None:
            conn.execute("DROP TRIGGER refuse")
            conn.commit()

        before = len(list(fdbqueue.journal(d, "jobs")))
        refuse(head.key)
        with pytest.raises(StoreError):
            q.lease(d)
        allow()
        assert len(list(fdbqueue.journal(d, "jobs"))) == before
        m = q.lease(d)
        assert m is not None and m.payload == b"m2" and m.deliveries == 1
        refuse(q.keys.inflight_key(m.id))
        with pytest.raises(StoreError):
            q.ack(d, m)
        allow()
        conn.close()
        q.ack(d, m)
        assert [(h.op, h.deliveries) for h in fdbqueue.history(d, m.id)] == [
            ("enqueue", 0),
            ("lease", 1),
            ("ack", 1),
        ]
        assert len(list(fdbqueue.journal(d, "jobs"))) == before + 2
        assert counts(d) == (2, 0, 3)
    finally:
        d.close()


OFF = textwrap.dedent(
    """
    import sys
    import fdbqueue
    from fdbqueue.api.admin import create_queue
    db = fdbqueue.open(sys.argv[1])
    create_queue(db, "jobs", journal=False)
    db.close()
    """
)


def test_a_journal_turned_off_by_another_process_is_seen_by_the_next_lease_and_ack(
    url: str, db: Database
) -> None:
    """Leases of a kept run while the journal is on journal; another process turns it off;
    the next lease journals nothing and its record has no mark (its ack journals nothing)."""
    q = journaled(db, 6)
    for _ in range(2):
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)
    subprocess.run([sys.executable, "-c", OFF, url], check=True, timeout=60)
    before = list(fdbqueue.journal(db, "jobs"))
    m = q.lease(db)
    assert m is not None and m.payload == b"m2"
    raw = run_transaction(db, lambda tr: tr.get(q.keys.inflight_key(m.id)))
    assert raw is not None and "j" not in Record.decode(raw).extra
    q.ack(db, m)
    assert list(fdbqueue.journal(db, "jobs")) == before
    assert counts(db) == (3, 0, 3)
