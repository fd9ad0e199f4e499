"""The transaction contract every engine implements, modelled on FoundationDB's Python API.

The queue layer is written once against :class:`Transaction` and :class:`Database`.
Reads return values (not futures); everything else mirrors ``fdb``: ``tr.snapshot``,
key selectors, atomic ops, conflict ranges, watches, ``commit`` / ``on_error`` / ``reset``.

:class:`LocalTransaction` holds what the in-process engines (sim, sqlite) share:
argument checks with FoundationDB's error codes and limits, size accounting, options,
the retry backoff, the 5-second window and the life cycle of watches. An engine
supplies the storage primitives (``_get``, ``_get_range``, ``_set`` ...).
"""

from __future__ import annotations

import functools
import inspect
import random
import struct
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

from fdbqueue.errors import RETRYABLE, EngineError, QueueError

# FoundationDB's limits (known-limitations.rst, ClientKnobs.cpp).
KEY_SIZE_LIMIT = 10_000
VALUE_SIZE_LIMIT = 100_000
TRANSACTION_SIZE_LIMIT = 10_000_000
TRANSACTION_WINDOW_SECONDS = 5.0
SYSTEM_KEYS = b"\xff"

ATOMIC_OPS = frozenset(
    {
        "add",
        "bit_and",
        "bit_or",
        "bit_xor",
        "max",
        "min",
        "byte_max",
        "byte_min",
        "compare_and_clear",
        "append_if_fits",
    }
)


FinishCallback = Callable[[EngineError | None], None]


class KeyValue(NamedTuple):
    """One entry of a range read; unpacks as ``k, v`` like ``fdb.KeyValue``."""

    key: bytes
    value: bytes


class KeySelector(NamedTuple):
    """A key selector with FoundationDB's resolution rule.

    Resolution finds the last key ``< key`` (``<=`` when ``or_equal``), then moves
    ``offset`` keys forward (negative: backward); results clamp to ``b''`` and ``b'\\xff'``.
    """

    key: bytes
    or_equal: bool
    offset: int

    @classmethod
    def last_less_than(cls, key: bytes) -> KeySelector:
        return cls(key, False, 0)

    @classmethod
    def last_less_or_equal(cls, key: bytes) -> KeySelector:
        return cls(key, True, 0)

    @classmethod
    def first_greater_than(cls, key: bytes) -> KeySelector:
        return cls(key, True, 1)

    @classmethod
    def first_greater_or_equal(cls, key: bytes) -> KeySelector:
        return cls(key, False, 1)

    def __add__(self, offset: int) -> KeySelector:  # type: ignore[override]
        return KeySelector(self.key, self.or_equal, self.offset + offset)

    def __sub__(self, offset: int) -> KeySelector:
        return KeySelector(self.key, self.or_equal, self.offset - offset)


KeyOrSelector = bytes | KeySelector


