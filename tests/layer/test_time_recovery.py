"""Time across recoveries: a recovery's version jump is not time.

At every FoundationDB recovery the versions jump ``MAX_VERSIONS_IN_FLIGHT`` (100 s worth)
ahead while no time passes (``fdbqueue.testing.recovery`` does the same on the sim). If
database time were the read version, every lease would end at once (its message delivered
twice), TTLs would end early, delayed messages come due early, dedup windows shrink and
the journal be trimmed early. Each test below failed before database time left the jump out.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import fdbqueue
from fdbqueue import EngineError
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.ops.journal_trim import trim_journal
from fdbqueue.store.clock import db_now
from fdbqueue.testing import recovery
from scripts.txncost import CountingDatabase


@pytest.fixture
def db() -> Iterator[SimDatabase]:
    database = fdbqueue.open("sim://?seed=7&faults=0")
    assert isinstance(database, SimDatabase)
    yield database
    database.close()


def now(db: SimDatabase) -> int:
    return run_transaction(db, db_now)


def test_a_lease_holds_across_a_recovery(db: SimDatabase) -> None:
    jobs = fdbqueue.Queue("jobs")
    fdbqueue.create_queue(db, "jobs", lease_seconds=30.0)
    jobs.enqueue(db, b"once")
    m = jobs.lease(db)
    assert m is not None
    recovery(db, 100.0)
    assert jobs.lease(db) is None  # another consumer: the lease still holds
    assert jobs.dequeue(db) is None
    jobs.sweep(db)
    assert jobs.lease(db) is None
    jobs.ack(db, m)  # and its holder can still settle it


def test_a_ttl_does_not_end_at_a_recovery(db: SimDatabase) -> None:
    jobs = fdbqueue.Queue("jobs")
    jobs.enqueue(db, b"lives", ttl=60.0)
    recovery(db, 100.0)
    jobs.sweep(db)
    m = jobs.dequeue(db)
    assert m is not None and m.payload == b"lives"


def test_a_delayed_message_does_not_come_due_early(db: SimDatabase) -> None:
    jobs = fdbqueue.Queue("jobs")
    jobs.enqueue(db, b"later", delay=60.0)
    recovery(db, 100.0)
    jobs.sweep(db)
    assert jobs.dequeue(db) is None


def test_a_dedup_key_still_deduplicates(db: SimDatabase) -> None:
    jobs = fdbqueue.Queue("jobs")
    fdbqueue.create_queue(db, "jobs", dedup_window=60.0)
    first = jobs.enqueue(db, b"a", dedup_key="k")
    recovery(db, 100.0)
    assert jobs.enqueue(db, b"b", dedup_key="k") == first
    assert jobs.size(db) == 1


def test_the_journal_is_not_trimmed_early(db: SimDatabase) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True, journal_retention=60.0)
    jobs = fdbqueue.Queue("jobs")
    jobs.enqueue(db, b"kept")
    recovery(db, 100.0)
    assert trim_journal(db, "jobs") == 0
    assert [e.op for e in fdbqueue.journal(db, "jobs")] == ["create", "enqueue"]


def test_database_time_does_not_count_the_jump(db: SimDatabase) -> None:
    before = now(db)
    recovery(db, 100.0)
    assert now(db) - before < 10_000_000  # well under the 100 s jump
    # a client that had no baseline (another process) reads the correction recorded
    assert now(db) - before < 10_000_000


def test_a_week_long_forced_recovery(db: SimDatabase) -> None:
    jobs = fdbqueue.Queue("jobs")
    jobs.enqueue(db, b"later", delay=3600.0)
    recovery(db, 7 * 24 * 3600.0)
    jobs.sweep(db)
    assert jobs.dequeue(db) is None


def test_two_clients_that_see_one_jump_count_it_once(db: SimDatabase) -> None:
    # Two clients (their own baselines: a counting wrapper is another client to the clock).
    other = CountingDatabase(db)
    before = now(db)
    assert abs(run_transaction(other, db_now) - before) < 5_000_000  # type: ignore[arg-type]
    recovery(db, 100.0)
    mine = db.create_transaction()
    theirs = other.create_transaction()
    t_mine, t_theirs = db_now(mine), db_now(theirs)  # type: ignore[arg-type]
    assert t_mine - before < 10_000_000 and t_theirs - before < 10_000_000
    theirs.commit()  # records the correction
    with pytest.raises(EngineError) as err:
        mine.commit()  # recorded it too: the second conflicts ...
    assert err.value.code == 1020
    # ... and its retry finds the first's correction: counted once, by every client
    assert now(db) - before < 10_000_000
    assert run_transaction(other, db_now) - before < 10_000_000  # type: ignore[arg-type]


def test_a_client_that_starts_after_a_recorded_jump_counts_it_out() -> None:
    db = fdbqueue.open("sim://?seed=8&faults=0")
    before = now(db)
    recovery(db, 100.0)
    now(db)  # a client running at the recovery records the jump
    late = CountingDatabase(db)  # a client that starts afterwards: no baseline of its own
    assert run_transaction(late, db_now) - before < 10_000_000  # type: ignore[arg-type]
    db.close()


def test_a_transaction_that_began_before_the_correction_committed_counts_the_jump_out(
    db: SimDatabase,
) -> None:
    # The cluster model's spread+recovery run lost messages to "expired" this way: many
    # transactions of one client took read versions right after the jump; one recorded the
    # correction, the next read it back and moved the client's baseline past the jump; the
    # others' snapshots (older than the correction's commit) had no correction, and against
    # the moved baseline saw no jump: database time 100 s ahead, TTLs ended.
    before = now(db)
    recovery(db, 100.0)
    stale = db.create_transaction()
    stale.get_read_version()  # after the jump, before any correction commits
    now(db)  # records the correction
    now(db)  # reads it back: the client's baseline moves past the jump
    assert db_now(stale) - before < 10_000_000  # type: ignore[arg-type]
    stale.cancel()
