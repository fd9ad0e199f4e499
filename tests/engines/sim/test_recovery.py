"""fdbqueue.testing.recovery: the sim's versions jump as at a FoundationDB recovery.

A recovery makes the new master start ``MAX_VERSIONS_IN_FLIGHT`` (100e6, fdbserver knobs)
versions past the last committed one: 100 seconds of versions, while no time passes. A
transaction that read before the recovery cannot commit after it (transaction_too_old).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import EngineError
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.engines.sim.store import ManualClock
from fdbqueue.testing import FaultScriptError, recovery


@pytest.fixture
def db() -> Iterator[SimDatabase]:
    database = fdbqueue.open("sim://?seed=1")
    assert isinstance(database, SimDatabase)
    yield database
    database.close()


def read_version(db: SimDatabase) -> int:
    return int(db.create_transaction().get_read_version())


def test_versions_jump_by_max_versions_in_flight(db: SimDatabase) -> None:
    before = read_version(db)
    recovery(db)  # jump=100.0: MAX_VERSIONS_IN_FLIGHT = 100e6 versions
    after = read_version(db)
    assert after - before >= 100_000_000
    assert after - before < 100_000_000 + 5_000_000  # the jump, not a minute more


def test_the_jump_is_given_in_seconds(db: SimDatabase) -> None:
    before = read_version(db)
    recovery(db, jump=7 * 24 * 3600.0)  # a forced recovery: about a week
    assert read_version(db) - before >= 7 * 24 * 3600 * 1_000_000


def test_no_time_passes() -> None:
    clock = ManualClock(1000.0)
    db = SimDatabase(clock=clock)
    before = read_version(db)
    recovery(db, jump=100.0)
    assert clock.now() == 1000.0
    assert read_version(db) - before >= 100_000_000 - 1  # a read version is one below the clock
    db.close()


def test_commits_after_are_above_the_jump(db: SimDatabase) -> None:
    recovery(db)
    tr = db.create_transaction()
    rv = int(tr.get_read_version())
    tr.set(b"k", b"v")
    tr.commit()
    assert tr.get_committed_version() > rv
    t2 = db.create_transaction()
    assert t2.get(b"k") == b"v"


def test_a_transaction_read_before_cannot_commit_after(db: SimDatabase) -> None:
    tr = db.create_transaction()
    tr.get(b"k")
    recovery(db)
    tr.set(b"k", b"v")
    with pytest.raises(EngineError) as err:
        tr.commit()
    assert err.value.code == 1007


def test_other_engines_refuse(tmp_path: Path) -> None:
    lite = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    with pytest.raises(FaultScriptError, match="sim://"):
        recovery(lite)
    lite.close()


@pytest.mark.parametrize("jump", [-1.0, float("nan"), float("inf"), "100", True])
def test_bad_jumps_are_refused(db: SimDatabase, jump: object) -> None:
    before = read_version(db)
    with pytest.raises(FaultScriptError, match="jump"):
        recovery(db, jump=jump)  # type: ignore[arg-type]
    assert read_version(db) - before < 50_000_000


@pytest.mark.parametrize("jump", [1e13, 1e30, 10**30])
def test_a_jump_past_the_version_range_is_refused_and_the_database_still_works(
    db: SimDatabase, jump: float
) -> None:
    # FoundationDB's Version is an int64_t (fdbclient/include/fdbclient/FDBTypes.h); a jump that
    # takes the versions past it would leave every later commit unable to make its versionstamp.
    with pytest.raises(FaultScriptError, match="jump"):
        recovery(db, jump=jump)
    jobs = fdbqueue.Queue("jobs")
    jobs.enqueue(db, b"x")
    assert jobs.dequeue(db) is not None