@runtime_checkable
class Watch(Protocol):
    """A watch on one key: fires once the key's value differs from what its transaction saw.

    Treat a fired watch as a hint: re-read, then re-arm (fdb-reference.md §4).
    """

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the watch fires (True) or ``timeout`` seconds pass (False).

        Raises the :class:`EngineError` the watch failed with (1020/1021 when its
        transaction did not commit, 1025 when it was reset or cancelled).
        """
        ...

    def is_ready(self) -> bool:
        """True once the watch fired or failed."""
        ...

    def cancel(self) -> None:
        """Stop watching; a waiter then gets error 1101."""
        ...


class VersionstampFuture(Protocol):
    def wait(self) -> bytes:
        """The 10-byte versionstamp of the committed transaction (8-byte version, 2-byte order)."""
        ...


@runtime_checkable
class ReadView(Protocol):
    """Reads. ``tr`` reads serializably (adding read conflicts); ``tr.snapshot`` adds none."""

    def get(self, key: bytes) -> bytes | None: ...

    def __getitem__(self, key: bytes) -> bytes | None: ...

    def get_key(self, selector: KeySelector) -> bytes: ...

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]: ...

    def get_range_startswith(
        self, prefix: bytes, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]: ...


@runtime_checkable
class Transaction(ReadView, Protocol):
    """One transaction. Nothing it writes is visible to others until :meth:`commit` returns."""

    # Read-only members, so that an engine may narrow their types (a protocol's plain
    # attributes are invariant: SqliteTransaction.db, a SqliteDatabase, would not match).
    @property
    def snapshot(self) -> ReadView: ...
    @property
    def options(self) -> TransactionOptions: ...
    @property
    def db(self) -> Database: ...

    def set(self, key: bytes, value: bytes) -> None: ...
    def __setitem__(self, key: bytes, value: bytes) -> None: ...
    def clear(self, key: bytes) -> None: ...
    def __delitem__(self, key: bytes) -> None: ...
    def clear_range(self, begin: bytes, end: bytes) -> None: ...
    def clear_range_startswith(self, prefix: bytes) -> None: ...
    def add(self, key: bytes, param: bytes) -> None: ...
    def max(self, key: bytes, param: bytes) -> None: ...
    def min(self, key: bytes, param: bytes) -> None: ...
    def byte_max(self, key: bytes, param: bytes) -> None: ...
    def byte_min(self, key: bytes, param: bytes) -> None: ...
    def bit_and(self, key: bytes, param: bytes) -> None: ...
    def bit_or(self, key: bytes, param: bytes) -> None: ...
    def bit_xor(self, key: bytes, param: bytes) -> None: ...
    def compare_and_clear(self, key: bytes, param: bytes) -> None: ...
    def append_if_fits(self, key: bytes, param: bytes) -> None: ...
    def set_versionstamped_key(self, key: bytes, value: bytes) -> None: ...
    def set_versionstamped_value(self, key: bytes, value: bytes) -> None: ...
    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None: ...
    def add_read_conflict_key(self, key: bytes) -> None: ...
    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None: ...
    def add_write_conflict_key(self, key: bytes) -> None: ...
    def watch(self, key: bytes) -> Watch: ...
    def get_read_version(self) -> int: ...
    def get_committed_version(self) -> int: ...
    def get_versionstamp(self) -> VersionstampFuture: ...
    def commit(self) -> None: ...
    def on_error(self, error: BaseException) -> None: ...
    def reset(self) -> None: ...
    def cancel(self) -> None: ...
    def on_finish(self, callback: FinishCallback) -> None: ...


@runtime_checkable
class Database(Protocol):
    """A handle on one store. Thread-safe; each call of ``transactional`` gets its own transaction."""

    url: str
    engine: str

    def create_transaction(self) -> Transaction: ...
    def close(self) -> None: ...


class TransactionOptions:
    """The per-transaction options FoundationDB keeps across ``on_error`` (the persistent ones)."""

    __slots__ = ("max_retry_delay_ms", "retry_limit", "timeout_ms")

    def __init__(self) -> None:
        self.timeout_ms = 0
        self.retry_limit = -1
        self.max_retry_delay_ms = 1000

    def set_timeout(self, ms: int) -> None:
        """Fail the transaction with 1031 (not retryable) ``ms`` after it started; 0 disables."""
        self.timeout_ms = _nonneg_int(ms)

    def set_retry_limit(self, n: int) -> None:
        """Let ``on_error`` retry at most ``n`` times (-1: unlimited)."""
        self.retry_limit = int(n)

    def set_max_retry_delay(self, ms: int) -> None:
        """Cap the backoff between retries (default 1000 ms)."""
        self.max_retry_delay_ms = _nonneg_int(ms)


def _nonneg_int(value: int) -> int:
    if not isinstance(value, int) or value < 0:
        raise EngineError(2006, f"option value must be a non-negative int, got {value!r}")
    return value


# ---------------------------------------------------------------------------------------------
# Argument checks shared by the local engines (FoundationDB raises the same codes).


def check_bytes(name: str, value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"{name} must be bytes, not {type(value).__name__}")
    return value


def check_write_key(key: object) -> bytes:
    k = check_bytes("key", key)
    if len(k) > KEY_SIZE_LIMIT:
        raise EngineError(2102, f"key of {len(k)} bytes exceeds {KEY_SIZE_LIMIT}")
    if k >= SYSTEM_KEYS:
        raise EngineError(2004, "keys at or after b'\\xff' are reserved")
    return k


def check_read_key(key: object) -> bytes:
    k = check_bytes("key", key)
    if len(k) > KEY_SIZE_LIMIT:
        raise EngineError(2102, f"key of {len(k)} bytes exceeds {KEY_SIZE_LIMIT}")
    if k > SYSTEM_KEYS:
        raise EngineError(2004, "keys after b'\\xff' are reserved")
    return k


def check_value(value: object) -> bytes:
    v = check_bytes("value", value)
    if len(v) > VALUE_SIZE_LIMIT:
        raise EngineError(2103, f"value of {len(v)} bytes exceeds {VALUE_SIZE_LIMIT}")
    return v


def clamp_end(key: bytes) -> bytes:
    """Range ends may be anything up to b'\\xff'; later keys are clamped (as FDB clamps selectors)."""
    return key if key <= SYSTEM_KEYS else SYSTEM_KEYS


def strinc(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (fdb's ``strinc``)."""
    p = prefix.rstrip(b"\xff")
    if not p:
        raise ValueError("prefix must contain a byte other than 0xff")
    return p[:-1] + bytes([p[-1] + 1])


