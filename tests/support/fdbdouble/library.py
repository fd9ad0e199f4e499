"""The library object of the double: one method per ``fdb_c.h`` function the bindings call.

See the package docstring (tests/support/fdbdouble/__init__.py) for what it models and what not.
"""

from __future__ import annotations

import ctypes
import heapq
import itertools
import os
import sys
import tempfile
import threading
import time
import traceback
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import fdbqueue
from fdbqueue.engines.contract import KeySelector
from fdbqueue.errors import ERROR_NAMES, EngineError
from tests.support.fdbdouble.semantics import (
    CONFLICT_READ,
    CONFLICT_WRITE,
    DESCRIPTIONS,
    NEUTRAL_DATABASE_OPTIONS,
    NEUTRAL_OPTIONS,
    error_predicate,
    int_param,
    mutation_ops,
    range_batch,
)

DEFAULT_SIM_URL = "sim://?seed=1&faults=0"


class _Function:
    """One library function: takes ``argtypes`` / ``restype`` / ``errcheck`` like a ctypes
    function pointer and applies ``errcheck(result, func, args)`` as ctypes does."""

    def __init__(self, name: str, impl: Callable[..., Any], calls: Counter[str]) -> None:
        self.__name__ = name
        self._impl = impl
        self._calls = calls
        self.argtypes: Any = None
        self.restype: Any = None
        self.errcheck: Any = None

    def __call__(self, *args: Any) -> Any:
        self._calls[self.__name__] += 1
        # A handle may come as the c_void_p the bindings filled (``Database(pointer)``).
        result = self._impl(*(a.value if isinstance(a, ctypes.c_void_p) else a for a in args))
        if self.errcheck is not None:
            return self.errcheck(result, self, args)
        return result


class _Future:
    """An FDBFuture: completed once, with a value or an error code."""

    __slots__ = ("callbacks", "error", "event", "keep", "lock", "on_cancel", "value")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.event = threading.Event()
        self.error = 0
        self.value: Any = None
        self.callbacks: list[tuple[Any, int]] = []
        self.keep: list[Any] = []  # buffers handed out by the getters, alive until destroyed
        self.on_cancel: Callable[[], None] | None = None

    def complete(self, handle: int, value: Any = None, error: int = 0) -> None:
        with self.lock:
            if self.event.is_set():
                return
            self.value, self.error = value, error
            self.event.set()
            callbacks, self.callbacks = self.callbacks, []
        for cb, _param in callbacks:
            cb(handle)


class _Txn:
    """A transaction handle: the sim transaction plus what the C API adds to it."""

    __slots__ = ("deferred", "latency", "stamps", "tr")

    def __init__(self, tr: Any, latency: float) -> None:
        self.tr = tr
        self.latency = latency  # seconds before a read's future is ready (its round trip)
        self.deferred = 0  # the first error of a write call, returned by the commit
        self.stamps: list[int] = []  # versionstamp futures waiting for the commit


def _out(ref: Any) -> Any:
    """The object behind a ``ctypes.byref`` argument, written through."""
    return ref._obj


def _point(ref: Any, data: bytes, keep: list[Any]) -> None:
    """Make the ``POINTER(c_byte)`` behind ``ref`` point at a copy of ``data``."""
    buf = ctypes.create_string_buffer(data, len(data) + 1)
    keep.append(buf)
    _out(ref).contents = ctypes.c_byte.from_buffer(buf)


