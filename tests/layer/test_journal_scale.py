"""The journal of every queue (``journal(db, None)``, ``follow=True``) at thousands of journaled
queues: read in transactions that each keep within a transaction's share (the 5-second window,
the byte budget of fdbqueue/store/budget.py), followed with a bounded number of watches
(FoundationDB allows 10,000 a database by default, then too_many_watches, 1032)."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import pytest

import fdbqueue
from fdbqueue import JournalEntry, Queue
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.engines.transactional import run_transaction
from scripts.txncost import CountingDatabase, LoggingDatabase

QUEUES = 2000
# Round trips one transaction of the walk may take: well inside the 5-second window at a
# cluster's ~1 ms a read (and the walk's reads are about 100 bytes each: far below the bytes).
MAX_ROUND_TRIPS = 300


def name(i: int) -> str:
    return f"t{i:04d}"


@pytest.fixture(scope="module")
def db() -> Iterator[SimDatabase]:
    database = fdbqueue.open("sim://?seed=5&faults=0")
    assert isinstance(database, SimDatabase)
    for start in range(0, QUEUES, 100):
        run_transaction(
            database,
            lambda t, start=start: [
                fdbqueue.create_queue(t, name(i), journal=True) for i in range(start, start + 100)
            ],
        )
    yield database
    database.close()


def test_the_journal_of_every_queue_is_read_in_bounded_transactions(db: SimDatabase) -> None:
    before = list(fdbqueue.journal(db, None))
    assert len(before) == QUEUES  # one "create" each
    since = before[-1].version
    ids = [Queue(name(i)).enqueue(db, b"%d" % i) for i in (1999, 0, 1000, 1999, 7)]
    cdb = CountingDatabase(db)
    got = list(fdbqueue.journal(cdb, None, since=since))  # type: ignore[arg-type]
    assert [e.message_id for e in got] == ids  # commit order, merged over all queues
    costs = cdb.take()
    assert max(c.round_trips for c in costs) <= MAX_ROUND_TRIPS, max(c.round_trips for c in costs)


def test_follow_keeps_the_watches_bounded(db: SimDatabase) -> None:
    since = list(fdbqueue.journal(db, None))[-1].version
    ldb = LoggingDatabase(db)
    got: list[JournalEntry] = []
    errors: list[BaseException] = []

    def follow() -> None:
        try:
            for e in fdbqueue.journal(ldb, None, since=since, follow=True, timeout=30.0):  # type: ignore[arg-type]
                got.append(e)
                return
        except BaseException as exc:  # reported below
            errors.append(exc)

    t = threading.Thread(target=follow)
    t.start()
    while not errors and db.sizes()["watches"] == 0:
        t.join(0.01)
    mid = Queue(name(1500)).enqueue(db, b"late")
    t.join(30.0)
    assert not errors, errors
    assert [e.message_id for e in got] == [mid]
    # a bounded set armed once, maybe twice (a poll), not one a queue (2,001)
    assert 0 < ldb.watches <= 300, ldb.watches
