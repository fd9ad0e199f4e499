"""The FoundationDB engine.

Three layers: what ``fdbqueue.open("fdb://...")`` says on this machine (no cluster needed);
the translation layer run over a small in-process stand-in for the bindings (the shapes of
``fdb.Transaction``, its lazy ``Value`` and futures; it checks our wrapping, not
FoundationDB); and a smoke test on a real cluster, skipped with the reason when none is
reachable (tests/fdb_cluster.py).
"""

from __future__ import annotations

import bisect
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue.engines import fdb as fdb_engine
from fdbqueue.engines.base import (
    Database,
    KeySelector,
    KeyValue,
    ReadView,
    Transaction,
    Watch,
    is_transaction,
    run_transaction,
    transactional,
)
from fdbqueue.errors import RETRYABLE, ClusterUnavailableError, EngineError, InvalidURLError
from tests.fdb_cluster import client_library, find_cluster

# ---------------------------------------------------------------------------------------------
# Opening, on this machine as it is


def test_open_default_cluster_says_what_is_missing(tmp_path: Path) -> None:
    library = client_library()
    if not library.loadable:
        # This machine: no libfdb_c. The error says so and how to get it, with no
        # traceback from inside the bindings attached.
        with pytest.raises(ClusterUnavailableError) as info:
            fdbqueue.open("fdb://")
        message = str(info.value)
        assert "client library" in message
        assert "libfdb_c" in message
        assert "foundationdb-clients" in message
        assert info.value.__cause__ is None and info.value.__suppress_context__
    else:
        cluster_file = tmp_path / "fdb.cluster"
        cluster_file.write_text("test:unreachable@127.0.0.1:1\n")
        with pytest.raises(ClusterUnavailableError) as info:
            fdbqueue.open(f"fdb://{cluster_file}?timeout=2")
        assert f"cannot reach the FoundationDB cluster described by {cluster_file} within 2 s" in str(
            info.value
        )


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
        ("tenant=x", "unknown parameter"),
    ],
)
def test_bad_parameters_are_invalid_urls(query: str, needle: str) -> None:
    with pytest.raises(InvalidURLError, match=needle):
        fdbqueue.open(f"fdb://?{query}")


_OLD_BINDINGS = r"""
import importlib.metadata, sys
import fdb
# The 7.1 and 7.3 wheels define neither fdb.__version__ nor (7.1) fdb.LATEST_API_VERSION.
del fdb.__version__
del fdb.LATEST_API_VERSION
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
# A stand-in for the bindings: just enough of fdb.Transaction's shapes to drive the wrapper.


class FakeFDBError(Exception):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code

    @property
    def description(self) -> str:
        return f"fake error {self.code}"


class FakeKeySelector:
    def __init__(self, key: bytes, or_equal: bool, offset: int) -> None:
        self.key, self.or_equal, self.offset = key, or_equal, offset


class FakeFuture:
    """A FutureVoid / FutureInt64: wait, is_ready, on_ready, cancel."""

    def __init__(self, value: Any = None, error: int | None = None, ready: bool = True) -> None:
        self._value, self._error, self._ready = value, error, ready
        self._callbacks: list[Callable[[FakeFuture], None]] = []

    def complete(self, error: int | None = None) -> None:
        self._error, self._ready = error, True
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            cb(self)

    def wait(self) -> Any:
        assert self._ready, "the wrapper waited on a future that is not ready"
        if self._error is not None:
            raise FakeFDBError(self._error)
        return self._value

    def is_ready(self) -> bool:
        return self._ready

    def on_ready(self, callback: Callable[[FakeFuture], None]) -> None:
        if self._ready:
            callback(self)
        else:
            self._callbacks.append(callback)

    def cancel(self) -> None:
        if not self._ready:
            self.complete(1101)


class FakeValue:
    """Like fdb's lazy ``Value``: ``bool()`` raises when absent; ``present()`` is the test."""

    def __init__(self, value: bytes | None) -> None:
        self.value = value

    def present(self) -> bool:
        return self.value is not None

    def __bytes__(self) -> bytes:
        assert self.value is not None
        return self.value

    def __bool__(self) -> bool:
        if self.value is None:
            raise TypeError("absent Value has no truth value")
        return bool(self.value)