class CAPIDouble:
    """The library object: ``getattr(double, "fdb_transaction_get")`` is a function as in libfdb_c."""

    def __init__(self) -> None:
        self._handles = itertools.count(0x10000, 16)
        self._futures: dict[int, _Future] = {}
        self._txns: dict[int, _Txn] = {}
        self._dbs: dict[int, str] = {}
        self._stores: dict[str, Any] = {}  # connection string -> SimDatabase
        self._urls: dict[str, str] = {}  # connection string -> sim URL
        self._watches: dict[int, Any] = {}  # future handle -> sim watch, completed by the network
        self._wake = threading.Event()
        self._latency: dict[str, float] = {}  # connection string -> read latency (seconds)
        self._due: list[tuple[float, int, Any, int]] = []  # heap of (when, future, value, error)
        self._due_lock = threading.Lock()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="fdb-double")
        self.api_version: int | None = None
        self.header_version = 0
        self.unmodelled_options: list[int] = []
        # Calls per library function: each fdb_transaction_get_range call is one batch (one
        # round trip to a storage server on a cluster).
        self.calls: Counter[str] = Counter()
        self._functions: dict[str, _Function] = {}
        for name in dir(self):
            if name.startswith("fdb_"):
                self._functions[name] = _Function(name, getattr(self, name), self.calls)
        from fdb import fdboptions  # pure Python: the option and mutation codes

        self._ops = mutation_ops(fdboptions.MutationType)
        self._options = {v[0]: k.lower() for k, v in fdboptions.TransactionOption.items()}
        self._db_options = {v[0]: k.lower() for k, v in fdboptions.DatabaseOption.items()}

    def __getattr__(self, name: str) -> _Function:
        functions = self.__dict__.get("_functions")
        if functions is None or not name.startswith("fdb_"):
            raise AttributeError(name)
        if name not in functions:

            def missing(*_args: Any) -> Any:
                raise NotImplementedError(f"{name} (fdb_c.h) is not modelled by tests/support/fdbdouble")

            functions[name] = _Function(name, missing, self.calls)
        return functions[name]

    def __getattribute__(self, name: str) -> Any:
        # The bindings call library functions as attributes: route them to the _Function
        # wrappers (with errcheck) rather than the bound methods of the same name.
        if name.startswith("fdb_"):
            functions = object.__getattribute__(self, "__dict__").get("_functions")
            if functions is not None and name in functions:
                return functions[name]
        return object.__getattribute__(self, name)

    # -- clusters -----------------------------------------------------------------------------

    def new_cluster_file(
        self, directory: str | None = None, sim_url: str = DEFAULT_SIM_URL, read_latency: float = 0.0
    ) -> str:
        """Write a cluster file naming a fresh sim store opened from ``sim_url``; its path.

        ``read_latency``: seconds before a read's future becomes ready (the network thread
        completes it then), so that sequential reads cost one latency each and reads issued
        together one in all, as round trips to a cluster do.
        """
        ident = uuid.uuid4().hex[:16]
        connection = f"double:{ident}@127.0.0.1:4500"
        self._urls[connection] = sim_url
        self._latency[connection] = float(read_latency)
        fd, path = tempfile.mkstemp(prefix="fdb-double-", suffix=".cluster", dir=directory)
        with os.fdopen(fd, "w") as f:
            f.write(connection + "\n")
        return path

    def sim_database(self, cluster_file: str) -> Any:
        """The SimDatabase behind ``cluster_file`` (for fault scripts and clocks)."""
        return self._store(_connection_string(cluster_file))

    def is_watching(self, future: int) -> bool:
        """True while the watch behind the future handle ``future`` has neither fired, failed
        nor been cancelled."""
        return future in self._watches

    def release(self, cluster_file: str) -> None:
        """Drop the store behind ``cluster_file`` (the bindings cache the Database forever)."""
        store = self._stores.pop(_connection_string(cluster_file), None)
        if store is not None:
            store.close()

    def _store(self, connection: str) -> Any:
        store = self._stores.get(connection)
        if store is None:
            store = self._stores[connection] = fdbqueue.open(self._urls.get(connection, DEFAULT_SIM_URL))
        return store

    # -- handles and futures ------------------------------------------------------------------

    def _new_future(self) -> tuple[int, _Future]:
        handle = next(self._handles)
        fut = self._futures[handle] = _Future()
        return handle, fut

    def _ready(self, fn: Callable[[], Any], latency: float = 0.0) -> int:
        """A future of ``fn()``'s value, or of the code of the EngineError it raised.

        ``fn`` runs now (a read sees the transaction as it is when issued); the future is
        ready now, or after ``latency`` seconds, completed by the network thread.
        """
        handle, fut = self._new_future()
        value, error = None, 0
        try:
            value = fn()
        except EngineError as exc:
            error = exc.code
        if latency <= 0:
            fut.complete(handle, value, error)
        else:
            with self._due_lock:
                heapq.heappush(self._due, (time.monotonic() + latency, handle, value, error))
            self._wake.set()
        return handle

    def _later(self, fn: Callable[[], Any], then: Callable[[int], None] | None = None) -> int:
        """A future completed by a worker thread (as the network thread completes them)."""
        handle, fut = self._new_future()

        def run() -> None:
            error, value = 0, None
            try:
                value = fn()
            except EngineError as exc:
                error = exc.code
            except BaseException as exc:  # a defect of the double or the sim: make it loud
                sys.stderr.write(f"fdb double: {type(exc).__name__}: {exc}\n")
                traceback.print_exc()  # where: such a defect is rare and timing-dependent
                error = 4100
            if then is not None:
                then(error)
            fut.complete(handle, value, error)

        self._pool.submit(run)
        return handle

    def _txn(self, tp: int) -> _Txn:
        return self._txns[tp]

    # -- network and API version (fdb_c.h: "Network") -----------------------------------------

    def fdb_select_api_version_impl(self, runtime_version: int, header_version: int) -> int:
        if not 13 <= runtime_version <= header_version:
            return 2203
        self.api_version, self.header_version = runtime_version, header_version
        return 0

    def fdb_get_max_api_version(self) -> int:
        return self.header_version or 800

    def fdb_get_client_version(self) -> bytes:
        return b"double,fdbqueue tests/support/fdbdouble"

    def fdb_get_error(self, code: int) -> bytes:
        text = DESCRIPTIONS.get(code) or ERROR_NAMES.get(code, "Unknown error").replace("_", " ")
        return text.encode()

    def fdb_error_predicate(self, predicate: int, code: int) -> int:
        return error_predicate(predicate, code)

    def fdb_network_set_option(self, option: int, value: Any, length: int) -> int:
        return 0

    def fdb_setup_network(self) -> int:
        return 0

    def fdb_run_network(self) -> int:
        """The network thread: completes delayed reads and watches until ``fdb_stop_network``."""
        while not self._stop.is_set():
            self._wake.wait(self._next_wait())
            self._wake.clear()
            self._complete_due()
            for handle, watch in list(self._watches.items()):
                if watch.is_ready():
                    self._watches.pop(handle, None)
                    self._finish_watch(handle, watch)
        return 0

    def _next_wait(self) -> float | None:
        waits = [0.002] if self._watches else []
        with self._due_lock:
            if self._due:
                waits.append(max(0.0, self._due[0][0] - time.monotonic()))
        return min(waits) if waits else None

    def _complete_due(self) -> None:
        now = time.monotonic()
        while True:
            with self._due_lock:
                if not self._due or self._due[0][0] > now:
                    return
                _when, handle, value, error = heapq.heappop(self._due)
            fut = self._futures.get(handle)
            if fut is not None:
                fut.complete(handle, value, error)

    def fdb_stop_network(self) -> int:
        self._stop.set()
        self._wake.set()
        self._pool.shutdown(wait=False)
        return 0

    def _finish_watch(self, handle: int, watch: Any) -> None:
        fut = self._futures.get(handle)
        if fut is None:
            return
        try:
            watch.wait(0)
        except EngineError as exc:
            fut.complete(handle, error=exc.code)
        else:
            fut.complete(handle)

    # -- futures (fdb_c.h: "Future") ----------------------------------------------------------

    def fdb_future_destroy(self, f: int) -> None:
        fut = self._futures.pop(f, None)
        watch = self._watches.pop(f, None)
        if watch is not None and fut is not None and not fut.event.is_set():
            watch.cancel()  # destroying an unready watch future cancels the watch

    def fdb_future_release_memory(self, f: int) -> None:
        pass

    def fdb_future_cancel(self, f: int) -> None:
        fut = self._futures.get(f)
        if fut is None or fut.event.is_set():
            return
        watch = self._watches.pop(f, None)
        if watch is not None:
            watch.cancel()
        fut.complete(f, error=1101)

    def fdb_future_is_ready(self, f: int) -> int:
        return int(self._futures[f].event.is_set())

    def fdb_future_block_until_ready(self, f: int) -> int:
        self._futures[f].event.wait()
        return 0

    def fdb_future_set_callback(self, f: int, callback: Any, parameter: Any) -> int:
        fut = self._futures[f]
        with fut.lock:
            if not fut.event.is_set():
                fut.callbacks.append((callback, parameter))
                return 0
        callback(f)  # already ready: called at once, on this thread (fdb_c.h)
        return 0

    def fdb_future_get_error(self, f: int) -> int:
        return self._futures[f].error

    def fdb_future_get_int64(self, f: int, out: Any) -> int:
        fut = self._futures[f]
        if not fut.error:
            _out(out).value = int(fut.value)
        return fut.error

    def fdb_future_get_key(self, f: int, out_key: Any, out_length: Any) -> int:
        fut = self._futures[f]
        if not fut.error:
            _point(out_key, fut.value, fut.keep)
            _out(out_length).value = len(fut.value)
        return fut.error

    def fdb_future_get_value(self, f: int, out_present: Any, out_value: Any, out_length: Any) -> int:
        fut = self._futures[f]
        if not fut.error:
            value = fut.value
            _out(out_present).value = int(value is not None)
            _point(out_value, value or b"", fut.keep)
            _out(out_length).value = len(value or b"")
        return fut.error

    def fdb_future_get_keyvalue_array(self, f: int, out_kv: Any, out_count: Any, out_more: Any) -> int:
        fut = self._futures[f]
        if fut.error:
            return fut.error
        rows, more = fut.value
        kv_type = type(_out(out_kv))._type_  # the bindings' KeyValueStruct (packed to 4)
        array = (kv_type * max(1, len(rows)))()
        fut.keep.append(array)
        for i, (key, value) in enumerate(rows):
            kbuf, vbuf = (
                ctypes.create_string_buffer(key, len(key) + 1),
                ctypes.create_string_buffer(value, len(value) + 1),
            )
            fut.keep += (kbuf, vbuf)
            array[i].key = ctypes.cast(kbuf, ctypes.POINTER(ctypes.c_byte))
            array[i].key_length = len(key)
            array[i].value = ctypes.cast(vbuf, ctypes.POINTER(ctypes.c_byte))
            array[i].value_length = len(value)
        _out(out_kv).contents = array[0]
        _out(out_count).value = len(rows)
        _out(out_more).value = int(more)
        return 0

    # -- databases ----------------------------------------------------------------------------

    def fdb_create_database(self, cluster_file: bytes | None, out_database: Any) -> int:
        path = cluster_file.decode() if cluster_file else os.environ.get("FDB_CLUSTER_FILE", "")
        if not path or not os.path.isfile(path):
            return 1515  # no_cluster_file_found
        handle = next(self._handles)
        self._dbs[handle] = _connection_string(path)
        _out(out_database).value = handle
        return 0

    def fdb_database_destroy(self, d: int) -> None:
        self._dbs.pop(d, None)

    def fdb_database_set_option(self, d: int, option: int, value: Any, length: int) -> int:
        # Defaults for every transaction (transaction_timeout, ...) would change semantics
        # the sim store does not take per database: refused rather than ignored.
        if self._db_options.get(option) in NEUTRAL_DATABASE_OPTIONS:
            return 0
        self.unmodelled_options.append(option)
        return 2108

    def fdb_database_create_transaction(self, d: int, out_transaction: Any) -> int:
        try:
            tr = self._store(self._dbs[d]).create_transaction()
        except EngineError as exc:
            return exc.code
        handle = next(self._handles)
        self._txns[handle] = _Txn(tr, self._latency.get(self._dbs[d], 0.0))
        _out(out_transaction).value = handle
        return 0

    # -- transactions: reads ------------------------------------------------------------------

    def fdb_transaction_destroy(self, tp: int) -> None:
        txn = self._txns.pop(tp, None)
        if txn is not None:
            self._end_stamps(txn, 1025)
            if txn.tr.get_committed_version() < 0:
                txn.tr.cancel()

    def fdb_transaction_get_read_version(self, tp: int) -> int:
        txn = self._txn(tp)
        return self._ready(txn.tr.get_read_version, txn.latency)

    def fdb_transaction_get(self, tp: int, key: bytes, length: int, snapshot: int) -> int:
        txn = self._txn(tp)
        view = txn.tr.snapshot if snapshot else txn.tr
        return self._ready(lambda: view.get(key[:length]), txn.latency)

    def fdb_transaction_get_key(
        self, tp: int, key: bytes, length: int, or_equal: int, offset: int, snapshot: int
    ) -> int:
        txn = self._txn(tp)
        view = txn.tr.snapshot if snapshot else txn.tr
        selector = KeySelector(key[:length], bool(or_equal), int(offset))
        return self._ready(lambda: view.get_key(selector), txn.latency)

    def fdb_transaction_get_range(
        self,
        tp: int,
        begin: bytes,
        begin_length: int,
        begin_or_equal: int,
        begin_offset: int,
        end: bytes,
        end_length: int,
        end_or_equal: int,
        end_offset: int,
        limit: int,
        target_bytes: int,
        mode: int,
        iteration: int,
        snapshot: int,
        reverse: int,
    ) -> int:
        txn = self._txn(tp)
        tr = txn.tr
        b = KeySelector(begin[:begin_length], bool(begin_or_equal), int(begin_offset))
        e = KeySelector(end[:end_length], bool(end_or_equal), int(end_offset))
        return self._ready(
            lambda: range_batch(
                tr, b, e, limit, target_bytes, mode, iteration, bool(snapshot), bool(reverse)
            ),
            txn.latency,
        )

    # -- transactions: writes (errors deferred to the commit) ---------------------------------

    def _write(self, tp: int, fn: Callable[[Any], None]) -> None:
        txn = self._txn(tp)
        try:
            fn(txn.tr)
        except EngineError as exc:
            txn.deferred = txn.deferred or exc.code

    def fdb_transaction_set(self, tp: int, key: bytes, kl: int, value: bytes, vl: int) -> None:
        self._write(tp, lambda tr: tr.set(key[:kl], value[:vl]))

    def fdb_transaction_clear(self, tp: int, key: bytes, kl: int) -> None:
        self._write(tp, lambda tr: tr.clear(key[:kl]))

    def fdb_transaction_clear_range(self, tp: int, begin: bytes, bl: int, end: bytes, el: int) -> None:
        self._write(tp, lambda tr: tr.clear_range(begin[:bl], end[:el]))

    def fdb_transaction_atomic_op(
        self, tp: int, key: bytes, kl: int, param: bytes, pl: int, code: int
    ) -> None:
        op = self._ops.get(code)
        if op is None:
            self._txn(tp).deferred = self._txn(tp).deferred or 2006
            return
        self._write(tp, lambda tr: getattr(tr, op)(key[:kl], param[:pl]))

    def fdb_transaction_add_conflict_range(
        self, tp: int, begin: bytes, bl: int, end: bytes, el: int, kind: int
    ) -> int:
        tr = self._txn(tp).tr
        try:
            if kind == CONFLICT_READ:
                tr.add_read_conflict_range(begin[:bl], end[:el])
            elif kind == CONFLICT_WRITE:
                tr.add_write_conflict_range(begin[:bl], end[:el])
            else:
                return 2006
        except EngineError as exc:
            return exc.code
        return 0

    def fdb_transaction_set_option(self, tp: int, option: int, value: Any, length: int) -> int:
        opts = self._txn(tp).tr.options
        name = self._options.get(option)
        try:
            if name == "timeout":
                opts.set_timeout(int_param(value))
            elif name == "retry_limit":
                opts.set_retry_limit(int_param(value))
            elif name == "max_retry_delay":
                opts.set_max_retry_delay(int_param(value))
            elif name in NEUTRAL_OPTIONS:
                pass
            else:
                self.unmodelled_options.append(option)
                return 2108
        except EngineError as exc:
            return exc.code
        return 0

    def fdb_transaction_watch(self, tp: int, key: bytes, length: int) -> int:
        handle, fut = self._new_future()
        try:
            watch = self._txn(tp).tr.watch(key[:length])
        except EngineError as exc:
            fut.complete(handle, error=exc.code)
            return handle
        self._watches[handle] = watch
        self._wake.set()
        return handle

    # -- transactions: life cycle -------------------------------------------------------------

    def fdb_transaction_commit(self, tp: int) -> int:
        txn = self._txn(tp)
        deferred = txn.deferred
        txn.deferred = 0

        def commit() -> None:
            if deferred:
                raise EngineError(deferred)
            txn.tr.commit()

        return self._later(commit, lambda _error: self._end_stamps(txn, None))

    def fdb_transaction_on_error(self, tp: int, code: int) -> int:
        txn = self._txn(tp)
        self._end_stamps(txn, 1025)
        return self._later(lambda: txn.tr.on_error(EngineError(code)))

    def fdb_transaction_reset(self, tp: int) -> None:
        txn = self._txn(tp)
        self._end_stamps(txn, 1025)
        txn.deferred = 0
        txn.tr.reset()

    def fdb_transaction_cancel(self, tp: int) -> None:
        txn = self._txn(tp)
        self._end_stamps(txn, 1025)
        txn.tr.cancel()

    def fdb_transaction_get_committed_version(self, tp: int, out_version: Any) -> int:
        _out(out_version).value = self._txn(tp).tr.get_committed_version()
        return 0

    def fdb_transaction_get_versionstamp(self, tp: int) -> int:
        handle, _fut = self._new_future()
        self._txn(tp).stamps.append(handle)
        return handle

    def _end_stamps(self, txn: _Txn, error: int | None) -> None:
        """Complete the versionstamp futures: from the sim after a commit, else with ``error``."""
        stamps, txn.stamps = txn.stamps, []
        for handle in stamps:
            fut = self._futures.get(handle)
            if fut is None:
                continue
            if error is not None:
                fut.complete(handle, error=error)
                continue
            try:
                fut.complete(handle, txn.tr.get_versionstamp().wait())
            except EngineError as exc:
                fut.complete(handle, error=exc.code)


def _connection_string(path: str) -> str:
    with open(path) as f:
        return f.read().strip()
