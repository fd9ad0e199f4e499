"""The FoundationDB engine.

Three layers: what ``fdbqueue.open("fdb://...")`` says on this machine (in a child process,
so without the double); the translation layer run through the official bindings, over a
real cluster when one is reachable and otherwise over the C-API double of
tests/support/fdbdouble/ (so the bindings' fdb/impl.py runs for real: futures, callbacks,
streaming range reads, options, on_error, watches, versionstamps); and a smoke test on a
real cluster, skipped with the reason when none is reachable (tests/support/fdb_cluster.py).
"""

from __future__ import annotations

import gc
import json
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue.engines import fdb as fdb_engine
from fdbqueue.engines.contract import (
    Database,
    KeySelector,
    KeyValue,
    ReadView,
    Transaction,
    Watch,
    is_transaction,
)
from fdbqueue.engines.transactional import run_transaction, transactional
from fdbqueue.errors import ClusterUnavailableError, EngineError, InvalidURLError
from tests.support import fdbdouble as fdb_double
from tests.support.engines import double_only, fdb_cluster_file
from tests.support.fdb_cluster import client_library, find_cluster

# ---------------------------------------------------------------------------------------------
# Opening, on this machine as it is


_OPEN = r"""
import json, sys
import fdbqueue
try:
    fdbqueue.open(sys.argv[1])
except fdbqueue.QueueError as exc:
    print(json.dumps([type(exc).__name__, str(exc), exc.__cause__ is None, exc.__suppress_context__]))
"""


