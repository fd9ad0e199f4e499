"""A double of FoundationDB's C client library (libfdb_c) backed by the sim engine, for tests.

The official ``foundationdb`` Python bindings are pure Python over ``ctypes`` calls into
libfdb_c: ``fdb/impl.py`` loads it with ``ctypes.CDLL`` and declares each function's
``argtypes``, ``restype`` and ``errcheck`` in ``init_c_api``. :func:`install` puts
:class:`CAPIDouble` where that library object goes (intercepting ``ctypes.CDLL`` for the
libfdb_c name while ``fdb.impl`` is imported), so that the bindings' own futures,
``on_ready`` callbacks, ``block_until_ready``, streaming range reads, options, ``on_error``,
watches, versionstamps and errors run unchanged, and ``fdbqueue/engines/fdb.py`` above them.
It works with the 7.1, 7.3 and 8.0 wheels (the same entry points, ``bindings/c/foundationdb/fdb_c.h``).

What it models, function by function (names from ``fdb_c.h``):

* ``fdb_select_api_version_impl`` / ``fdb_get_max_api_version``: a library exactly as new
  as the bindings' header version. ``fdb_setup_network``, ``fdb_run_network`` (blocks the
  bindings' network thread until ``fdb_stop_network``; it completes watches),
  ``fdb_network_set_option`` (accepted).
* ``fdb_create_database`` reads the cluster file: its connection string names one sim
  store (:meth:`CAPIDouble.new_cluster_file` makes a fresh one). ``fdb_database_create_transaction``
  is ``SimDatabase.create_transaction``; ``fdb_database_set_option`` accepts the options that
  change nothing the sim models.
* Reads (``fdb_transaction_get``, ``_get_key``, ``_get_range``, ``_get_read_version``) are
  the sim transaction's public reads, evaluated when issued (what read-your-writes sees
  then) and returned through futures that are ready at once. ``fdb_transaction_get_range``
  applies ``validate_and_update_parameters`` of ``bindings/c/fdb_c.cpp`` (streaming modes,
  the iterator's byte progression, row and byte limits with FoundationDB's per-row count of
  ``8 + key + value`` from ``GetRangeLimits::decrement`` in ``fdbclient/NativeAPI.actor.cpp``)
  and returns ``more``: the bindings then continue from the last key, and the read
  conflict range covers only what was returned (a snapshot probe sizes the batch; the
  serializable read then reads exactly that batch).
* Writes (``fdb_transaction_set``, ``_clear``, ``_clear_range``, ``_atomic_op``) return
  nothing; an error is kept and returned by the commit, as ``ThreadSafeTransaction::set``
  (``fdbclient/ThreadSafeTransaction.cpp``) keeps it in ``deferredError``. Atomic op codes
  are those of ``fdb.options``; AND and MIN mean AND_V2 and MIN_V2 from API 510
  (``Transaction::atomicOp``, ``fdbclient/NativeAPI.actor.cpp``).
* ``fdb_transaction_commit`` and ``fdb_transaction_on_error`` run on a worker thread, so
  the bindings block on a future that is not ready and are woken by its callback from
  another thread. ``on_error`` is the sim's: retryable codes back off and reset, others
  (and a reached retry limit) fail the future with the code; the persistent options
  (timeout, retry limit, max retry delay, set by ``fdb_transaction_set_option``) survive it.
* ``fdb_transaction_watch``: the sim's watch, completed by the network thread when it fires
  or fails; cancelling or destroying the future cancels it (1101).
* ``fdb_transaction_get_versionstamp``: ready when the commit ends (2021 for a read-only
  transaction, 2020 after a failed commit, 1025 if reset first).
* ``fdb_get_error`` and ``fdb_error_predicate`` follow ``bindings/c/fdb_c.cpp``.
* Futures: ``fdb_future_is_ready``, ``_set_callback`` (called at once when ready, else from
  the completing thread), ``_block_until_ready``, ``_get_error``, ``_get_int64``,
  ``_get_key``, ``_get_value``, ``_get_keyvalue_array`` (writing through the ``byref``
  out-parameters into memory the future owns until ``fdb_future_destroy``), ``_cancel``.
  The ``errcheck`` the bindings set on a function is applied as ctypes applies it.

What it does not model: the network (no latency, no partitions: faults come from the sim
store), tenants, ``fdb_transaction_set_read_version``, size estimates, split points,
locality, options that change semantics other than timeout / retry limit / max retry delay
(they fail with 2108 unsupported_operation, as do database options that set transaction
defaults), the multi-version client, and futures of reads
that stay pending (reads complete when issued). Semantics (conflicts, versions, limits,
injected faults) are the sim engine's, not this module's: it only translates.
"""