def key_after(key: bytes) -> bytes:
    return key + b"\x00"


def apply_atomic(op: str, existing: bytes | None, param: bytes) -> bytes | None:
    """FoundationDB's atomic mutation ``op`` applied to ``existing``; None means cleared."""
    if op == "add":
        n = len(param)
        old = _fit(existing, n)
        total = int.from_bytes(old, "little") + int.from_bytes(param, "little")
        return (total % (1 << (8 * n))).to_bytes(n, "little") if n else b""
    if op in ("max", "min"):
        if existing is None:
            return param
        n = len(param)
        old_i = int.from_bytes(_fit(existing, n), "little")
        new_i = int.from_bytes(param, "little")
        pick = max(old_i, new_i) if op == "max" else min(old_i, new_i)
        return pick.to_bytes(n, "little") if n else b""
    if op == "byte_max":
        return param if existing is None else max(existing, param)
    if op == "byte_min":
        return param if existing is None else min(existing, param)
    if op in ("bit_and", "bit_or", "bit_xor"):
        if existing is None:
            return param
        old = _fit(existing, len(param))
        if op == "bit_and":
            return bytes(a & b for a, b in zip(old, param, strict=False))
        if op == "bit_or":
            return bytes(a | b for a, b in zip(old, param, strict=False))
        return bytes(a ^ b for a, b in zip(old, param, strict=False))
    if op == "compare_and_clear":
        return None if existing == param else existing
    if op == "append_if_fits":
        base = existing or b""
        return base + param if len(base) + len(param) <= VALUE_SIZE_LIMIT else base
    raise ValueError(f"unknown atomic op {op!r}")


def _fit(value: bytes | None, n: int) -> bytes:
    v = value or b""
    return v[:n] if len(v) >= n else v + b"\x00" * (n - len(v))


def fill_versionstamp(template: bytes, stamp: bytes) -> bytes:
    """Replace the 10 bytes at the little-endian offset in ``template``'s last 4 bytes."""
    if len(template) < 4:
        raise EngineError(2006, "versionstamp template needs a 4-byte offset suffix")
    (offset,) = struct.unpack("<I", template[-4:])
    body = template[:-4]
    if offset + 10 > len(body):
        raise EngineError(2006, "versionstamp offset points past the end of the key or value")
    return body[:offset] + stamp + body[offset + 10 :]


def make_versionstamp(version: int, batch: int = 0) -> bytes:
    return struct.pack(">QH", version, batch)


# ---------------------------------------------------------------------------------------------
# Watches and versionstamp futures for the local engines.