def open_in_child(url: str) -> list[Any]:
    """What ``fdbqueue.open(url)`` raises in a fresh process (no double installed)."""
    proc = subprocess.run([sys.executable, "-c", _OPEN, url], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return list(json.loads(proc.stdout))


def test_open_default_cluster_says_what_is_missing(tmp_path: Path) -> None:
    library = client_library()
    if not library.loadable:
        # This machine: no libfdb_c. The error says so and how to get it, with no
        # traceback from inside the bindings attached.
        kind, message, no_cause, suppressed = open_in_child("fdb://")
        assert kind == "ClusterUnavailableError"
        assert "client library" in message
        assert "libfdb_c" in message
        assert "foundationdb-clients" in message
        assert no_cause and suppressed
    else:
        cluster_file = tmp_path / "fdb.cluster"
        cluster_file.write_text("test:unreachable@127.0.0.1:1\n")
        kind, message, _, _ = open_in_child(f"fdb://{cluster_file}?timeout=2")
        assert kind == "ClusterUnavailableError"
        assert f"cannot reach the FoundationDB cluster described by {cluster_file} within 2 s" in message


def test_missing_cluster_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "fdb.cluster"
    with pytest.raises(ClusterUnavailableError) as info:
        fdbqueue.open(f"fdb://{missing}")
    assert str(missing) in str(info.value)
    assert "does not exist" in str(info.value)


@pytest.mark.parametrize(
    ("query", "needle"),
    [
        ("api_version=abc", "api_version must be an integer"),
        ("api_version=", "api_version must be an integer"),
        ("api_version=99999", "out of range"),
        ("api_version=100", "out of range"),
        # Below 610 on_error resets the timeout and retry limit; below 700 commit resets the
        # transaction (documentation/sphinx/source/api-version-upgrade-guide.rst).
        ("api_version=700", "needs 710 or newer"),
        ("api_version=630", "needs 710 or newer"),
        ("timeout=0", "timeout must be a positive number"),
        ("timeout=soon", "timeout must be a positive number"),
        ("region=x", "unknown parameter"),
        ("tenant=", "needs a tenant's name"),
    ],
)
def test_bad_parameters_are_invalid_urls(query: str, needle: str) -> None:
    with pytest.raises(InvalidURLError, match=needle):
        fdbqueue.open(f"fdb://?{query}")


_OLD_BINDINGS = r"""
import importlib.metadata, sys
import fdb
# The 7.1 and 7.3 wheels define neither fdb.__version__ nor (7.1) fdb.LATEST_API_VERSION.
vars(fdb).pop("__version__", None)
vars(fdb).pop("LATEST_API_VERSION", None)
real = importlib.metadata.version
importlib.metadata.version = lambda name: "7.1.67" if name == "foundationdb" else real(name)
import fdbqueue.engines.fdb as engine
print(engine.BINDINGS_VERSION, engine.LATEST_API_VERSION, engine.DEFAULT_API_VERSION)
print(engine.CLIENT_LIBRARY_MISSING)
"""


def test_engine_imports_with_bindings_older_than_8() -> None:
    proc = subprocess.run([sys.executable, "-c", _OLD_BINDINGS], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    first, message = proc.stdout.splitlines()[:2]
    assert first == "7.1.67 710 710"
    assert "'foundationdb' Python bindings 7.1.67 installed here need libfdb_c 7.1" in message


# ---------------------------------------------------------------------------------------------
# The translation layer over the official bindings: on a real cluster when one is reachable,
# otherwise over the C-API double (tests/support/fdbdouble/), so fdb/impl.py runs for real.


def test_the_bindings_run_over_the_double_or_a_cluster(fdb_db: fdb_engine.FDBDatabase) -> None:
    import fdb

    raw = fdb_db.create_transaction().fdb_transaction
    assert type(raw) is fdb.Transaction and type(fdb_db.fdb_database) is fdb.Database
    double = fdb_double.installed()
    if double is not None:
        assert fdb.impl._capi is double and double.api_version == fdb_engine.DEFAULT_API_VERSION


def test_reads_return_plain_bytes_or_none(fdb_db: fdb_engine.FDBDatabase) -> None:
    fdb_db[b"a"] = b"1"
    tr = fdb_db.create_transaction()
    value = tr.get(b"a")
    assert type(value) is bytes and value == b"1"
    assert tr.get(b"missing") is None
    assert tr[b"a"] == b"1"
    assert tr.snapshot.get(b"missing") is None
    fdb_db[b"empty"] = b""
    assert fdb_db.create_transaction().get(b"empty") == b""


def test_range_reads_are_lists_of_keyvalues_and_selectors_are_converted(
    fdb_db: fdb_engine.FDBDatabase,
) -> None:
    for k in (b"a", b"b", b"c", b"d"):
        fdb_db[k] = k.upper()
    tr = fdb_db.create_transaction()
    rows = tr.get_range(b"b", b"d")
    assert rows == [KeyValue(b"b", b"B"), KeyValue(b"c", b"C")]
    assert all(type(r) is KeyValue for r in rows)
    assert tr.get_range(b"a", b"\xff", limit=2, reverse=True) == [KeyValue(b"d", b"D"), KeyValue(b"c", b"C")]
    assert tr.get_range(KeySelector.first_greater_than(b"a"), KeySelector.first_greater_or_equal(b"c")) == [
        KeyValue(b"b", b"B")
    ]
    assert tr.get_key(KeySelector.last_less_than(b"c")) == b"b"
    assert type(tr.get_key(KeySelector.last_less_than(b"c"))) is bytes
    assert [kv.key for kv in tr.get_range_startswith(b"")] == [b"a", b"b", b"c", b"d"]
    assert tr[b"b":b"d"] == rows  # type: ignore[index,comparison-overlap]
    with pytest.raises(EngineError) as info:
        tr.get_range(b"a", b"z", limit=-1)
    assert info.value.code == 2006


def test_large_ranges_stream_in_batches_and_read_whole(fdb_db: fdb_engine.FDBDatabase) -> None:
    # 400 rows of 1 KB: more than one batch of any streaming mode (fdb_c.cpp caps a batch at
    # 120,000 bytes), so the bindings' continuation from the last key runs.
    tr = fdb_db.create_transaction()
    for i in range(400):
        tr.set(b"r%04d" % i, bytes([i % 251]) * 1000)
    tr.commit()
    double = fdb_double.installed()
    before = double.calls["fdb_transaction_get_range"] if double else 0
    rows = fdb_db.create_transaction().get_range(b"r", b"s")
    assert [kv.key for kv in rows] == [b"r%04d" % i for i in range(400)]
    if double is not None:
        # The engine materialises the list, so it asks for want_all from the first batch (the
        # bindings' default, iterator, would start with a 4,096-byte batch): serial batches
        # of 120,000 bytes (bindings/c/fdb_c.cpp) at 8 + 5 + 1000 bytes a row, 119 rows each.
        assert double.calls["fdb_transaction_get_range"] - before == 4
        before = double.calls["fdb_transaction_get_range"]
        assert len(fdb_db.create_transaction().get_range(b"r", b"s", limit=150)) == 150
        assert double.calls["fdb_transaction_get_range"] - before == 1  # exact: one batch
    back = fdb_db.create_transaction().get_range(b"r", b"s", reverse=True)
    assert [kv.key for kv in back] == [b"r%04d" % i for i in reversed(range(400))]
    import fdb

    raw = fdb_db.create_transaction().fdb_transaction
    for mode in (fdb.StreamingMode.iterator, fdb.StreamingMode.small, fdb.StreamingMode.serial):
        assert len(list(raw.get_range(b"r", b"s", streaming_mode=mode))) == 400
    assert len(raw.get_range(b"r", b"s", limit=150, streaming_mode=fdb.StreamingMode.exact).to_list()) == 150


def test_a_partly_read_range_conflicts_only_where_it_was_read(fdb_db: fdb_engine.FDBDatabase) -> None:
    import fdb

    tr = fdb_db.create_transaction()
    for i in range(100):
        tr.set(b"p%03d" % i, b"x" * 100)
    tr.commit()
    reader = fdb_db.create_transaction()
    rows = iter(reader.fdb_transaction.get_range(b"p", b"q", streaming_mode=fdb.StreamingMode.small))
    assert next(rows).key == b"p000"  # one batch of the small mode (256 bytes: 3 rows)
    fdb_db[b"p050"] = b"changed"  # far past the batch read
    reader.set(b"out", b"1")
    reader.commit()  # no conflict: the read conflict range ends after the last row returned
    again = fdb_db.create_transaction()
    assert len(again.get_range(b"p", b"q")) == 100
    fdb_db[b"p099"] = b"changed"
    again.set(b"out", b"2")
    with pytest.raises(EngineError) as info:
        again.commit()
    assert info.value.code == 1020


def test_snapshot_reads_add_no_conflicts(fdb_db: fdb_engine.FDBDatabase) -> None:
    fdb_db[b"x"] = b"0"
    snap = fdb_db.create_transaction()
    serial = fdb_db.create_transaction()
    assert snap.snapshot.get(b"x") == b"0" and serial.get(b"x") == b"0"
    assert snap.snapshot.get_range(b"", b"\xff") == [KeyValue(b"x", b"0")]
    fdb_db[b"x"] = b"1"
    snap.set(b"y", b"1")
    snap.commit()
    serial.set(b"y", b"2")
    with pytest.raises(EngineError) as info:
        serial.commit()
    assert info.value.code == 1020 and info.value.retryable and info.value.during_commit


def test_bindings_errors_become_engine_errors_with_the_original_as_cause(
    fdb_db: fdb_engine.FDBDatabase,
) -> None:
    import fdb

    tr = fdb_db.create_transaction()
    with pytest.raises(EngineError) as inverted:
        tr.add_read_conflict_range(b"b", b"a")
    assert inverted.value.code == 2005
    assert isinstance(inverted.value.__cause__, fdb.FDBError) and inverted.value.__cause__.code == 2005
    assert "b'" not in str(inverted.value)  # fdb_get_error's bytes are decoded


def test_write_arguments_are_checked_at_the_call(fdb_db: fdb_engine.FDBDatabase) -> None:
    tr = fdb_db.create_transaction()
    with pytest.raises(EngineError) as big_key:
        tr.set(b"k" * 10_001, b"v")
    assert big_key.value.code == 2102
    with pytest.raises(EngineError) as big_value:
        tr.set(b"k", b"v" * 100_001)
    assert big_value.value.code == 2103
    with pytest.raises(EngineError) as system:
        tr.set(b"\xff/x", b"v")
    assert system.value.code == 2004
    with pytest.raises(EngineError) as inverted:
        tr.clear_range(b"b", b"a")
    assert inverted.value.code == 2005
    with pytest.raises(TypeError):
        tr.set("text", b"v")  # type: ignore[arg-type]


def test_a_raw_write_error_surfaces_at_the_commit_and_is_not_retried(fdb_db: fdb_engine.FDBDatabase) -> None:
    # libfdb_c's writes return nothing: a bad one fails the commit (deferredError,
    # fdbclient/ThreadSafeTransaction.cpp). Written through the escape hatch, unchecked.
    tr = fdb_db.create_transaction()
    tr.fdb_transaction.set(b"\xff\x01", b"v")
    with pytest.raises(EngineError) as info:
        tr.commit()
    assert info.value.code == 2004
    with pytest.raises(EngineError) as again:
        tr.on_error(info.value)
    assert again.value is info.value


def test_writes_clears_and_atomic_ops(fdb_db: fdb_engine.FDBDatabase) -> None:
    @transactional
    def work(tr: Any) -> None:
        tr[b"p/1"] = b"x"
        tr[b"p/2"] = b"y"
        tr[b"q"] = b"z"
        tr.add(b"n", struct.pack("<q", 5))
        tr.add(b"n", struct.pack("<q", -2))
        tr.max(b"m", struct.pack("<q", 9))
        tr.byte_min(b"b", b"abc")
        tr.bit_and(b"and", b"\x0f")  # absent key: AND_V2 from API 510 writes the parameter
        tr.min(b"min", b"\x05")

    work(fdb_db)
    assert struct.unpack("<q", fdb_db[b"n"] or b"")[0] == 3
    assert fdb_db[b"m"] == struct.pack("<q", 9) and fdb_db[b"b"] == b"abc"
    assert fdb_db[b"and"] == b"\x0f" and fdb_db[b"min"] == b"\x05"
    run_transaction(fdb_db, lambda tr: tr.clear_range_startswith(b"p/"))
    assert [kv.key for kv in fdb_db.get_range(b"", b"\xff")] == [b"and", b"b", b"m", b"min", b"n", b"q"]
    del fdb_db[b"q"]
    assert fdb_db[b"q"] is None


def test_retry_after_a_conflict_passes_the_original_error_and_reports_each_attempt(
    fdb_db: fdb_engine.FDBDatabase,
) -> None:
    import fdb

    finished: list[int | None] = []
    causes: list[Any] = []
    attempts = 0

    def body(tr: Any) -> str:
        nonlocal attempts
        attempts += 1
        tr.on_finish(lambda err: (finished.append(None if err is None else err.code), causes.append(err)))
        tr.get(b"k")
        if attempts == 1:
            fdb_db[b"k"] = b"other"  # commits after this attempt's read: a conflict
        tr[b"k"] = b"mine"
        return "done"

    assert run_transaction(fdb_db, body) == "done"
    assert attempts == 2
    assert finished == [1020, None]
    assert isinstance(causes[0].__cause__, fdb.FDBError)
    assert fdb_db[b"k"] == b"mine"


def test_on_error_resets_and_keeps_the_persistent_options(fdb_db: fdb_engine.FDBDatabase) -> None:
    tr = fdb_db.create_transaction()
    tr.options.set_retry_limit(1)
    tr.set(b"k", b"lost")
    tr.on_error(EngineError(1020, "raised by the layer"))  # retryable: backs off and resets
    assert tr.get(b"k") is None
    with pytest.raises(EngineError) as info:  # the retry limit survived the reset and is reached
        tr.on_error(EngineError(1020))
    assert info.value.code == 1020
    with pytest.raises(ValueError):
        fdb_db.create_transaction().on_error(ValueError("not an engine error"))
    with pytest.raises(EngineError) as fatal:
        fdb_db.create_transaction().on_error(EngineError(2101))
    assert fatal.value.code == 2101


def test_on_error_backs_off(fdb_db: fdb_engine.FDBDatabase) -> None:
    # The backoff is the sim's (Transaction::getBackoff's doubling, from the sim's base delay,
    # capped by max_retry_delay, jittered down to half): on_error's future is not ready before.
    base = double_only().sim_database(fdb_db.cluster_file).retry_base_delay
    tr = fdb_db.create_transaction()
    tr.options.set_max_retry_delay(40)
    started = time.monotonic()
    for _ in range(6):
        tr.on_error(EngineError(1020))
    least = sum(0.5 * min(0.040, base * 2**i) for i in range(6))
    assert time.monotonic() - started >= least


def test_on_finish_runs_once_on_reset_and_cancel(fdb_db: fdb_engine.FDBDatabase) -> None:
    seen: list[int] = []
    tr = fdb_db.create_transaction()
    tr.on_finish(lambda err: seen.append(err.code if err else 0))
    tr.reset()
    tr.cancel()
    assert seen == [1025]
    tr.on_finish(lambda err: seen.append(err.code if err else 0))
    tr.cancel()
    assert seen == [1025, 1025]
    with pytest.raises(EngineError) as info:
        tr.set(b"k", b"v")
    assert info.value.code == 1025
    tr.reset()
    tr.set(b"k", b"v")
    tr.commit()
    assert fdb_db[b"k"] == b"v"


def test_options_are_recorded_and_take_effect(fdb_db: fdb_engine.FDBDatabase) -> None:
    tr = fdb_db.create_transaction()
    tr.options.set_timeout(250)
    tr.options.set_retry_limit(3)
    tr.options.set_max_retry_delay(50)
    assert (tr.options.timeout_ms, tr.options.retry_limit, tr.options.max_retry_delay_ms) == (250, 3, 50)
    with pytest.raises(EngineError) as info:
        tr.options.set_timeout(-1)
    assert info.value.code == 2006
    tr.reset()
    assert tr.options.timeout_ms == 0
    timed = fdb_db.create_transaction()
    timed.options.set_timeout(1)
    # The timeout counts from the transaction's creation, as FoundationDB's RYW timebomb
    # does (fdbclient/ReadYourWrites.cpp): no operation before the sleep, whose own duration
    # on a loaded machine could already pass 1 ms.
    time.sleep(0.02)
    with pytest.raises(EngineError) as out:
        timed.get(b"k")
    assert out.value.code == 1031


def test_watch_waits_fires_and_fails(fdb_db: fdb_engine.FDBDatabase) -> None:
    tr = fdb_db.create_transaction()
    watch = tr.watch(b"k")
    tr.commit()
    assert not watch.is_ready()
    assert watch.wait(timeout=0.01) is False
    threading.Timer(0.05, lambda: fdb_db.set(b"k", b"changed")).start()
    assert watch.wait(timeout=5) is True
    assert watch.is_ready()

    failing_tr = fdb_db.create_transaction()
    failing_tr.get(b"c")
    failing = failing_tr.watch(b"w")
    fdb_db[b"c"] = b"conflict"
    failing_tr.set(b"c", b"mine")
    with pytest.raises(EngineError):
        failing_tr.commit()
    with pytest.raises(EngineError) as info:
        failing.wait(timeout=5)
    assert info.value.code == 1020

    tr = fdb_db.create_transaction()
    cancelled = tr.watch(b"k")
    tr.commit()
    cancelled.cancel()
    with pytest.raises(EngineError) as info:
        cancelled.wait(timeout=1)
    assert info.value.code == 1101


def test_dropping_an_unfired_watch_cancels_it(fdb_db: fdb_engine.FDBDatabase) -> None:
    double = double_only()
    tr = fdb_db.create_transaction()
    kept = tr.watch(b"kept")
    dropped = tr.watch(b"k")
    tr.commit()
    kept_handle = kept._future.fpointer  # type: ignore[attr-defined]
    dropped_handle = dropped._future.fpointer  # type: ignore[attr-defined]
    assert double.is_watching(kept_handle) and double.is_watching(dropped_handle)
    del dropped
    gc.collect()
    assert not double.is_watching(dropped_handle)  # fdb_future_destroy cancelled it
    assert double.is_watching(kept_handle)
    fdb_db[b"kept"] = b"fires"
    assert kept.wait(timeout=5)


def test_get_and_watch_and_versions(fdb_db: fdb_engine.FDBDatabase) -> None:
    fdb_db[b"k"] = b"1"
    value, watch = fdb_db.get_and_watch(b"k")
    assert value == b"1" and not watch.is_ready()
    tr = fdb_db.create_transaction()
    rv = tr.get_read_version()
    assert rv > 0
    stamp = tr.get_versionstamp()
    tr.set(b"k", b"2")
    tr.commit()
    committed = tr.get_committed_version()
    assert committed > rv
    assert stamp.wait() == struct.pack(">QH", committed, 0)
    assert watch.wait(timeout=5)
    read_only = fdb_db.create_transaction()
    read_only.get(b"k")
    ro_stamp = read_only.get_versionstamp()
    read_only.commit()
    assert read_only.get_committed_version() == -1
    with pytest.raises(EngineError) as info:
        ro_stamp.wait()
    assert info.value.code == 2021


def test_fdb_transactions_join_transactional_functions(fdb_db: fdb_engine.FDBDatabase) -> None:
    tr = fdb_db.create_transaction()
    assert is_transaction(tr)
    assert isinstance(tr, Transaction) and isinstance(tr.snapshot, ReadView)
    assert isinstance(fdb_db, Database) and isinstance(tr.watch(b"w"), Watch)

    @transactional
    def put(tr: Any, key: bytes) -> None:
        tr[key] = b"joined"

    put(tr, b"j")
    assert fdb_db[b"j"] is None  # not committed: it ran inside the caller's transaction
    tr.commit()
    assert fdb_db[b"j"] == b"joined"


def test_closed_database_refuses_transactions(fdb_db: fdb_engine.FDBDatabase) -> None:
    with fdb_db:
        pass
    with pytest.raises(fdbqueue.QueueError, match="closed"):
        fdb_db.create_transaction()


# ---------------------------------------------------------------------------------------------
# On a real cluster (skipped here with the reason when none is reachable)


@pytest.mark.fdb
def test_smoke_on_a_real_cluster() -> None:
    import fdb.tuple

    cluster_file = find_cluster()
    db = fdbqueue.open(f"fdb://{cluster_file}")
    prefix = fdb.tuple.pack(("fdbqueue-smoke",))
    try:
        db.clear_range(prefix, prefix + b"\xff")  # type: ignore[attr-defined]

        @transactional
        def fill(tr: Any) -> None:
            for i in range(5):
                tr[prefix + bytes([i])] = b"v%d" % i
            tr.add(prefix + b"n", struct.pack("<q", 7))
            tr.add(prefix + b"n", struct.pack("<q", 5))

        fill(db)
        assert db[prefix + bytes([2])] == b"v2"  # type: ignore[index]
        assert db[prefix + b"missing"] is None  # type: ignore[index]
        rows = db.get_range(prefix + bytes([1]), prefix + bytes([4]))  # type: ignore[attr-defined]
        assert [kv.value for kv in rows] == [b"v1", b"v2", b"v3"]
        assert struct.unpack("<q", db[prefix + b"n"])[0] == 12  # type: ignore[index]

        tr = db.create_transaction()
        template = fdb.tuple.pack_with_versionstamp(("fdbqueue-smoke", "j", fdb.tuple.Versionstamp()))
        tr.set_versionstamped_key(template, b"entry")
        stamp_future = tr.get_versionstamp()
        tr.commit()
        stamp = stamp_future.wait()
        assert len(stamp) == 10
        journal = db.get_range_startswith(fdb.tuple.pack(("fdbqueue-smoke", "j")))  # type: ignore[attr-defined]
        assert len(journal) == 1
        assert fdb.tuple.unpack(journal[0].key)[2].tr_version == stamp

        value, watch = db.get_and_watch(prefix + b"w")  # type: ignore[attr-defined]
        assert value is None and not watch.wait(timeout=0.2)
        db[prefix + b"w"] = b"changed"  # type: ignore[index]
        assert watch.wait(timeout=10)
    finally:
        db.clear_range(prefix, prefix + b"\xff")  # type: ignore[attr-defined]
        db.close()


# ---------------------------------------------------------------------------------------------
# Errors that leave a commit's outcome unknown


def test_maybe_committed_follows_foundationdb() -> None:
    # fdb_error_predicate(MAYBE_COMMITTED) (bindings/c/fdb_c.cpp): 1021 and 1039, wherever
    # they come from. 1031 is not in it, but a commit that timed out may still land: the
    # automatic_idempotency option's note in fdbclient/vexillographer/fdb.options says so
    # for transaction_timed_out and cluster_version_changed thrown during a commit.
    assert EngineError(1021).maybe_committed and EngineError(1039).maybe_committed
    assert not EngineError(1031).maybe_committed
    assert EngineError(1031, during_commit=True).maybe_committed
    assert EngineError(1039, during_commit=True).maybe_committed
    assert not EngineError(1020, during_commit=True).maybe_committed
    assert not EngineError(1031, during_commit=True).retryable  # on_error still re-raises it


def test_a_commit_that_timed_out_may_have_committed(tmp_path: Path) -> None:

    db = fdbqueue.open("fdb://" + fdb_cluster_file(tmp_path))
    tr = db.create_transaction()
    tr.options.set_timeout(1)
    tr.get(b"k")
    tr.set(b"k", b"v")
    time.sleep(0.05)
    with pytest.raises(EngineError) as info:
        tr.commit()
    assert info.value.code == 1031
    assert info.value.maybe_committed
    with pytest.raises(EngineError) as again:
        tr.on_error(info.value)
    assert again.value.code == 1031
    db.close()