from __future__ import annotations

import ctypes
import importlib
import itertools
import os
import struct
import sys
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import fdbqueue
from fdbqueue.engines.base import KeySelector
from fdbqueue.errors import ERROR_NAMES, MAYBE_COMMITTED, RETRYABLE_NOT_COMMITTED, EngineError

DEFAULT_SIM_URL = "sim://?seed=1&faults=0"
LIBRARY_NAMES = ("libfdb_c.so", "libfdb_c.dylib", "fdb_c.dll")

# fdb.options ErrorPredicate codes (bindings/c/foundationdb/fdb_c_options.g.h).
_PRED_RETRYABLE, _PRED_MAYBE_COMMITTED, _PRED_RETRYABLE_NOT_COMMITTED = 50000, 50001, 50002
# FDBStreamingMode and validate_and_update_parameters (bindings/c/fdb_c.cpp).
_WANT_ALL, _ITERATOR, _EXACT, _SERIAL = -2, -1, 0, 4
_UNLIMITED = 1 << 62
_MODE_BYTES = (_UNLIMITED, 256, 1000, 4096, 120000)
_ITERATION_BYTES = (4096, 6144, 9216, 13824, 20736, 31104, 46656, 69984, 80000, 120000)
# FDBConflictRangeType
_CONFLICT_READ, _CONFLICT_WRITE = 0, 1

# Descriptions as fdb_get_error gives them (documentation/sphinx/source/api-error-codes.rst).
_DESCRIPTIONS = {
    0: "Success",
    1007: "Transaction is too old to perform reads or be committed",
    1020: "Transaction not committed due to conflict with another transaction",
    1021: "Transaction may or may not have committed",
    1025: "Operation aborted because the transaction was cancelled",
    1031: "Operation aborted because the transaction timed out",
    1032: "Too many watches currently set",
    1036: "Read or wrote an unreadable key",
    1039: "The cluster has been upgraded to a new protocol version",
    1101: "Asynchronous operation cancelled",
    2004: "Key outside legal range",
    2005: "Range begin key larger than end key",
    2006: "Option set with an invalid value",
    2017: "Operation issued while a commit was outstanding",
    2020: "Transaction does not have a valid commit version",
    2021: "Transaction is read-only and therefore does not have a commit version",
    2101: "Transaction exceeds byte limit",
    2102: "Key length exceeds limit",
    2103: "Value length exceeds limit",
    2108: "Operation is not supported",
    2203: "API version not valid",
    2210: "EXACT streaming mode requires limits, but none were given",
    4100: "An internal error occurred",
}


def _error_predicate(predicate: int, code: int) -> int:
    """``fdb_error_predicate`` of ``bindings/c/fdb_c.cpp``."""
    if predicate == _PRED_RETRYABLE:
        return int(code in MAYBE_COMMITTED or code in RETRYABLE_NOT_COMMITTED)
    if predicate == _PRED_MAYBE_COMMITTED:
        return int(code in MAYBE_COMMITTED)
    if predicate == _PRED_RETRYABLE_NOT_COMMITTED:
        return int(code in RETRYABLE_NOT_COMMITTED)
    return 0