class FakeRange:
    def __init__(self, rows: list[tuple[bytes, bytes]]) -> None:
        self.rows = rows

    def to_list(self) -> list[Any]:
        class KV:
            def __init__(self, key: bytes, value: bytes) -> None:
                self.key, self.value = key, value

        return [KV(k, v) for k, v in self.rows]


class FakeOptions:
    def __init__(self) -> None:
        self.set: dict[str, int] = {}

    def set_timeout(self, ms: int) -> None:
        self.set["timeout"] = ms

    def set_retry_limit(self, n: int) -> None:
        self.set["retry_limit"] = n

    def set_max_retry_delay(self, ms: int) -> None:
        self.set["max_retry_delay"] = ms


class FakeReads:
    def __init__(self, tr: FakeTransaction, snapshot: bool) -> None:
        self._tr, self._snapshot = tr, snapshot

    def _view(self) -> dict[bytes, bytes]:
        self._tr.log.append(("read", self._snapshot))
        view = dict(self._tr.db.data)
        for key, value in self._tr.writes.items():
            if value is None:
                view.pop(key, None)
            else:
                view[key] = value
        return view

    def get(self, key: bytes) -> FakeValue:
        if self._tr.read_error is not None:
            raise FakeFDBError(self._tr.read_error)
        return FakeValue(self._view().get(key))

    def _resolve(self, keys: list[bytes], sel: Any) -> bytes:
        assert isinstance(sel, FakeKeySelector), "a base.KeySelector reached the bindings"
        i = (bisect.bisect_right if sel.or_equal else bisect.bisect_left)(keys, sel.key) - 1 + sel.offset
        return b"" if i < 0 else b"\xff" if i >= len(keys) else keys[i]

    def get_key(self, sel: Any) -> FakeValue:
        return FakeValue(self._resolve(sorted(self._view()), sel))

    def get_range(self, begin: Any, end: Any, limit: int = 0, reverse: bool = False) -> FakeRange:
        view = self._view()
        keys = sorted(view)
        b = begin if isinstance(begin, bytes) else self._resolve(keys, begin)
        e = end if isinstance(end, bytes) else self._resolve(keys, end)
        chosen = [k for k in keys if b <= k < e]
        if reverse:
            chosen.reverse()
        if limit:
            chosen = chosen[:limit]
        return FakeRange([(k, view[k]) for k in chosen])


class FakeTransaction(FakeReads):
    def __init__(self, db: FakeDatabase) -> None:
        self.db = db
        self.log: list[Any] = []
        self.writes: dict[bytes, bytes | None] = {}
        self.options = FakeOptions()
        self.snapshot = FakeReads(self, True)
        self.read_error: int | None = None
        self.stamp = FakeFuture(ready=False)
        self.watches: list[FakeFuture] = []
        super().__init__(self, False)

    def set(self, key: bytes, value: bytes) -> None:
        self.writes[key] = value

    def clear(self, key: bytes) -> None:
        self.writes[key] = None

    def clear_range(self, begin: bytes, end: bytes) -> None:
        for key in list(self._view()):
            if begin <= key < end:
                self.writes[key] = None

    def add(self, key: bytes, param: bytes) -> None:
        old = self._view().get(key, b"").ljust(len(param), b"\x00")[: len(param)]
        total = int.from_bytes(old, "little") + int.from_bytes(param, "little")
        self.writes[key] = (total % (1 << (8 * len(param)))).to_bytes(len(param), "little")

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        self.log.append(("vs_key", key, value))

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        if end < begin:
            raise FakeFDBError(2005)
        self.log.append(("rcr", begin, end))

    def watch(self, key: bytes) -> FakeFuture:
        future = FakeFuture(ready=False)
        self.watches.append(future)
        return future

    def get_read_version(self) -> FakeFuture:
        return FakeFuture(1234)

    def get_committed_version(self) -> int:
        return self.db.version if not self.writes else -1

    def get_versionstamp(self) -> FakeFuture:
        return self.stamp

    def commit(self) -> FakeFuture:
        if self.db.commit_errors:
            return FakeFuture(error=self.db.commit_errors.pop(0))
        self.db.version += 1
        for key, value in self.writes.items():
            if value is None:
                self.db.data.pop(key, None)
            else:
                self.db.data[key] = value
        self.writes = {}
        self.stamp._value = struct.pack(">QH", self.db.version, 0)
        self.stamp.complete()
        return FakeFuture()

    def on_error(self, error: Any) -> FakeFuture:
        self.db.on_error_args.append(error)
        code = error.code if isinstance(error, FakeFDBError) else error
        if code not in RETRYABLE:
            return FakeFuture(error=code)
        self.writes = {}
        return FakeFuture()

    def reset(self) -> None:
        self.writes = {}
        self.options = FakeOptions()

    def cancel(self) -> None:
        self.log.append(("cancel",))


