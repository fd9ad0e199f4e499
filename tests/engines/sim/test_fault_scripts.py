"""fdbqueue.testing: scripted commit outcomes, retry-backoff hooks and outages on the sim engine.

Which outcome a commit may get follows FoundationDB: 1020 only with read conflict ranges of
the transaction's own (Transaction::makeSelfConflicting gives every other writer a range on a
unique key, fdbclient/NativeAPI.actor.cpp), 1007 only with a read version taken before commit,
the maybe-committed codes (fdb_error_predicate, bindings/c/fdb_c.cpp) on any commit with writes,
nothing on a read-only commit (Transaction::commitMutations returns at once).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import ClusterUnavailableError, EngineError, QueueError
from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import engine_traits
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.testing import FaultScript, FaultScriptError, on_backoff, outage


@pytest.fixture
def db() -> Any:
    database = fdbqueue.open("sim://?seed=1")
    assert isinstance(database, SimDatabase)
    yield database
    database.close()


def code_of(fn: Callable[[], object]) -> int:
    with pytest.raises(EngineError) as err:
        fn()
    return err.value.code


def read_write(db: SimDatabase, key: bytes) -> Callable[[], None]:
    """One attempt of a transaction that reads serializably, then writes ``key``."""

    def attempt() -> None:
        tr = db.create_transaction()
        tr.get(b"guard")
        tr[key] = b"v"
        tr.commit()

    return attempt


def blind_write(db: SimDatabase, key: bytes) -> Callable[[], None]:
    def attempt() -> None:
        tr = db.create_transaction()
        tr[key] = b"v"
        tr.commit()

    return attempt


# -- FaultScript ------------------------------------------------------------------------------


def test_each_outcome_ends_a_read_write_commit_as_scripted(db: SimDatabase) -> None:
    script = FaultScript(db)
    outcomes: list[Any] = [
        None,
        1020,
        1007,
        ("1021", True),
        ("1021", False),
        ("1039", True),
        ("1039", False),
        ("1031", True),
        ("1031", False),
        ("1025", True),
        ("1025", False),
    ]
    script.arm(outcomes)
    for i, outcome in enumerate(outcomes):
        key = b"k/%d" % i
        if outcome is None:
            read_write(db, key)()
            assert db[key] == b"v"
            continue
        code = outcome if isinstance(outcome, int) else int(outcome[0])
        assert code_of(read_write(db, key)) == code
        applied = isinstance(outcome, tuple) and outcome[1]
        assert (db[key] is not None) == applied, outcome
    assert script.fired == outcomes and script.skipped == [] and script.pending == []
    assert db.stats.faults == {1020: 1, 1007: 1, 1021: 2, 1039: 2, 1031: 2, 1025: 2}


def test_retryable_outcomes_are_retried_and_fatal_ones_leave_the_transaction_cancelled(
    db: SimDatabase,
) -> None:
    script = FaultScript(db)
    script.arm([1020, ("1039", False), 1007, ("1021", True)])
    calls = []

    def body(tr: Any) -> None:
        calls.append(1)
        tr.get(b"guard")
        tr[b"k"] = b"%d" % len(calls)

    run_transaction(db, body)
    assert len(calls) == 5 and db[b"k"] == b"5"  # 1021 applied "4", then the retry wrote "5"

    script.arm([("1031", True)])
    tr = db.create_transaction()
    tr[b"t"] = b"timed out, landed"
    assert code_of(tr.commit) == 1031
    # Not retryable (fdb_error_predicate); timed out until reset: on_error and every later
    # call raise 1031 (RYW's resetPromise; RYWImpl::onError rethrows it).
    assert code_of(lambda: tr.on_error(EngineError(1031))) == 1031
    assert code_of(lambda: tr.get(b"t")) == 1031
    assert db[b"t"] == b"timed out, landed"

    script.arm([("1025", False)])
    tr = db.create_transaction()
    tr[b"c"] = b"cancelled during commit"
    assert code_of(tr.commit) == 1025
    assert code_of(lambda: tr.get(b"c")) == 1025
    assert db[b"c"] is None


def test_a_timed_out_or_cancelled_commit_may_land_after_the_error(db: SimDatabase) -> None:
    """RYWImpl::simulateTimeoutInFlightCommit (fdbclient/ReadYourWrites.cpp): a commit that
    timed out may still be committed afterwards. Here it lands when the next commit with
    writes reaches the store, checked for conflicts with its own read version."""
    script = FaultScript(db)
    script.arm([("1031", "later")])
    tr = db.create_transaction()
    tr[b"late"] = b"1"
    assert code_of(tr.commit) == 1031
    assert db[b"late"] is None  # not yet: a reader may look in between
    blind_write(db, b"next")()
    assert db[b"late"] == b"1"

    tr = db.create_transaction()  # read guard, which changed before it landed: dropped
    tr.get(b"guard")
    db[b"guard"] = b"changed"
    tr[b"dropped"] = b"1"
    script.arm([("1025", "later")])
    assert code_of(tr.commit) == 1025
    blind_write(db, b"next")()  # the in-flight commit reaches the resolver first
    assert db[b"dropped"] is None and db[b"next"] == b"v"

    tr = db.create_transaction()  # too old by the time it lands: dropped too
    assert tr.get(b"guard") == b"changed"
    tr[b"old"] = b"1"
    script.arm([("1031", "later")])
    assert code_of(tr.commit) == 1031
    clock_before = db.clock()
    db.clock = lambda: clock_before + 6.0  # type: ignore[method-assign]
    blind_write(db, b"after")()
    assert db[b"old"] is None and db[b"after"] == b"v"
    assert db.sizes()["live"] == 0


def test_a_conflict_is_never_scripted_onto_a_blind_write(db: SimDatabase) -> None:
    """An armed 1020 meeting a commit without read conflicts of its own: the commit goes
    through, the entry is spent (listed in ``skipped``); the next commit takes the next entry."""
    script = FaultScript(db)
    script.arm([1020, 1007, 1020])
    blind_write(db, b"a")()  # 1020: no read conflict range of its own
    assert db[b"a"] == b"v"
    tr = db.create_transaction()  # 1007: a read version only from commit
    tr.add_read_conflict_key(b"guard")
    tr[b"b"] = b"v"
    tr.commit()
    assert db[b"b"] == b"v"
    assert code_of(read_write(db, b"c")) == 1020
    assert script.skipped == [1020, 1007] and script.fired == [1020]
    assert db.stats.faults == {1020: 1}


def test_snapshot_reads_make_1007_possible_but_not_1020(db: SimDatabase) -> None:
    script = FaultScript(db)
    script.arm([1020, 1007])

    def snapshot_then_write(key: bytes) -> Callable[[], None]:
        def attempt() -> None:
            tr = db.create_transaction()
            tr.snapshot.get(b"guard")
            tr[key] = b"v"
            tr.commit()

        return attempt

    snapshot_then_write(b"a")()
    assert code_of(snapshot_then_write(b"b")) == 1007
    assert script.skipped == [1020] and db[b"b"] is None


def test_read_only_commits_consume_nothing(db: SimDatabase) -> None:
    script = FaultScript(db)
    script.arm([1020])
    tr = db.create_transaction()
    tr.get(b"guard")
    tr.commit()
    assert script.pending == [1020]
    assert code_of(read_write(db, b"k")) == 1020


def test_past_the_script_the_seeded_faults_decide_again() -> None:
    db = fdbqueue.open("sim://?seed=2&faults=1.0")
    assert isinstance(db, SimDatabase)
    script = FaultScript(db)
    script.arm([None, None])
    read_write(db, b"a")()
    read_write(db, b"b")()
    with pytest.raises(EngineError):  # faults=1: every commit draws a fault
        read_write(db, b"c")()
    script.detach()
    assert db.may_commit_unknown  # faults=1.0
    with FaultScript(db) as script:
        script.arm([None])
        read_write(db, b"d")()
    assert script.pending == [] and db.fault_source is None


def test_enqueue_survives_every_scripted_outcome(db: SimDatabase) -> None:
    """Each enqueue's first commit ends as scripted; each message is there once, in order.

    (Enqueue reads its queue's settings serializably, so FoundationDB can give it 1020 when
    the settings change concurrently: it is conflict-free against other enqueues only.)
    """
    fdbqueue.create_queue(db, "jobs")
    q = Queue("jobs")
    script = FaultScript(db)
    outcomes: list[Any] = [1020, 1007, ("1021", True), ("1021", False), ("1039", True), ("1039", False)]
    ids = []
    for outcome in outcomes:
        script.arm([outcome])
        ids.append(q.enqueue(db, b"m"))
        assert script.fired == [outcome], script.skipped
        script.fired.clear()
    assert [m.id for m in q.browse(db)] == ids


def test_a_scripted_database_may_commit_unknown(db: SimDatabase) -> None:
    assert not db.may_commit_unknown  # faults=0: the layer may skip its receipts
    script = FaultScript(db)
    assert db.may_commit_unknown
    script.detach()
    assert not db.may_commit_unknown


def test_engine_traits_follow_a_property_at_every_call(db: SimDatabase) -> None:
    """engine_traits keeps a class's plain attributes, never a property's answer (issue 30)."""
    assert engine_traits(db) == (True, False)
    script = FaultScript(db)
    assert engine_traits(db) == (True, True)
    script.detach()
    assert engine_traits(db) == (True, False)


@pytest.mark.parametrize(
    "bad", [1021, 1031, ("1020", True), ("1021", "yes"), ("1021", "later"), (1021,), "1020", 2101, True]
)
def test_bad_outcomes_are_refused_before_anything_is_armed(db: SimDatabase, bad: Any) -> None:
    script = FaultScript(db)
    script.arm([1020])
    with pytest.raises(FaultScriptError, match="bad outcome"):
        script.arm([None, bad])
    assert script.pending == [1020]


@pytest.mark.parametrize("engine", ["memory", "sqlite"])
def test_other_engines_are_refused(tmp_path: Path, engine: str) -> None:
    other = fdbqueue.open("memory://" if engine == "memory" else f"sqlite://{tmp_path / 'store.db'}")
    calls: list[Callable[[], object]] = [
        lambda: FaultScript(other),
        lambda: outage(other).__enter__(),
        lambda: on_backoff(other, lambda: None),
    ]
    for call in calls:
        with pytest.raises(FaultScriptError, match=r"needs a sim:// database") as err:
            call()
        assert isinstance(err.value, TypeError) and isinstance(err.value, QueueError)
    other.close()


# -- on_backoff -------------------------------------------------------------------------------


def test_on_backoff_runs_between_a_failed_commit_and_its_retry(db: SimDatabase) -> None:
    script = FaultScript(db)
    seen: list[bytes | None] = []
    script.arm([1020, 1020])
    on_backoff(db, lambda: seen.append(db[b"k"]), times=1)

    def body(tr: Any) -> None:
        tr.get(b"guard")
        tr[b"k"] = b"v"

    on_backoff(db, lambda: db.set(b"other", b"x"))
    run_transaction(db, body)
    assert seen == [None] and db[b"other"] == b"x" and db[b"k"] == b"v"
    run_transaction(db, body)  # no hook left, nothing armed
    assert seen == [None]


# -- outage -----------------------------------------------------------------------------------


def test_outage_refuses_every_call_and_loses_nothing(db: SimDatabase) -> None:
    db[b"kept"] = b"1"
    open_tr = db.create_transaction()
    assert open_tr.get(b"kept") == b"1"
    open_tr[b"pending"] = b"x"
    with outage(db):
        with pytest.raises(ClusterUnavailableError):
            db.create_transaction()
        with pytest.raises(ClusterUnavailableError):
            db.get(b"kept")
        for call in (
            lambda: open_tr.get(b"kept"),
            lambda: open_tr.snapshot.get_range(b"", b"\xff"),
            lambda: open_tr.get_read_version(),
            lambda: open_tr.set(b"more", b"y"),
            lambda: open_tr.add(b"n", b"\x01"),
            lambda: open_tr.clear_range(b"a", b"b"),
            open_tr.commit,
        ):
            with pytest.raises(ClusterUnavailableError):
                call()
        with outage(db):  # nests
            pass
        with pytest.raises(ClusterUnavailableError):
            db.create_transaction()
    open_tr.cancel()  # still possible: cleanup works during and after
    assert db[b"kept"] == b"1" and db[b"pending"] is None
    db[b"after"] = b"2"
    assert db[b"after"] == b"2"


def test_a_layer_call_during_an_outage_fails_cleanly(db: SimDatabase) -> None:
    fdbqueue.create_queue(db, "jobs")
    q = Queue("jobs")
    first = q.enqueue(db, b"A")
    with outage(db):
        with pytest.raises(ClusterUnavailableError):
            q.enqueue(db, b"B")
        with pytest.raises(ClusterUnavailableError):
            q.dequeue(db)
    m = q.dequeue(db)
    assert m is not None and m.id == first and q.dequeue(db) is None