class _Function:
    """One library function: takes ``argtypes`` / ``restype`` / ``errcheck`` like a ctypes
    function pointer and applies ``errcheck(result, func, args)`` as ctypes does."""

    def __init__(self, name: str, impl: Callable[..., Any]) -> None:
        self.__name__ = name
        self._impl = impl
        self.argtypes: Any = None
        self.restype: Any = None
        self.errcheck: Any = None

    def __call__(self, *args: Any) -> Any:
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

    __slots__ = ("deferred", "stamps", "tr")

    def __init__(self, tr: Any) -> None:
        self.tr = tr
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
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=32, thread_name_prefix="fdb-double")
        self.api_version: int | None = None
        self.header_version = 0
        self.unmodelled_options: list[int] = []
        self._functions: dict[str, _Function] = {}
        for name in dir(self):
            if name.startswith("fdb_"):
                self._functions[name] = _Function(name, getattr(self, name))
        from fdb import fdboptions  # pure Python: the option and mutation codes

        self._ops = _mutation_ops(fdboptions.MutationType)
        self._options = {v[0]: k.lower() for k, v in fdboptions.TransactionOption.items()}
        self._db_options = {v[0]: k.lower() for k, v in fdboptions.DatabaseOption.items()}

    def __getattr__(self, name: str) -> _Function:
        functions = self.__dict__.get("_functions")
        if functions is None or not name.startswith("fdb_"):
            raise AttributeError(name)
        if name not in functions:

            def missing(*_args: Any) -> Any:
                raise NotImplementedError(f"{name} (fdb_c.h) is not modelled by tests/fdb_double.py")

            functions[name] = _Function(name, missing)
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

    def new_cluster_file(self, directory: str | None = None, sim_url: str = DEFAULT_SIM_URL) -> str:
        """Write a cluster file naming a fresh sim store opened from ``sim_url``; its path."""
        ident = uuid.uuid4().hex[:16]
        connection = f"double:{ident}@127.0.0.1:4500"
        self._urls[connection] = sim_url
        fd, path = tempfile.mkstemp(prefix="fdb-double-", suffix=".cluster", dir=directory)
        with os.fdopen(fd, "w") as f:
            f.write(connection + "\n")
        return path

    def sim_database(self, cluster_file: str) -> Any:
        """The SimDatabase behind ``cluster_file`` (for fault scripts and clocks)."""
        return self._store(_connection_string(cluster_file))

    def pending_watches(self) -> int:
        """Watches set through the double and neither fired, failed nor cancelled yet."""
        return len(self._watches)

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

    def _ready(self, fn: Callable[[], Any]) -> int:
        """A future completed now with ``fn()``, or with the code of the EngineError it raised."""
        handle, fut = self._new_future()
        try:
            value = fn()
        except EngineError as exc:
            fut.complete(handle, error=exc.code)
        else:
            fut.complete(handle, value)
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
        return b"double,fdbqueue tests/fdb_double.py"

    def fdb_get_error(self, code: int) -> bytes:
        text = _DESCRIPTIONS.get(code) or ERROR_NAMES.get(code, "Unknown error").replace("_", " ")
        return text.encode()

    def fdb_error_predicate(self, predicate: int, code: int) -> int:
        return _error_predicate(predicate, code)

    def fdb_network_set_option(self, option: int, value: Any, length: int) -> int:
        return 0

    def fdb_setup_network(self) -> int:
        return 0

    def fdb_run_network(self) -> int:
        """The network thread: completes watches until ``fdb_stop_network``."""
        while not self._stop.is_set():
            self._wake.wait(0.002 if self._watches else None)
            self._wake.clear()
            for handle, watch in list(self._watches.items()):
                if watch.is_ready():
                    self._watches.pop(handle, None)
                    self._finish_watch(handle, watch)
        return 0

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
        if self._db_options.get(option) in _NEUTRAL_DATABASE_OPTIONS:
            return 0
        self.unmodelled_options.append(option)
        return 2108

    def fdb_database_create_transaction(self, d: int, out_transaction: Any) -> int:
        try:
            tr = self._store(self._dbs[d]).create_transaction()
        except EngineError as exc:
            return exc.code
        handle = next(self._handles)
        self._txns[handle] = _Txn(tr)
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
        return self._ready(self._txn(tp).tr.get_read_version)

    def fdb_transaction_get(self, tp: int, key: bytes, length: int, snapshot: int) -> int:
        tr = self._txn(tp).tr
        view = tr.snapshot if snapshot else tr
        return self._ready(lambda: view.get(key[:length]))

    def fdb_transaction_get_key(
        self, tp: int, key: bytes, length: int, or_equal: int, offset: int, snapshot: int
    ) -> int:
        tr = self._txn(tp).tr
        view = tr.snapshot if snapshot else tr
        return self._ready(lambda: view.get_key(KeySelector(key[:length], bool(or_equal), int(offset))))

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
        tr = self._txn(tp).tr
        b = KeySelector(begin[:begin_length], bool(begin_or_equal), int(begin_offset))
        e = KeySelector(end[:end_length], bool(end_or_equal), int(end_offset))
        return self._ready(
            lambda: _range_batch(
                tr, b, e, limit, target_bytes, mode, iteration, bool(snapshot), bool(reverse)
            )
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
            if kind == _CONFLICT_READ:
                tr.add_read_conflict_range(begin[:bl], end[:el])
            elif kind == _CONFLICT_WRITE:
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
                opts.set_timeout(_int_param(value))
            elif name == "retry_limit":
                opts.set_retry_limit(_int_param(value))
            elif name == "max_retry_delay":
                opts.set_max_retry_delay(_int_param(value))
            elif name in _NEUTRAL_OPTIONS:
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


# Transaction options that change nothing the sim models (priorities, tags, tracing, logging).
_NEUTRAL_OPTIONS = frozenset(
    {
        "causal_write_risky",
        "causal_read_risky",
        "causal_read_disable",
        "include_port_in_address",
        "priority_system_immediate",
        "priority_batch",
        "debug_retry_logging",
        "transaction_logging_enable",
        "debug_transaction_identifier",
        "log_transaction",
        "transaction_logging_max_field_length",
        "server_request_tracing",
        "tag",
        "auto_throttle_tag",
        "span_parent",
        "read_priority_normal",
        "read_priority_low",
        "read_priority_high",
        "read_server_side_cache_enable",
        "read_server_side_cache_disable",
        "report_conflicting_keys",
    }
)


_NEUTRAL_DATABASE_OPTIONS = frozenset(
    {
        "location_cache_size",
        "max_watches",
        "machine_id",
        "datacenter_id",
        "transaction_logging_max_field_length",
        "transaction_causal_read_risky",
        "transaction_include_port_in_address",
        "transaction_report_conflicting_keys",
        "test_causal_read_risky",
    }
)


def _int_param(value: Any) -> int:
    if not isinstance(value, bytes) or len(value) != 8:
        raise EngineError(2006, "an int option takes 8 bytes")
    (n,) = struct.unpack("<q", value)
    return int(n)


def _mutation_ops(table: dict[str, Any]) -> dict[int, str]:
    """fdb.options MutationType codes -> the contract's atomic op names (API >= 510: V2 semantics)."""
    names = {
        "add": "add",
        "and": "bit_and",
        "bit_and": "bit_and",
        "and_v2": "bit_and",
        "or": "bit_or",
        "bit_or": "bit_or",
        "xor": "bit_xor",
        "bit_xor": "bit_xor",
        "max": "max",
        "min": "min",
        "min_v2": "min",
        "byte_min": "byte_min",
        "byte_max": "byte_max",
        "append_if_fits": "append_if_fits",
        "compare_and_clear": "compare_and_clear",
        "set_versionstamped_key": "set_versionstamped_key",
        "set_versionstamped_value": "set_versionstamped_value",
    }
    return {v[0]: names[k.lower()] for k, v in table.items() if k.lower() in names}


def _connection_string(path: str) -> str:
    with open(path) as f:
        return f.read().strip()


def _range_batch(
    tr: Any,
    begin: KeySelector,
    end: KeySelector,
    limit: int,
    target_bytes: int,
    mode: int,
    iteration: int,
    snapshot: bool,
    reverse: bool,
) -> tuple[list[tuple[bytes, bytes]], bool]:
    """One batch of ``fdb_transaction_get_range``: (rows, more)."""
    rows_limit = limit if limit > 0 else _UNLIMITED
    byte_limit = target_bytes if target_bytes > 0 else _UNLIMITED
    if rows_limit == _UNLIMITED and byte_limit == _UNLIMITED and mode == _EXACT:
        raise EngineError(2210, "exact_mode_without_limits")
    if mode == _WANT_ALL:
        mode = _SERIAL
    if mode == _ITERATOR:
        if iteration <= 0:
            raise EngineError(2000, "client_invalid_operation")
        mode_bytes = _ITERATION_BYTES[min(iteration, len(_ITERATION_BYTES)) - 1]
    elif 0 <= mode <= _SERIAL:
        mode_bytes = _MODE_BYTES[mode]
    else:
        raise EngineError(2000, "client_invalid_operation")
    byte_limit = mode_bytes if byte_limit == _UNLIMITED else min(byte_limit, mode_bytes)
    if byte_limit == _UNLIMITED:
        rows = (
            tr.snapshot.get_range(begin, end, 0 if rows_limit == _UNLIMITED else rows_limit, reverse)
            if (snapshot)
            else tr.get_range(begin, end, 0 if rows_limit == _UNLIMITED else rows_limit, reverse)
        )
        return [(kv.key, kv.value) for kv in rows], len(rows) == rows_limit
    # Every row costs at least 8 bytes (GetRangeLimits::decrement): no more can fit.
    probe_limit = min(rows_limit, byte_limit // 8 + 1) + 1
    probe = tr.snapshot.get_range(begin, end, probe_limit, reverse)
    n, used = 0, 0
    for kv in probe:
        if n >= rows_limit or (n >= 1 and used >= byte_limit):
            break
        n += 1
        used += 8 + len(kv.key) + len(kv.value)
    more = len(probe) > n
    if snapshot:
        rows = probe[:n]
    else:
        # The serializable read of exactly this batch: its read conflict range ends after
        # the last row returned when there is more, at the range's end otherwise.
        rows = tr.get_range(
            begin, end, n if more else (0 if rows_limit == _UNLIMITED else rows_limit), reverse
        )
    return [(kv.key, kv.value) for kv in rows], more


# ---------------------------------------------------------------------------------------------
# Installing the double where the bindings load libfdb_c

_double: CAPIDouble | None = None


def installed() -> CAPIDouble | None:
    """The double the bindings in this process use, if any."""
    return _double


@contextmanager
def _intercept_cdll(double: CAPIDouble) -> Iterator[None]:
    real = ctypes.CDLL

    def cdll(name: Any, *args: Any, **kwargs: Any) -> Any:
        if name and os.path.basename(str(name)) in LIBRARY_NAMES:
            return double
        return real(name, *args, **kwargs)

    ctypes.CDLL = cdll  # type: ignore[misc,assignment]
    try:
        yield
    finally:
        ctypes.CDLL = real  # type: ignore[misc]


def install() -> CAPIDouble:
    """Make the ``fdb`` bindings of this process load :class:`CAPIDouble` instead of libfdb_c.

    Must run before ``fdb.api_version()``. Raises RuntimeError when the bindings already
    run over a real library.
    """
    global _double
    if _double is not None:
        return _double
    import fdb

    double = CAPIDouble()
    impl = sys.modules.get("fdb.impl")
    if impl is None:
        with _intercept_cdll(double):
            impl = importlib.import_module("fdb.impl")
        if impl._capi is not double:
            raise RuntimeError("fdb.impl loaded a real libfdb_c (one is installed next to the bindings)")
    else:
        # Imported already (a real libfdb_c loaded): replace it only while no API version is chosen.
        if fdb.is_api_version_selected():
            raise RuntimeError("the fdb bindings already selected an API version over a real libfdb_c")
        impl._capi = double
        impl._FDBBase.capi = double
    _double = double
    return double
