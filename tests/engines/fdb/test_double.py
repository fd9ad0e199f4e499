"""The C-API double itself (tests/support/fdbdouble/) and the layer through the bindings over it.

What the bindings ask of libfdb_c (error predicates and descriptions, options, errcheck),
a differential run against the sim engine, round trips made visible by a read latency, and
the queue drained by threads while the sim store injects faults. Skipped on a real cluster
where they look behind the bindings.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

import fdbqueue
from fdbqueue.engines import fdb as fdb_engine
from tests.models.test_differential import TRANSACTIONS, run_stream
from tests.support.engines import double_only, fdb_cluster_file

# ---------------------------------------------------------------------------------------------
# The layer through the bindings under injected faults (1020, 1007, 1021 from the sim store)


def test_threads_drain_exactly_once_through_the_bindings_under_faults(tmp_path: Path) -> None:
    from tests.processes.test_concurrency import check_exactly_once, fill

    fdb_cluster_file(tmp_path)  # a real cluster, or the double installed
    double = double_only()  # the faults are the sim store's
    cluster_file = double.new_cluster_file(str(tmp_path), sim_url="sim://?seed=3&faults=0.03")
    db = fdbqueue.open(f"fdb://{cluster_file}")
    q = fdbqueue.Queue("drain")
    ids = fill(db, q, n=1500, batch=250)
    got: list[list[str]] = [[] for _ in range(6)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(got))

    def consume(mine: list[str]) -> None:
        try:
            start.wait()
            while (m := q.dequeue(db)) is not None:
                mine.append(m.id)
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(g,)) for g in got]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # interleave the transactions so that they collide
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads), "a consumer hung"
    assert not errors, errors
    check_exactly_once(ids, [i for g in got for i in g])
    assert [m.id for m in q.browse(db)] == [] and q.size(db) == 0
    stats = double.sim_database(cluster_file).stats
    assert stats.faults, "no fault was injected"
    db.close()
    double.release(cluster_file)


# ---------------------------------------------------------------------------------------------
# The double itself: what the bindings ask of libfdb_c


@pytest.mark.parametrize("code", [1007, 1020, 1021, 1025, 1031, 1039, 2101, 1235, 1242])
def test_error_predicates_and_descriptions_as_libfdb_c(fdb_db: fdb_engine.FDBDatabase, code: int) -> None:
    import fdb

    from fdbqueue.errors import MAYBE_COMMITTED, RETRYABLE_NOT_COMMITTED

    err = fdb.FDBError(code)
    # fdb_error_predicate (bindings/c/fdb_c.cpp), asked through the bindings' fdb.predicates.
    assert fdb.predicates.is_maybe_committed(err) == (code in (1021, 1039)) == (code in MAYBE_COMMITTED)
    assert fdb.predicates.is_retryable_not_committed(err) == (code in RETRYABLE_NOT_COMMITTED)
    assert fdb.predicates.is_retryable(err) == (code in RETRYABLE_NOT_COMMITTED or code in (1021, 1039))
    assert str(err).endswith(f"({code})") and len(str(err)) > len(f"({code})") + 3


def test_options_the_double_does_not_model_are_refused_through_errcheck(
    fdb_db: fdb_engine.FDBDatabase,
) -> None:
    import fdb

    double_only()
    raw = fdb_db.create_transaction().fdb_transaction
    raw.options.set_causal_read_risky()  # changes nothing the sim models: accepted
    with pytest.raises(fdb.FDBError) as info:
        raw.options.set_size_limit(1000)  # would change the size limit: refused, not ignored
    assert info.value.code == 2108
    with pytest.raises(fdb.FDBError) as db_info:
        fdb_db.fdb_database.options.set_transaction_timeout(100)
    assert db_info.value.code == 2108


# ---------------------------------------------------------------------------------------------
# Differential: the bindings over the double must say what the sim engine says


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stream=TRANSACTIONS)
def test_the_bindings_over_the_double_agree_with_the_sim(
    stream: list[tuple[list[tuple[Any, ...]], str]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Every value, range, resolved selector, error code and the final contents: any difference
    # is a defect of the translation (engines/fdb.py, the bindings' use of it, or the double).
    directory = tmp_path_factory.mktemp("diff")
    fdb_cluster_file(directory)  # a real cluster, or the double installed
    double = double_only()
    cluster_file = double.new_cluster_file(str(directory), sim_url="memory://")
    try:
        assert run_stream(f"fdb://{cluster_file}", stream) == run_stream("memory://", stream)
    finally:
        double.release(cluster_file)


def test_a_read_latency_makes_round_trips_visible(tmp_path: Path) -> None:
    # With read_latency, a read's future is ready only later: reads waited on one by one
    # cost one latency each, reads issued together (futures first, then waits) one in all.
    fdb_cluster_file(tmp_path)  # a real cluster, or the double installed
    double = double_only()
    cluster_file = double.new_cluster_file(str(tmp_path), read_latency=0.05)
    db = fdbqueue.open(f"fdb://{cluster_file}")
    try:
        tr = db.create_transaction()
        for i in range(8):
            tr.set(b"k%d" % i, b"v%d" % i)
        tr.commit()
        tr = db.create_transaction()
        tr.get_read_version()
        started = time.monotonic()
        assert [tr.get(b"k%d" % i) for i in range(8)] == [b"v%d" % i for i in range(8)]
        sequential = time.monotonic() - started
        raw = db.create_transaction().fdb_transaction
        raw.get_read_version().wait()
        started = time.monotonic()
        futures = [raw.get(b"k%d" % i) for i in range(8)]
        assert [bytes(f.wait()) for f in futures] == [b"v%d" % i for i in range(8)]
        together = time.monotonic() - started
        assert sequential >= 8 * 0.05
        assert together < 4 * 0.05
    finally:
        db.close()
        double.release(cluster_file)
