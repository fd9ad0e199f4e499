"""The FoundationDB engine: a thin pass-through over the official ``fdb`` bindings.

``fdb://`` opens the default cluster file, ``fdb:///path/to/fdb.cluster`` a given one.
URL parameters: ``api_version`` (default 800, or the newest the installed bindings know
if older) and ``timeout`` (seconds to wait for the cluster at open, default 5).

This and ``fdb_open.py`` (opening, and the adapters for raw ``fdb`` objects: what runs once
per database, apart from the wrappers here, which every operation runs through) are the only
modules that touch the untyped ``fdb`` package beyond ``fdb.tuple`` and ``fdb.subspace_impl``
(what they need without the bindings - the URL's parameters, the cluster file, error
translation - is in ``fdb_support.py``). ``fdb.api_version()`` is
called when a database is opened, never at import, so importing fdbqueue works on machines
without the native client library (libfdb_c). Everything the bindings raise as
``fdb.FDBError`` leaves this module as :class:`~fdbqueue.errors.EngineError` with the same
code, raised ``from`` the original.

Deliberate differences from the raw bindings, all for parity with the local engines:
reads return ``bytes | None`` and range reads return materialised lists; argument errors
of writes (types, key/value size limits, system keys, inverted ranges) are raised at the
call instead of at the next wait or commit; range ends past ``b'\\xff'`` are clamped.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

import fdb

from fdbqueue.engines.checks import (
    check_bytes,
    check_value,
    check_write_key,
    check_write_range,
    clamp_end,
    journal_templates,
    strinc,
)
from fdbqueue.engines.contract import (
    BELL_TEMPLATE,
    SYSTEM_KEYS,
    FinishCallback,
    JournalOrder,
    KeyOrSelector,
    KeySelector,
    KeyValue,
    TransactionOptions,
    register_transaction_type,
)
from fdbqueue.engines.conveniences import DatabaseConveniences
from fdbqueue.engines.fdb_support import (
    JOURNAL_ORDER,
    EndsAttempt,
    bindings_version,
    client_library_missing,
    engine_error,
    latest_api_version,
)
from fdbqueue.errors import EngineError, QueueError

__all__ = ["FDBDatabase", "FDBTransaction", "FDBWatch"]

BINDINGS_VERSION = bindings_version(fdb)
LATEST_API_VERSION = latest_api_version(fdb, BINDINGS_VERSION)
DEFAULT_API_VERSION = min(800, LATEST_API_VERSION)
CLIENT_LIBRARY_MISSING = client_library_missing(BINDINGS_VERSION)

T = TypeVar("T")


class _NoBindings(Exception):
    """Stands in for ``fdb.FDBError`` until ``fdb.api_version()`` has been called."""


# FDBStreamingMode (fdbclient/vexillographer/fdb.options): the same in every API version.
_STREAMING_WANT_ALL = -2
_STREAMING_EXACT = 0

# Names the bindings define only after ``fdb.api_version()``; bound by :func:`_bind`.
_FDBError: type[Exception] = _NoBindings
_FDBKeySelector: Any = None


def _bind(module: Any) -> None:
    """Take the names ``fdb`` exports after ``api_version()`` (tests bind a fake module)."""
    global _FDBError, _FDBKeySelector
    _FDBError = module.FDBError
    _FDBKeySelector = module.KeySelector


def _call(fn: Callable[..., T], *args: Any) -> T:
    """Call into the bindings, translating ``fdb.FDBError`` to :class:`EngineError`."""
    try:
        return fn(*args)
    except _FDBError as exc:
        raise engine_error(exc) from exc


def _selector(sel: KeySelector) -> Any:
    if not isinstance(sel, KeySelector):
        raise TypeError(f"expected a KeySelector, not {type(sel).__name__}")
    return _FDBKeySelector(check_bytes("key", sel.key), bool(sel.or_equal), int(sel.offset))


def _range_end(end: KeyOrSelector) -> Any:
    if isinstance(end, KeySelector):
        return _selector(end)
    return clamp_end(check_bytes("end", end))


def _range_begin(begin: KeyOrSelector) -> Any:
    if isinstance(begin, KeySelector):
        return _selector(begin)
    return check_bytes("begin", begin)


def _prefix_range(prefix: bytes) -> tuple[bytes, bytes]:
    p = check_bytes("prefix", prefix)
    return p, (strinc(p) if p else SYSTEM_KEYS)


class _FDBReads:
    """Reads over an ``fdb.Transaction`` (serializable) or its ``.snapshot`` (no conflicts)."""

    __slots__ = ("_reads",)

    def __init__(self, reads: Any) -> None:
        self._reads = reads

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key``, or None when absent (``tr`` adds a read conflict on it)."""
        check_bytes("key", key)
        try:
            value = self._reads.get(key)
            return bytes(value) if value.present() else None
        except _FDBError as exc:
            raise engine_error(exc) from exc

    def __getitem__(self, key: bytes) -> bytes | None:
        if isinstance(key, slice):
            return self.get_range(key.start or b"", key.stop or SYSTEM_KEYS, 0, key.step == -1)
        return self.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in order: every ``get`` future is issued before any is
        waited on, so the reads travel together (one round trip, not one per key; the
        bindings' ``tr.get`` returns an unwaited ``Value`` future, ``bindings/python/fdb/impl.py``).
        """
        for key in keys:
            check_bytes("key", key)
        try:
            futures = [self._reads.get(key) for key in keys]
            return [bytes(f) if f.present() else None for f in futures]
        except _FDBError as exc:
            raise engine_error(exc) from exc

    def get_key(self, selector: KeySelector) -> bytes:
        """The key ``selector`` resolves to (clamped to ``b''`` .. ``b'\\xff'``)."""
        sel = _selector(selector)
        try:
            return bytes(self._reads.get_key(sel))
        except _FDBError as exc:
            raise engine_error(exc) from exc

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        """Keys in [begin, end), at most ``limit`` (0: all), read fully before returning.

        Conflicts cover only the part actually read (RYWImpl::read, fdbclient/ReadYourWrites.cpp).
        """
        if not isinstance(limit, int) or limit < 0:
            raise EngineError(2006, f"limit must be a non-negative int, got {limit!r}")
        b, e = _range_begin(begin), _range_end(end)
        try:
            # The list is read whole: exact (one batch of ``limit`` rows) or want_all, from the
            # first batch on. The bindings' default, iterator, starts with a 4,096-byte batch
            # (bindings/c/fdb_c.cpp) and costs a round trip more on most reads here.
            mode = _STREAMING_EXACT if limit else _STREAMING_WANT_ALL
            rows = self._reads.get_range(b, e, limit, bool(reverse), mode).to_list()
            return [KeyValue(bytes(kv.key), bytes(kv.value)) for kv in rows]
        except _FDBError as exc:
            raise engine_error(exc) from exc

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        """Keys that start with ``prefix`` (``b''``: every key below ``b'\\xff'``)."""
        b, e = _prefix_range(prefix)
        return self.get_range(b, e, limit, reverse)


class FDBTransactionOptions(TransactionOptions):
    """The persistent transaction options, recorded and forwarded to ``fdb``'s ``tr.options``."""

    __slots__ = ("_raw",)

    def __init__(self, raw: Any) -> None:
        super().__init__()
        self._raw = raw

    def set_timeout(self, ms: int) -> None:
        super().set_timeout(ms)
        _call(self._raw.set_timeout, ms)

    def set_retry_limit(self, n: int) -> None:
        super().set_retry_limit(n)
        _call(self._raw.set_retry_limit, self.retry_limit)

    def set_max_retry_delay(self, ms: int) -> None:
        super().set_max_retry_delay(ms)
        _call(self._raw.set_max_retry_delay, ms)


class FDBWatch:
    """A watch future of the bindings behind the :class:`~fdbqueue.engines.contract.Watch` protocol.

    Dropping it unfired cancels it, as dropping the bindings' future does, so an
    abandoned watch does not count against the cluster's watch limit.
    """

    __slots__ = ("_event", "_future")

    def __init__(self, future: Any) -> None:
        self._future = future
        event = self._event = threading.Event()
        # The callback runs on the network thread (or here, when already ready); it must
        # not hold the watch itself, so that dropping the watch can cancel it.
        future.on_ready(lambda _f: event.set())

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the watch fires (True) or ``timeout`` seconds pass (False).

        Raises the :class:`EngineError` it failed with (1020/1021 when its transaction did
        not commit, 1025 when it was reset or cancelled, 1101 when the watch was cancelled).
        """
        if not self._event.wait(timeout):
            return False
        _call(self._future.wait)
        return True

    def is_ready(self) -> bool:
        """True once the watch fired or failed."""
        return self._event.is_set()

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the watch fires or fails, on the network thread (or now):
        the bindings' own ``Future.on_ready``, so an asyncio waiter needs no thread."""
        self._future.on_ready(lambda _f: callback())

    def cancel(self) -> None:
        """Stop watching; a waiter then gets error 1101."""
        _call(self._future.cancel)

    def __del__(self) -> None:
        try:
            if not self._event.is_set():
                self._future.cancel()
        except Exception:
            pass


class FDBVersionstamp:
    """``tr.get_versionstamp()``: ready once the transaction has committed with writes."""

    __slots__ = ("_future",)

    def __init__(self, future: Any) -> None:
        self._future = future

    def wait(self) -> bytes:
        """The 10-byte versionstamp; 2021 for a read-only transaction, 2020 after a failed commit."""
        return bytes(_call(self._future.wait))


class FDBTransaction(_FDBReads):
    """One ``fdb.Transaction`` behind the :class:`~fdbqueue.engines.contract.Transaction` contract."""

    __slots__ = ("_cancelled", "_finish", "_tr", "db", "options", "snapshot")

    def __init__(self, db: FDBDatabase, tr: Any) -> None:
        super().__init__(tr)
        self._tr = tr
        self.db = db
        self.options = FDBTransactionOptions(tr.options)
        self.snapshot = _FDBReads(tr.snapshot)
        self._finish: list[FinishCallback] = []
        self._cancelled = False

    def _writable(self) -> Any:
        """The raw transaction for a write; 1025 after :meth:`cancel`.

        libfdb_c accepts a write to a cancelled transaction and fails only its commit
        (``ThreadSafeTransaction::set`` defers errors, fdbclient/ThreadSafeTransaction.cpp);
        the local engines raise at the call, and so does this engine.
        """
        if self._cancelled:
            raise EngineError(1025, "transaction was cancelled")
        return self._tr

    @property
    def fdb_transaction(self) -> Any:
        """The underlying ``fdb.Transaction`` (an escape hatch; untyped)."""
        return self._tr

    # -- writes (argument errors raised here, as the local engines do) ---------------------------

    def set(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` (blind: adds a write conflict only)."""
        _call(self._writable().set, check_write_key(key), check_value(value))

    __setitem__ = set

    def clear(self, key: bytes) -> None:
        _call(self._writable().clear, check_write_key(key))

    __delitem__ = clear

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key in [begin, end); 2005 if end < begin."""
        _call(self._writable().clear_range, *check_write_range(begin, end))

    def clear_range_startswith(self, prefix: bytes) -> None:
        self.clear_range(*_prefix_range(prefix))

    def _atomic(self, op: str, key: bytes, param: bytes) -> None:
        _call(getattr(self._writable(), op), check_write_key(key), check_value(param))

    def add(self, key: bytes, param: bytes) -> None:
        """Little-endian add; adds no read conflict, so hot counters do not conflict."""
        self._atomic("add", key, param)

    def max(self, key: bytes, param: bytes) -> None:
        self._atomic("max", key, param)

    def min(self, key: bytes, param: bytes) -> None:
        self._atomic("min", key, param)

    def byte_max(self, key: bytes, param: bytes) -> None:
        self._atomic("byte_max", key, param)

    def byte_min(self, key: bytes, param: bytes) -> None:
        self._atomic("byte_min", key, param)

    def bit_and(self, key: bytes, param: bytes) -> None:
        self._atomic("bit_and", key, param)

    def bit_or(self, key: bytes, param: bytes) -> None:
        self._atomic("bit_or", key, param)

    def bit_xor(self, key: bytes, param: bytes) -> None:
        self._atomic("bit_xor", key, param)

    def compare_and_clear(self, key: bytes, param: bytes) -> None:
        self._atomic("compare_and_clear", key, param)

    def append_if_fits(self, key: bytes, param: bytes) -> None:
        self._atomic("append_if_fits", key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` with the 10 bytes at its trailing LE offset stamped at commit."""
        _call(self._writable().set_versionstamped_key, check_bytes("key", key), check_value(value))

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """Write ``value`` (stamped at commit at its trailing LE offset) at ``key``."""
        _call(self._writable().set_versionstamped_value, check_write_key(key), check_bytes("value", value))

    def set_journal_entry(
        self,
        order: int,
        entry: bytes,
        value: bytes,
        pointer: bytes | None = None,
        pointer_value: bytes = b"",
        bell: bytes | None = None,
    ) -> None:
        """A journal entry's rows (``contract.Transaction.set_journal_entry``): its templates,
        every argument checked before the first mutation, as the binding's own calls."""
        key, pointer_key = journal_templates(order, entry, value, pointer, pointer_value, bell)
        tr = self._writable()
        _call(tr.set_versionstamped_key, key, value)
        if pointer_key is not None:
            _call(tr.set_versionstamped_key, pointer_key, pointer_value)
        if bell is not None:
            _call(tr.set_versionstamped_value, bell, BELL_TEMPLATE)

    # -- conflicts, versions, watches --------------------------------------------------------

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        _call(self._writable().add_read_conflict_range, check_bytes("begin", begin), check_bytes("end", end))

    def add_read_conflict_key(self, key: bytes) -> None:
        _call(self._writable().add_read_conflict_key, check_bytes("key", key))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        _call(self._writable().add_write_conflict_range, check_bytes("begin", begin), check_bytes("end", end))

    def add_write_conflict_key(self, key: bytes) -> None:
        _call(self._writable().add_write_conflict_key, check_bytes("key", key))

    def watch(self, key: bytes) -> FDBWatch:
        """A watch on ``key``, armed when this transaction commits (it reads ``key`` serializably)."""
        return FDBWatch(_call(self._tr.watch, check_write_key(key)))

    def get_read_version(self) -> int:
        return int(_call(lambda: self._tr.get_read_version().wait()))

    def get_committed_version(self) -> int:
        """The commit version, or -1 for a read-only or uncommitted transaction."""
        return int(_call(self._tr.get_committed_version))

    def get_versionstamp(self) -> FDBVersionstamp:
        """Ask before :meth:`commit`; the result is ready once the commit succeeded."""
        return FDBVersionstamp(_call(self._tr.get_versionstamp))

    # -- life cycle ----------------------------------------------------------------------------

    def commit(self) -> None:
        """Commit the attempt; raises :class:`EngineError` (retryable or not) when it could not."""
        try:
            self._tr.commit().wait()
        except _FDBError as exc:
            err = engine_error(exc, during_commit=True)
            self._run_finish(err)
            raise err from exc
        except BaseException:
            self._run_finish(EngineError(4100, "commit failed"))
            raise
        self._run_finish(None)

    def on_error(self, error: BaseException) -> None:
        """Back off and reset when ``error`` is retryable; otherwise re-raise it (as ``fdb``).

        The bindings decide, from the original ``FDBError`` (kept as the EngineError's
        ``__cause__``), including the retry limit; an EngineError raised by fdbqueue
        itself is passed on by its code. Anything else is re-raised unchanged.
        """
        self._run_finish(error if isinstance(error, EngineError) else EngineError(1025))
        cause = error.__cause__
        if isinstance(cause, _FDBError):
            arg: Any = cause
        elif isinstance(error, _FDBError):
            arg = error
        elif isinstance(error, EngineError):
            arg = error.code
        else:
            raise error
        try:
            self._tr.on_error(arg).wait()
        except _FDBError as exc:
            if isinstance(error, EngineError) and int(getattr(exc, "code", -1)) == error.code:
                raise error from exc
            raise engine_error(exc) from exc

    def reset(self) -> None:
        """Drop every read, write, watch and option (FoundationDB's reset)."""
        self._run_finish(EngineError(1025))
        _call(self._tr.reset)
        self._cancelled = False
        self.options = FDBTransactionOptions(self._tr.options)

    def cancel(self) -> None:
        """Abandon the transaction; any later call raises 1025 until :meth:`reset`."""
        self._run_finish(EngineError(1025))
        self._cancelled = True
        _call(self._tr.cancel)

    def on_finish(self, callback: FinishCallback) -> None:
        """Call ``callback(error)`` once this attempt ends: None if it committed, else the EngineError.

        An extension of the FoundationDB API (see ``LocalTransaction.on_finish``).
        """
        self._finish.append(callback)

    def _run_finish(self, error: EngineError | None) -> None:
        callbacks, self._finish = self._finish, []
        for cb in callbacks:
            cb(error)

    def journal_order(self) -> JournalOrder:
        """This attempt's journal numbering (``fdbqueue.ops.journaling``), held by the raw
        transaction: every wrapper of one (``adopt`` makes one per call) shares it, and its
        ``on_error`` and ``reset``, whoever calls them, start the next attempt's afresh."""
        raw = self._tr
        found: JournalOrder | None = getattr(raw, JOURNAL_ORDER, None)
        if found is None:
            if JOURNAL_ORDER not in vars(raw):  # its first journaled attempt
                raw.on_error = EndsAttempt(raw, "on_error")
                raw.reset = EndsAttempt(raw, "reset")
            found = JournalOrder()
            setattr(raw, JOURNAL_ORDER, found)
        return found


register_transaction_type(FDBTransaction)


class FDBDatabase(DatabaseConveniences):
    """A FoundationDB database opened through the bindings (``fdb.open``)."""

    engine = "fdb"

    def __init__(self, url: str, raw: Any, cluster_file: str, api_version: int) -> None:
        self.url = url
        self.cluster_file = cluster_file
        self.api_version = api_version
        self._raw = raw
        self._closed = False

    @property
    def fdb_database(self) -> Any:
        """The underlying ``fdb.Database`` (an escape hatch, e.g. for the Directory layer)."""
        return self._raw

    def create_transaction(self) -> FDBTransaction:
        if self._closed:
            raise QueueError(f"the database {self.url} is closed")
        return FDBTransaction(self, _call(self._raw.create_transaction))

    def close(self) -> None:
        """Refuse new transactions. The bindings keep one connection per cluster file for the
        whole process (``fdb.open`` caches it), so nothing is torn down here."""
        self._closed = True

    def __enter__(self) -> FDBDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<FDBDatabase {self.url!r} cluster_file={self.cluster_file!r}>"