class FakeDatabase:
    def __init__(self) -> None:
        self.data: dict[bytes, bytes] = {}
        self.version = 100
        self.commit_errors: list[int] = []
        self.on_error_args: list[Any] = []
        self.transactions: list[FakeTransaction] = []

    def create_transaction(self) -> FakeTransaction:
        tr = FakeTransaction(self)
        self.transactions.append(tr)
        return tr


class FakeBindings:
    FDBError = FakeFDBError
    KeySelector = FakeKeySelector


@pytest.fixture
def fake() -> Iterator[FakeDatabase]:
    saved = fdb_engine._FDBError, fdb_engine._FDBKeySelector
    fdb_engine._bind(FakeBindings)
    try:
        yield FakeDatabase()
    finally:
        fdb_engine._FDBError, fdb_engine._FDBKeySelector = saved


@pytest.fixture
def fdb_db(fake: FakeDatabase) -> fdb_engine.FDBDatabase:
    return fdb_engine.FDBDatabase("fdb:///fake/fdb.cluster", fake, "/fake/fdb.cluster", 800)


def test_reads_return_plain_bytes_or_none(fdb_db: fdb_engine.FDBDatabase) -> None:
    fdb_db[b"a"] = b"1"
    tr = fdb_db.create_transaction()
    value = tr.get(b"a")
    assert type(value) is bytes and value == b"1"
    assert tr.get(b"missing") is None
    assert tr[b"a"] == b"1"
    assert tr.snapshot.get(b"missing") is None


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


def test_snapshot_reads_go_to_the_snapshot_view(fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase) -> None:
    tr = fdb_db.create_transaction()
    tr.snapshot.get_range(b"", b"\xff")
    tr.get(b"x")
    assert fake.transactions[-1].log == [("read", True), ("read", False)]


def test_bindings_errors_become_engine_errors_with_the_original_as_cause(
    fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase
) -> None:
    tr = fdb_db.create_transaction()
    fake.transactions[-1].read_error = 1007
    with pytest.raises(EngineError) as info:
        tr.get(b"k")
    assert info.value.code == 1007 and info.value.retryable
    assert isinstance(info.value.__cause__, FakeFDBError)
    assert "fake error 1007" in str(info.value)
    with pytest.raises(EngineError) as inverted:
        tr.add_read_conflict_range(b"b", b"a")
    assert inverted.value.code == 2005


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


def test_writes_clears_and_atomic_add(fdb_db: fdb_engine.FDBDatabase) -> None:
    @transactional
    def work(tr: Any) -> None:
        tr[b"p/1"] = b"x"
        tr[b"p/2"] = b"y"
        tr[b"q"] = b"z"
        tr.add(b"n", struct.pack("<q", 5))
        tr.add(b"n", struct.pack("<q", -2))

    work(fdb_db)
    assert struct.unpack("<q", fdb_db[b"n"] or b"")[0] == 3
    run_transaction(fdb_db, lambda tr: tr.clear_range_startswith(b"p/"))
    assert fdb_db.get_range(b"", b"\xff") == [KeyValue(b"n", struct.pack("<q", 3)), KeyValue(b"q", b"z")]
    del fdb_db[b"q"]
    assert fdb_db[b"q"] is None