class EventWatch:
    """A :class:`Watch` completed by its engine from any thread."""

    __slots__ = ("_error", "_event", "_on_cancel", "key", "seen")

    def __init__(self, key: bytes, seen: bytes | None) -> None:
        self.key = key
        self.seen = seen
        self._event = threading.Event()
        self._error: EngineError | None = None
        self._on_cancel: Callable[[EventWatch], None] | None = None

    def fire(self) -> None:
        self._event.set()

    def fail(self, code: int, message: str | None = None) -> None:
        if not self._event.is_set():
            self._error = EngineError(code, message)
            self._event.set()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._event.wait(timeout):
            return False
        if self._error is not None:
            raise self._error
        return True

    def is_ready(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        self.fail(1101, "watch cancelled")
        if self._on_cancel is not None:
            self._on_cancel(self)


class StampFuture:
    __slots__ = ("_error", "_stamp")

    def __init__(self) -> None:
        self._stamp: bytes | None = None
        self._error: int | None = None

    def wait(self) -> bytes:
        if self._stamp is not None:
            return self._stamp
        raise EngineError(self._error or 2021, "the versionstamp is known only after a commit with writes")


# ---------------------------------------------------------------------------------------------


class _Snapshot:
    """``tr.snapshot``: the same reads without read conflicts; still sees the transaction's writes."""

    __slots__ = ("_tr",)

    def __init__(self, tr: LocalTransaction) -> None:
        self._tr = tr

    def get(self, key: bytes) -> bytes | None:
        return self._tr._read_get(key, True)

    def __getitem__(self, key: bytes) -> bytes | None:
        return self._tr._read_get(key, True)

    def get_key(self, selector: KeySelector) -> bytes:
        return self._tr._read_key(selector, True)

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        return self._tr._read_range(begin, end, limit, reverse, True)

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        p = check_bytes("prefix", prefix)
        return self._tr._read_range(p, strinc(p) if p else SYSTEM_KEYS, limit, reverse, True)


class LocalTransaction(ABC):
    """The shared half of the sim and sqlite transactions.

    Public methods check arguments exactly as FoundationDB does, account the
    transaction's size, and delegate to the engine's primitives below.
    """

    def __init__(self, db: LocalDatabase) -> None:
        self.db = db
        self.options = TransactionOptions()
        self.snapshot = _Snapshot(self)
        self._retries = 0
        self._clear_state()

    # -- life cycle ----------------------------------------------------------------------------

    def _clear_state(self) -> None:
        self._started: float | None = None
        self._has_reads = False
        self._size = 0
        self._committed_version = -1
        self._stamp = StampFuture()
        self._watches: list[EventWatch] = []
        self._finish: list[FinishCallback] = []
        self._state = "open"  # open | committing | committed | cancelled

    def _touch(self) -> None:
        """Called before every operation: refuses a used transaction, starts the clocks."""
        if self._state != "open":
            if self._state == "committing":
                raise EngineError(2017, "transaction used during commit")
            if self._state == "cancelled":
                raise EngineError(1025, "transaction was cancelled")
            raise EngineError(2017, "transaction already committed; call reset() to reuse it")
        now = self.db.clock()
        if self._started is None:
            # Begin first: if it fails (the sqlite lock), the next operation begins again;
            # the clock starts once it succeeded, so lock waits do not eat the 5 s window.
            self._begin()
            self._started = self.db.clock()
            return
        elapsed = now - self._started
        if self.options.timeout_ms and elapsed * 1000.0 >= self.options.timeout_ms:
            self._abort(1031)
            raise EngineError(1031, f"transaction timed out after {self.options.timeout_ms} ms")

    def _check_window(self) -> None:
        if self._started is not None and self.db.clock() - self._started > TRANSACTION_WINDOW_SECONDS:
            raise EngineError(1007, "transaction is older than the 5-second window")

    def commit(self) -> None:
        """Atomically apply every write; raises a retryable EngineError when it could not."""
        self._touch()
        if self._has_reads:
            try:
                self._check_window()
            except EngineError:
                self._abort(1007)
                raise
        if self._size > TRANSACTION_SIZE_LIMIT:
            self._abort(2101)
            raise EngineError(2101, f"transaction of {self._size} bytes exceeds {TRANSACTION_SIZE_LIMIT}")
        self._state = "committing"
        try:
            version = self._commit()
        except EngineError as exc:
            self._state = "cancelled" if exc.code in (1025,) else "failed"
            self._stamp._error = 2020  # FoundationDB: no_commit_version after a failed commit
            for w in self._watches:
                w.fail(exc.code, "the watch's transaction did not commit")
            self._run_finish(exc)
            raise
        except BaseException:
            self._state = "failed"
            for w in self._watches:
                w.fail(4100, "the watch's transaction did not commit")
            self._run_finish(EngineError(4100, "commit failed"))
            raise
        self._state = "committed"
        self._committed_version = version
        if version >= 0:
            self._stamp._stamp = make_versionstamp(version)
        if self._watches:
            self.db._arm_watches(self._watches)
        self._run_finish(None)

    def on_error(self, error: BaseException) -> None:
        """Back off and reset when ``error`` is retryable; otherwise re-raise it (as ``fdb``)."""
        if not isinstance(error, EngineError) or error.code not in RETRYABLE:
            self._abort(getattr(error, "code", 1025))
            raise error
        if self.options.retry_limit >= 0 and self._retries >= self.options.retry_limit:
            self._abort(error.code)
            raise error
        self._retries += 1
        cap = self.options.max_retry_delay_ms / 1000.0
        delay = min(cap, self.db.retry_base_delay * (2 ** (self._retries - 1)))
        self._abort(error.code)
        self._clear_state()
        if delay > 0:
            self.db.sleep(delay * random.uniform(0.5, 1.0))

    def reset(self) -> None:
        """Drop every read, write and watch; options too (FoundationDB's reset)."""
        self._abort(1025)
        self.options = TransactionOptions()
        self._retries = 0
        self._clear_state()

    def cancel(self) -> None:
        """Abandon the transaction; any later call raises 1025."""
        self._abort(1025)
        self._state = "cancelled"

    def _abort(self, code: int) -> None:
        if self._state in ("open", "committing", "failed"):
            if self._started is not None:
                self._rollback()
            for w in self._watches:
                w.fail(code, "the watch's transaction did not commit")
            self._watches = []
            self._run_finish(EngineError(code))
            self._state = "cancelled" if code == 1025 else "failed"

    def on_finish(self, callback: FinishCallback) -> None:
        """Call ``callback(error)`` once this attempt ends: None when it committed, else the
        EngineError it ended with (1025 when cancelled or reset, e.g. after an application
        exception; 1020 for a conflict ...), after its locks are released.

        An extension of the FoundationDB API: it is how the layer writes what must
        survive the caller's abort without nesting a transaction inside the caller's.
        """
        self._finish.append(callback)

    def _run_finish(self, error: EngineError | None) -> None:
        callbacks, self._finish = self._finish, []
        for cb in callbacks:
            cb(error)

    def __del__(self) -> None:
        try:
            if getattr(self, "_state", None) == "open" and self._started is not None:
                self._rollback()
        except Exception:
            pass

    # -- reads ---------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` or None; adds a read conflict on ``key``."""
        return self._read_get(key, False)

    def __getitem__(self, key: bytes) -> bytes | None:
        if isinstance(key, slice):
            return self.get_range(key.start or b"", key.stop or SYSTEM_KEYS, 0, key.step == -1)
        return self._read_get(key, False)

    def get_key(self, selector: KeySelector) -> bytes:
        """The key ``selector`` resolves to; adds a read conflict over what it examined."""
        return self._read_key(selector, False)

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        """Keys in [begin, end) in order (reversed on request), at most ``limit`` (0: all).

        Adds a read conflict over the part actually read (fdb-reference.md §2).
        """
        return self._read_range(begin, end, limit, reverse, False)

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        p = check_bytes("prefix", prefix)
        return self._read_range(p, strinc(p) if p else SYSTEM_KEYS, limit, reverse, False)

    def _read_get(self, key: bytes, snapshot: bool) -> bytes | None:
        k = check_read_key(key)
        self._touch()
        self._check_window()
        self._has_reads = True
        return self._get(k, snapshot)

    def _read_key(self, selector: KeySelector, snapshot: bool) -> bytes:
        if not isinstance(selector, KeySelector):
            raise TypeError("get_key takes a KeySelector")
        check_read_key(selector.key)
        self._touch()
        self._check_window()
        self._has_reads = True
        return self._resolve(selector, snapshot)

    def _read_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        if not isinstance(limit, int) or limit < 0:
            raise EngineError(2006, f"limit must be a non-negative int, got {limit!r}")
        self._touch()
        self._check_window()
        self._has_reads = True
        b = self._resolve(begin, snapshot) if isinstance(begin, KeySelector) else check_read_key(begin)
        e = (
            self._resolve(end, snapshot)
            if isinstance(end, KeySelector)
            else clamp_end(check_bytes("end", end))
        )
        if b >= e:
            return []
        return self._get_range(b, e, limit, reverse, snapshot)

    # -- writes --------------------------------------------------------------------------------

    def set(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` (blind: adds a write conflict only)."""
        k, v = check_write_key(key), check_value(value)
        self._touch()
        self._size += len(k) + len(v)
        self._set(k, v)

    __setitem__ = set

    def clear(self, key: bytes) -> None:
        k = check_write_key(key)
        self._touch()
        self._size += len(k)
        self._clear(k)

    __delitem__ = clear

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key in [begin, end); 2005 if end < begin."""
        b = check_write_key(begin)
        e = clamp_end(check_bytes("end", end))
        if e < b:
            raise EngineError(2005, "clear_range end is before begin")
        self._touch()
        self._size += len(b) + len(e)
        if b < e:
            self._clear_range(b, e)

    def clear_range_startswith(self, prefix: bytes) -> None:
        p = check_bytes("prefix", prefix)
        self.clear_range(p, strinc(p) if p else SYSTEM_KEYS)

    def _atomic_op(self, op: str, key: bytes, param: bytes) -> None:
        k = check_write_key(key)
        p = check_value(param)
        self._touch()
        self._size += len(k) + len(p)
        self._atomic(op, k, p)

    def add(self, key: bytes, param: bytes) -> None:
        """Little-endian add; never a read conflict, so hot counters do not conflict."""
        self._atomic_op("add", key, param)

    def max(self, key: bytes, param: bytes) -> None:
        self._atomic_op("max", key, param)

    def min(self, key: bytes, param: bytes) -> None:
        self._atomic_op("min", key, param)

    def byte_max(self, key: bytes, param: bytes) -> None:
        self._atomic_op("byte_max", key, param)

    def byte_min(self, key: bytes, param: bytes) -> None:
        self._atomic_op("byte_min", key, param)

    def bit_and(self, key: bytes, param: bytes) -> None:
        self._atomic_op("bit_and", key, param)

    def bit_or(self, key: bytes, param: bytes) -> None:
        self._atomic_op("bit_or", key, param)

    def bit_xor(self, key: bytes, param: bytes) -> None:
        self._atomic_op("bit_xor", key, param)

    def compare_and_clear(self, key: bytes, param: bytes) -> None:
        self._atomic_op("compare_and_clear", key, param)

    def append_if_fits(self, key: bytes, param: bytes) -> None:
        self._atomic_op("append_if_fits", key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` with its 10 stamp bytes filled in at commit."""
        k = check_bytes("key", key)
        if len(k) - 4 > KEY_SIZE_LIMIT:
            raise EngineError(2102, f"key of {len(k) - 4} bytes exceeds {KEY_SIZE_LIMIT}")
        if k[:-4] >= SYSTEM_KEYS:
            raise EngineError(2004, "keys at or after b'\\xff' are reserved")
        v = check_value(value)
        fill_versionstamp(k, b"\x00" * 10)  # validates the offset now, not at commit
        self._touch()
        self._size += len(k) + len(v)
        self._versionstamped("key", k, v)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """Write ``value`` (with its stamp bytes filled in at commit) at ``key``."""
        k = check_write_key(key)
        v = check_bytes("value", value)
        if len(v) - 4 > VALUE_SIZE_LIMIT:
            raise EngineError(2103, f"value of {len(v) - 4} bytes exceeds {VALUE_SIZE_LIMIT}")
        fill_versionstamp(v, b"\x00" * 10)
        self._touch()
        self._size += len(k) + len(v)
        self._versionstamped("value", k, v)

    # -- conflicts, versions, watches ----------------------------------------------------------

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        b, e = check_read_key(begin), clamp_end(check_bytes("end", end))
        if e < b:
            raise EngineError(2005, "conflict range end is before begin")
        self._touch()
        self._has_reads = True
        self._size += len(b) + len(e)
        self._conflict_range("read", b, e)

    def add_read_conflict_key(self, key: bytes) -> None:
        k = check_read_key(key)
        self.add_read_conflict_range(k, key_after(k))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        b, e = check_read_key(begin), clamp_end(check_bytes("end", end))
        if e < b:
            raise EngineError(2005, "conflict range end is before begin")
        self._touch()
        self._size += len(b) + len(e)
        self._conflict_range("write", b, e)

    def add_write_conflict_key(self, key: bytes) -> None:
        k = check_read_key(key)
        self.add_write_conflict_range(k, key_after(k))

    def watch(self, key: bytes) -> Watch:
        """A watch armed when this transaction commits (it reads ``key`` serializably)."""
        k = check_write_key(key)
        seen = self._read_get(k, False)
        w = EventWatch(k, seen)
        self._watches.append(w)
        return w

    def get_read_version(self) -> int:
        self._touch()
        return self._read_version()

    def get_committed_version(self) -> int:
        """The commit version, or -1 for a read-only or uncommitted transaction."""
        return self._committed_version

    def get_versionstamp(self) -> VersionstampFuture:
        return self._stamp

    # -- engine primitives ---------------------------------------------------------------------

    def _begin(self) -> None:  # noqa: B027 - a hook: most engines need nothing here
        """The first operation of an attempt (the sqlite engine takes its lock here)."""

    @abstractmethod
    def _get(self, key: bytes, snapshot: bool) -> bytes | None: ...

    @abstractmethod
    def _resolve(self, selector: KeySelector, snapshot: bool) -> bytes: ...

    @abstractmethod
    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]: ...

    @abstractmethod
    def _set(self, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def _clear(self, key: bytes) -> None: ...

    @abstractmethod
    def _clear_range(self, begin: bytes, end: bytes) -> None: ...

    @abstractmethod
    def _atomic(self, op: str, key: bytes, param: bytes) -> None: ...

    @abstractmethod
    def _versionstamped(self, kind: str, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def _conflict_range(self, kind: str, begin: bytes, end: bytes) -> None: ...

    @abstractmethod
    def _read_version(self) -> int: ...

    @abstractmethod
    def _commit(self) -> int:
        """Apply the attempt atomically; return the commit version (-1 when nothing was written).

        On an EngineError nothing may be applied, except for 1021 (maybe committed).
        """

    @abstractmethod
    def _rollback(self) -> None:
        """Discard the attempt (idempotent)."""


class DatabaseConveniences:
    """FoundationDB's Database convenience calls: each is its own retried, committed transaction.

    Mixed into every engine's Database (it needs only ``create_transaction``).
    """

    __slots__ = ()

    def get(self, key: bytes) -> bytes | None:
        return _db_call(self, lambda tr: tr.get(key))

    def __getitem__(self, key: bytes) -> bytes | None:
        return self.get(key)

    def set(self, key: bytes, value: bytes) -> None:
        _db_call(self, lambda tr: tr.set(key, value))

    __setitem__ = set

    def clear(self, key: bytes) -> None:
        _db_call(self, lambda tr: tr.clear(key))

    __delitem__ = clear

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        return _db_call(self, lambda tr: tr.get_range(begin, end, limit, reverse))

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        return _db_call(self, lambda tr: tr.get_range_startswith(prefix, limit, reverse))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        _db_call(self, lambda tr: tr.clear_range(begin, end))

    def get_and_watch(self, key: bytes) -> tuple[bytes | None, Watch]:
        """The value of ``key`` and a watch armed from that value (one committed transaction)."""
        return _db_call(self, lambda tr: (tr.get(key), tr.watch(key)))


class LocalDatabase(DatabaseConveniences, ABC):
    """The shared half of the sim and sqlite databases."""

    url: str
    engine: str
    retry_base_delay: float = 0.01  # FoundationDB: 10 ms doubling up to max_retry_delay
    # What the layer may skip on an engine that cannot produce it (see engine_traits).
    may_conflict: bool = True
    may_commit_unknown: bool = True

    def clock(self) -> float:
        """Seconds on the engine's clock (the sim engine's can be driven by tests)."""
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    @abstractmethod
    def create_transaction(self) -> LocalTransaction: ...

    @abstractmethod
    def _arm_watches(self, watches: list[EventWatch]) -> None:
        """Start watching after a commit; fire at once if a value already differs."""

    def close(self) -> None:
        """Release files and threads; the handle is unusable afterwards."""

    def __enter__(self) -> LocalDatabase:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


T = TypeVar("T")


def _db_call(db: Any, body: Callable[[Transaction], T]) -> T:
    return run_transaction(db, body)


def run_transaction(db: Database, body: Callable[[Transaction], T]) -> T:
    """Run ``body(tr)`` in a fresh transaction on ``db``, retrying retryable errors.

    The loop of ``@fdb.transactional``: commit, and on error ``on_error`` (which backs
    off, or re-raises what is not retryable). A body may therefore run more than once.
    """
    tr = db.create_transaction()
    try:
        while True:
            try:
                result = body(tr)
                if inspect.isgenerator(result):
                    raise ValueError("a transactional function must not return a generator")
                tr.commit()
                return result
            except EngineError as exc:
                tr.on_error(exc)
    except BaseException:
        tr.cancel()
        raise


def engine_traits(db: object) -> tuple[bool, bool]:
    """(may_conflict, may_commit_unknown) of a database; unknown engines: both True.

    A pessimistic engine (the embedded one) never reports a conflict (1020) nor an
    unknown commit result (1021): the layer then skips the staged dequeue path and the
    receipts that settle a 1021, which would be pure cost there.
    """
    return bool(getattr(db, "may_conflict", True)), bool(getattr(db, "may_commit_unknown", True))


def is_transaction(obj: object) -> bool:
    return isinstance(obj, (LocalTransaction, _ForeignTransactionTypes))


_ForeignTransactionTypes: tuple[type, ...] = ()


def register_transaction_type(cls: type) -> None:
    """Let engines outside this module (the FoundationDB one) be recognised as transactions."""
    global _ForeignTransactionTypes
    _ForeignTransactionTypes = (*_ForeignTransactionTypes, cls)


F = TypeVar("F", bound=Callable[..., Any])


def transactional(func: F) -> F:
    """Run ``func`` inside a transaction: the argument ``tr`` (by position or keyword).

    Given a Transaction, ``func`` joins it and the caller commits. Given a Database,
    ``func`` runs in its own transaction, committed and retried on retryable errors
    (so it may run more than once: keep it idempotent). Generator functions are refused.
    """
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise ValueError("generator functions cannot be transactional: the body may run twice")
    params = list(inspect.signature(func).parameters)
    if "tr" not in params:
        raise ValueError(f"{func.__qualname__} needs a parameter named 'tr'")
    index = params.index("tr")

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "tr" in kwargs:
            target = kwargs["tr"]

            def call(tr: Any) -> Any:
                return func(*args, **{**kwargs, "tr": tr})
        elif index < len(args):
            target = args[index]

            def call(tr: Any) -> Any:
                return func(*args[:index], tr, *args[index + 1 :], **kwargs)
        else:
            raise TypeError(f"{func.__qualname__}() missing the transaction or database 'tr'")
        if is_transaction(target):
            return call(target)
        if hasattr(target, "create_transaction"):
            return run_transaction(target, call)
        raise QueueError(
            f"{func.__qualname__}() needs a Database or Transaction as 'tr', not {type(target).__name__}"
        )

    return wrapper  # type: ignore[return-value]


def iter_range_batches(
    tr: ReadView, begin: bytes, end: bytes, batch: int = 1000, reverse: bool = False
) -> Iterator[KeyValue]:
    """Walk [begin, end) in batches of ``batch`` keys (each batch one range read)."""
    while begin < end:
        chunk = tr.get_range(begin, end, batch, reverse)
        yield from chunk
        if len(chunk) < batch:
            return
        if reverse:
            end = chunk[-1].key
        else:
            begin = key_after(chunk[-1].key)