def test_retry_passes_the_original_error_and_reports_each_attempt(
    fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase
) -> None:
    fake.commit_errors = [1020]
    finished: list[int | None] = []
    attempts = 0

    def body(tr: Any) -> str:
        nonlocal attempts
        attempts += 1
        tr.on_finish(lambda err: finished.append(None if err is None else err.code))
        tr[b"k"] = b"v"
        return "done"

    assert run_transaction(fdb_db, body) == "done"
    assert attempts == 2
    assert finished == [1020, None]
    assert len(fake.on_error_args) == 1 and isinstance(fake.on_error_args[0], FakeFDBError)
    assert fake.on_error_args[0].code == 1020
    assert fdb_db[b"k"] == b"v"


def test_non_retryable_commit_error_is_reraised(fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase) -> None:
    fake.commit_errors = [2101]
    tr = fdb_db.create_transaction()
    tr.set(b"k", b"v")
    with pytest.raises(EngineError) as info:
        tr.commit()
    with pytest.raises(EngineError) as again:
        tr.on_error(info.value)
    assert again.value is info.value and again.value.code == 2101


def test_on_error_passes_engine_errors_raised_by_fdbqueue_by_code(
    fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase
) -> None:
    tr = fdb_db.create_transaction()
    tr.on_error(EngineError(1020, "raised by the layer"))
    assert fake.on_error_args == [1020]
    with pytest.raises(ValueError):
        tr.on_error(ValueError("not an engine error"))


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


def test_options_are_recorded_and_forwarded(fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase) -> None:
    tr = fdb_db.create_transaction()
    tr.options.set_timeout(250)
    tr.options.set_retry_limit(3)
    tr.options.set_max_retry_delay(50)
    assert fake.transactions[-1].options.set == {"timeout": 250, "retry_limit": 3, "max_retry_delay": 50}
    assert tr.options.timeout_ms == 250
    with pytest.raises(EngineError) as info:
        tr.options.set_timeout(-1)
    assert info.value.code == 2006
    tr.reset()
    assert tr.options.timeout_ms == 0


def test_watch_waits_fires_and_fails(fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase) -> None:
    tr = fdb_db.create_transaction()
    watch = tr.watch(b"k")
    raw = fake.transactions[-1].watches[-1]
    assert not watch.is_ready()
    assert watch.wait(timeout=0.01) is False
    threading.Timer(0.05, raw.complete).start()
    assert watch.wait(timeout=5) is True
    assert watch.is_ready()

    failing = tr.watch(b"k")
    fake.transactions[-1].watches[-1].complete(1020)
    with pytest.raises(EngineError) as info:
        failing.wait(timeout=1)
    assert info.value.code == 1020

    cancelled = tr.watch(b"k")
    cancelled.cancel()
    with pytest.raises(EngineError) as info:
        cancelled.wait(timeout=1)
    assert info.value.code == 1101


def test_dropping_an_unfired_watch_cancels_it(fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase) -> None:
    tr = fdb_db.create_transaction()
    tr.watch(b"k")  # dropped at once
    raw = fake.transactions[-1].watches[-1]
    assert raw.is_ready()
    with pytest.raises(FakeFDBError):
        raw.wait()


def test_get_and_watch_and_versions(fdb_db: fdb_engine.FDBDatabase, fake: FakeDatabase) -> None:
    fdb_db[b"k"] = b"1"
    value, watch = fdb_db.get_and_watch(b"k")
    assert value == b"1" and not watch.is_ready()
    tr = fdb_db.create_transaction()
    assert tr.get_read_version() == 1234
    stamp = tr.get_versionstamp()
    tr.set(b"k", b"2")
    tr.commit()
    assert stamp.wait() == struct.pack(">QH", fake.version, 0)
    assert len(stamp.wait()) == 10


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
    from tests.conftest import fdb_cluster_file

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
