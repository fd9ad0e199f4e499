"""The shared half of the in-process engines (sim and sqlite).

:class:`LocalTransaction` checks arguments exactly as FoundationDB does, accounts the
transaction's size, keeps the options, the retry backoff, the 5-second window and the
life cycle of watches, and delegates storage to the engine's primitives (``_get``,
``_get_range``, ``_set`` ...). :class:`LocalDatabase` adds the clock and the watch hook.
"""

from __future__ import annotations

import random
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable

from fdbqueue.engines.checks import (
    check_bytes,
    check_get_key,
    check_range_end,
    check_read_key,
    check_value,
    check_write_key,
    check_write_range,
    journal_templates,
    key_after,
    strinc,
)
from fdbqueue.engines.contract import (
    BELL_TEMPLATE,
    KEY_RANGE_REF_BYTES,
    MUTATION_REF_BYTES,
    SYSTEM_KEYS,
    FinishCallback,
    JournalOrder,
    KeyOrSelector,
    KeySelector,
    KeyValue,
    TransactionOptions,
    VersionstampFuture,
    Watch,
    register_transaction_type,
)
from fdbqueue.engines.conveniences import DatabaseConveniences
from fdbqueue.engines.limits import (
    KEY_SIZE_LIMIT,
    TRANSACTION_SIZE_LIMIT,
    TRANSACTION_WINDOW_SECONDS,
    VALUE_SIZE_LIMIT,
)
from fdbqueue.engines.local.mutations import check_versionstamp_offset
from fdbqueue.engines.local.snapshot import Snapshot
from fdbqueue.engines.local.watches import EventWatch, StampFuture
from fdbqueue.engines.versions import keep_clock, monotonic
from fdbqueue.errors import RETRYABLE, EngineError

# Bytes one write or conflict range adds to a transaction's size as FoundationDB counts it
# (Transaction::getSize, fdbclient/NativeAPI.actor.cpp; see MUTATION_REF_BYTES in base.py).
# A set is a mutation (key + value) and a write conflict range [key, keyAfter(key)).
_SET_BYTES = MUTATION_REF_BYTES + KEY_RANGE_REF_BYTES + 1
_POINT_RANGE_BYTES = KEY_RANGE_REF_BYTES + 1  # [key, keyAfter(key)): plus twice the key


def _plain_write(key: object, value: object) -> bool:
    """True when ``key`` and ``value`` are bytes within the limits, with no system key; the
    full checks (``check_write_key``, ``check_value``) then raise the precise error."""
    return (
        type(key) is bytes
        and type(value) is bytes
        and len(key) <= KEY_SIZE_LIMIT
        and key < SYSTEM_KEYS
        and len(value) <= VALUE_SIZE_LIMIT
    )


_new_object = object.__new__  # tr.snapshot's view, made without a Python __init__


class LiveOptions(TransactionOptions):
    """A local transaction's options: setting a timeout clears the transaction's ``_live``
    flag, so that its operations check the timeout again (``_touch``) and the hot paths
    need to look at one flag only. The transaction is held weakly: no reference cycle (a
    transaction is freed by its reference count: tests/engines/sqlite/test_lifetime.py)."""

    __slots__ = ("_owner",)

    def __init__(self, owner: LocalTransaction) -> None:
        self.timeout_ms = 0
        self.retry_limit = -1
        self.max_retry_delay_ms = 1000
        self.volatile: tuple[bytes, ...] = ()
        self._owner = weakref.ref(owner)

    def set_timeout(self, ms: int) -> None:
        super().set_timeout(ms)
        owner = self._owner()
        if owner is not None:
            owner._live = False


class LocalTransaction(ABC):
    """The shared half of the sim and sqlite transactions.

    Public methods check arguments exactly as FoundationDB does, account the
    transaction's size, and delegate to the engine's primitives below.
    """

    # Slots: a transaction is made for every operation and its attributes are read at every
    # call; past 30 attributes CPython gives up the shared-key instance dict and every
    # access slows down (scripts/count_instructions.py). ``__dict__`` stays for an engine's
    # or a test's own additions.
    __slots__ = (
        "__dict__",
        "__weakref__",
        "_cancel_code",
        "_committed_version",
        "_created",
        "_finish",
        "_has_reads",
        "_has_writes",
        "_journal",
        "_live",
        "_options",
        "_read_at",
        "_retries",
        "_size",
        "_stamp",
        "_started",
        "_state",
        "_watches",
        "db",
    )

    #: Reading a snapshot of its own, not holding the engine's lock (the sqlite engine's
    #: nested transaction, a slot there): never live, so that its writes take the general
    #: path, which refuses them.
    _nested = False

    def __init__(self, db: LocalDatabase) -> None:
        self.db = db
        self._options: LiveOptions | None = None  # made when first asked (options)
        self._retries = 0
        # The timeout counts from creation or reset, across on_error's retries (RYW's
        # timebomb(timeoutInSeconds + creationTime); resetRyow keeps creationTime).
        self._created = db.clock()
        self._clear_state()

    @property
    def options(self) -> LiveOptions:
        """This transaction's options, made when first asked: most transactions set none, and
        one is made for every operation (its object and its weak reference, about 2.8k
        instructions). Until then every option has its default (``_options`` None: no
        timeout, no volatile prefix, the default retry limit and delay)."""
        found = self._options
        if found is None:
            found = self._options = LiveOptions(self)
        return found

    @property
    def snapshot(self) -> Snapshot:
        """The same reads without read conflicts (a view made at each use: a view kept by the
        transaction would make the two a reference cycle, which only the cyclic garbage
        collector frees, with everything the transaction holds; a transaction is made for
        every operation). Made without a Python ``__init__``: the layer asks for one in about
        every operation."""
        snap = _new_object(Snapshot)
        snap._tr = self
        return snap

    # -- life cycle ----------------------------------------------------------------------------

    def _clear_state(self) -> None:
        self._started: float | None = None
        self._has_reads = False  # took a read version (a read of any kind, get_read_version)
        self._read_at: float | None = None  # the engine clock then
        self._has_writes = False  # a mutation or a write conflict range: not read-only
        # FoundationDB's getSize counted before RYW coalesces the write map and the conflict
        # ranges: exact without overlaps, never below FoundationDB's count (an engine may
        # override _transaction_size to count exactly).
        self._size = 0
        self._committed_version = -1
        # Made when first asked (get_versionstamp, a failed commit), as are the lists of
        # watches and callbacks (watch, on_finish): most transactions use none of them, and
        # one is made for every operation.
        self._stamp: StampFuture | None = None
        self._watches: list[EventWatch] | None = None
        self._finish: list[FinishCallback] | None = None
        self._journal: JournalOrder | None = None  # made by the attempt's first journal entry
        self._state = "open"  # open | committing | committed | failed | cancelled
        # What a cancelled transaction raises until reset: FoundationDB's resetPromise error
        # (1025 after cancel or a re-raising on_error, 1031 after a timeout).
        self._cancel_code = 1025
        # Open, begun and without a timeout: an operation need not call _touch (which
        # runs before every operation otherwise). Cleared whenever _state changes.
        self._live = False

    def _touch(self) -> None:
        """Called before every operation: refuses a used transaction, starts the clocks."""
        if self._state != "open":
            if self._state == "committing":
                raise EngineError(2017, "transaction used during commit")
            if self._state == "cancelled":
                raise EngineError(self._cancel_code, "the transaction was cancelled or timed out: reset() it")
            raise EngineError(2017, "transaction already committed; call reset() to reuse it")
        if self._started is None:
            # Begin first: if it fails (the sqlite lock), the next operation begins again;
            # the clock starts once it succeeded, so lock waits do not eat the 5 s window.
            self._begin()
            # Begun: only whether it is None is ever asked (the window counts from the read
            # version, the timeout from creation), so no clock is read here.
            self._started = 0.0
            # Live: every operation may skip this call, until the state changes or a timeout
            # is set (LiveOptions.set_timeout clears it); never for a transaction that reads a
            # snapshot of its own (an engine's nested one: its writes take the general path).
            options = self._options
            self._live = not ((options is not None and options.timeout_ms) or self._nested)
            if self._live:
                return
        # The clock is read only when a timeout is set: this runs before every operation.
        options = self._options
        if (
            options is not None
            and options.timeout_ms
            and (self.db.clock() - self._created) * 1000.0 >= options.timeout_ms
        ):
            # Every later call (on_error too) raises 1031 until reset: the timeout sets RYW's
            # resetPromise (ReadYourWritesTransaction::setTimeout, fdbclient/ReadYourWrites.cpp).
            self._cancel_after(1031, 1031)
            raise EngineError(1031, f"transaction timed out after {options.timeout_ms} ms")

    def _check_window(self) -> None:
        # From the read version (the first read), not the first operation, as FoundationDB:
        # a transaction that only wrote so far is not too old.
        started = self._read_at
        if started is not None and self.db.clock() - started > TRANSACTION_WINDOW_SECONDS:
            raise EngineError(1007, "transaction is older than the 5-second window")

    def _reading(self) -> None:
        """Before a read: 1007 once the read version is too old; the first takes it."""
        if self._has_reads:
            self._check_window()
        else:
            self._has_reads = True
            self._read_at = self.db.clock()

    def commit(self) -> None:
        """Atomically apply every write; raises a retryable EngineError when it could not.

        Its errors are marked ``during_commit``, as the FoundationDB engine marks what its
        commit raises: a 1031 from a commit leaves the outcome unknown (``maybe_committed``).
        """
        try:
            self._commit_attempt()
        except EngineError as exc:
            exc.during_commit = True
            raise

    def _commit_attempt(self) -> None:
        """The commit itself.

        As Transaction::commitMutations (fdbclient/NativeAPI.actor.cpp): a read-only
        transaction (no mutation, no write conflict range) returns at once, unchecked;
        otherwise the size limit (2101), then, since makeSelfConflicting gives every
        transaction with writes a read conflict range, the resolver's 5-second window on
        its read version (1007) when it took one before commit.
        """
        if not self._live:  # else _touch would find nothing to do
            self._touch()
        if self._has_writes:
            size = self._size
            if size > TRANSACTION_SIZE_LIMIT:
                size = self._transaction_size()
            if size > TRANSACTION_SIZE_LIMIT:
                self._abort(2101)
                raise EngineError(2101, f"transaction of {size} bytes exceeds {TRANSACTION_SIZE_LIMIT}")
            if self._has_reads:
                try:
                    self._check_window()
                except EngineError:
                    self._abort(1007)
                    raise
        self._apply_commit()

    def _apply_commit(self) -> None:
        """The commit past its checks: :meth:`_commit`, then what it leaves, committed or
        failed. (The embedded engine's flat commit, its checks made, runs these steps inline:
        tests/engines/sqlite/test_flat_commit.py holds the two to the same state.)"""
        self._state = "committing"
        self._live = False
        try:
            version = self._commit()
        except BaseException as exc:
            self._commit_failed(exc)
            raise
        self._state = "committed"
        self._committed_version = version
        if version >= 0 and self._stamp is not None:  # else get_versionstamp makes it with the version
            self._stamp._version = version
        if self._watches:
            self.db._arm_watches(self._watches)
        if self._finish is not None:
            self._run_finish(None)

    def _commit_failed(self, exc: BaseException) -> None:
        """What a commit that raised ``exc`` from :meth:`_commit` leaves: the transaction failed
        (cancelled for 1025 and 1031), no versionstamp (2020), its watches and ``on_finish``
        callbacks told. (An engine's own commit path calls it too: one place for the rule.)"""
        if isinstance(exc, EngineError):
            if exc.code in (1025, 1031):  # cancelled or timed out during commit
                self._cancel_after(exc.code, exc.code)
            else:
                self._state = "failed"
            stamp = self._stamp
            if stamp is None:
                stamp = self._stamp = StampFuture()
            stamp._error = 2020  # FoundationDB: no_commit_version after a failed commit
            for w in self._watches or ():
                w.fail(exc.code, "the watch's transaction did not commit")
            self._run_finish(exc)
        else:
            self._state = "failed"
            for w in self._watches or ():
                w.fail(4100, "the watch's transaction did not commit")
            self._run_finish(EngineError(4100, "commit failed"))

    def on_error(self, error: BaseException) -> None:
        """Back off and reset when ``error`` is retryable; otherwise re-raise it (as ``fdb``).

        After a re-raise the transaction stays cancelled: every later call raises 1025
        until :meth:`reset` (RYWImpl::onError, fdbclient/ReadYourWrites.cpp, API >= 610).
        """
        if self._state == "cancelled":  # RYWImpl::onError: "if (resetPromise.isSet()) throw ..."
            raise EngineError(self._cancel_code, "the transaction was cancelled or timed out: reset() it")
        if not isinstance(error, EngineError) or error.code not in RETRYABLE:
            self._cancel_after(getattr(error, "code", 1025))
            raise error
        if self.options.retry_limit >= 0 and self._retries >= self.options.retry_limit:
            self._cancel_after(error.code)
            raise error
        self._retries += 1
        cap = self.options.max_retry_delay_ms / 1000.0
        delay = min(cap, self.db.retry_base_delay * (2 ** (self._retries - 1)))
        self._abort(error.code)
        self._clear_state()
        self.db.backoff(delay * random.uniform(0.5, 1.0) if delay > 0 else 0.0)

    def _cancel_after(self, code: int, sticky: int = 1025) -> None:
        """End the attempt with ``code``; later calls raise ``sticky`` until reset."""
        if self._state != "cancelled":
            self._cancel_code = sticky
        self._abort(code)
        self._state = "cancelled"
        self._live = False

    def reset(self) -> None:
        """Drop every read, write and watch; options too (FoundationDB's reset)."""
        self._abort(1025)
        self._options = None  # the defaults (made again when asked)
        self._retries = 0
        self._created = self.db.clock()
        self._clear_state()

    def cancel(self) -> None:
        """Abandon the transaction; any later call raises 1025."""
        self._cancel_after(1025)

    def _abort(self, code: int) -> None:
        if self._state in ("open", "committing", "failed"):
            if self._started is not None:
                self._rollback()
            for w in self._watches or ():
                w.fail(code, "the watch's transaction did not commit")
            self._watches = None
            if self._finish is not None:
                self._run_finish(EngineError(code))
            self._state = "cancelled" if code == 1025 else "failed"
            self._live = False

    def on_finish(self, callback: FinishCallback) -> None:
        """Call ``callback(error)`` once this attempt ends: None when it committed, else the
        EngineError it ended with (1025 when cancelled or reset, e.g. after an application
        exception; 1020 for a conflict ...), after its locks are released.

        An extension of the FoundationDB API: it is how the layer writes what must
        survive the caller's abort without nesting a transaction inside the caller's.
        """
        if self._finish is None:
            self._finish = [callback]
        else:
            self._finish.append(callback)

    def _run_finish(self, error: EngineError | None) -> None:
        callbacks, self._finish = self._finish, None
        for cb in callbacks or ():
            cb(error)

    def journal_order(self) -> JournalOrder:
        """This attempt's journal numbering (``fdbqueue.ops.journaling``); on_error and reset
        start the next attempt's afresh. An extension of the FoundationDB API."""
        found = self._journal
        if found is None:
            found = self._journal = JournalOrder()
        return found

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

        Adds a read conflict over the part actually read (RYWImpl::read, fdbclient/ReadYourWrites.cpp).
        """
        return self._read_range(begin, end, limit, reverse, False)

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        p = check_bytes("prefix", prefix)
        return self._read_range(p, strinc(p) if p else SYSTEM_KEYS, limit, reverse, False)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in order, as ``get`` of each, in one read of the engine."""
        return self._read_many(keys, False)

    def _read_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        """:meth:`_read_get` of each key, the engine asked once for all (``_get_many``)."""
        if len(keys) < 2:
            return [self._read_get(k, snapshot) for k in keys]
        for key in keys:
            if type(key) is not bytes or key >= SYSTEM_KEYS:
                check_get_key(key)
        if not self._live:
            self._touch()
        self._reading()
        # No stored key is longer than the limit: FoundationDB answers "absent" unread.
        asked = [k for k in keys if len(k) <= KEY_SIZE_LIMIT]
        if not snapshot:
            self._size += sum(_POINT_RANGE_BYTES + 2 * len(k) for k in asked)
        found = self._get_many(asked, snapshot)
        return [found.get(k) for k in keys]

    def _get_many(self, keys: list[bytes], snapshot: bool) -> dict[bytes, bytes | None]:
        """The engine's values of ``keys`` (the write map's first): ``_get`` of each, unless
        the engine reads many at once (the sqlite engine: one statement)."""
        return {k: self._get(k, snapshot) for k in keys}

    def _read_get(self, key: bytes, snapshot: bool) -> bytes | None:
        if type(key) is not bytes or key >= SYSTEM_KEYS:
            check_get_key(key)
        if not self._live:
            self._touch()
        if len(key) > KEY_SIZE_LIMIT:
            # No stored key is that long: FoundationDB answers "absent" without a read
            # (ReadYourWritesTransaction::get, getMaxReadKeySize).
            return None
        self._reading()
        if not snapshot:
            self._size += _POINT_RANGE_BYTES + 2 * len(key)
        return self._get(key, snapshot)

    def _read_key(self, selector: KeySelector, snapshot: bool) -> bytes:
        if not isinstance(selector, KeySelector):
            raise TypeError("get_key takes a KeySelector")
        check_read_key(selector.key)
        self._touch()
        self._reading()
        return self._resolved(selector, snapshot)

    def _resolved(self, selector: KeySelector, snapshot: bool) -> bytes:
        key = self._resolve(selector, snapshot)
        if not snapshot:
            # The read conflict range covers what resolution examined, between the anchor
            # and the answer (either may be keyAfter'ed): at most this many bytes.
            self._size += KEY_RANGE_REF_BYTES + 2 + len(selector.key) + len(key)
        return key

    def _read_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        if not isinstance(limit, int) or limit < 0:
            raise EngineError(2006, f"limit must be a non-negative int, got {limit!r}")
        if not self._live:
            self._touch()
        self._reading()
        if type(begin) is bytes and type(end) is bytes and begin <= SYSTEM_KEYS >= end:
            b, e = check_read_key(begin) if len(begin) > KEY_SIZE_LIMIT else begin, end  # plain keys
        else:
            # Selector keys past b'\xff' are refused too (ReadYourWritesTransaction::getRange).
            if isinstance(begin, KeySelector):
                check_read_key(begin.key)
            if isinstance(end, KeySelector):
                check_range_end(end.key)
            b = self._resolved(begin, snapshot) if isinstance(begin, KeySelector) else check_read_key(begin)
            e = self._resolved(end, snapshot) if isinstance(end, KeySelector) else check_range_end(end)
        if b >= e:
            return []
        out = self._get_range(b, e, limit, reverse, snapshot)
        if not snapshot:
            # The part actually read (as fdbclient/ReadYourWrites.cpp): with the limit reached, up to
            # keyAfter(last) forward, from the last key backward.
            if limit and len(out) == limit:
                if reverse:
                    b = out[-1].key
                else:
                    e = out[-1].key + b"\x00"
            self._size += KEY_RANGE_REF_BYTES + len(b) + len(e)
        return out

    # -- writes --------------------------------------------------------------------------------

    def set(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` (blind: adds a write conflict only)."""
        if not _plain_write(key, value):  # the hot path: two type checks and three comparisons
            key, value = check_write_key(key), check_value(value)
        if not self._live:
            self._touch()
        self._size += _SET_BYTES + 3 * len(key) + len(value)
        self._has_writes = True
        self._set(key, value)

    __setitem__ = set

    def clear(self, key: bytes) -> None:
        if not _plain_write(key, b""):
            key = check_write_key(key)
        if not self._live:
            self._touch()
        # A clear is the mutation ClearRange(key, keyAfter(key)) and that write conflict range.
        self._size += _SET_BYTES + 4 * len(key) + 1
        self._has_writes = True
        self._clear(key)

    __delitem__ = clear

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key in [begin, end); 2005 if end < begin."""
        b, e = check_write_range(begin, end)
        self._touch()
        if b < e:
            self._size += MUTATION_REF_BYTES + KEY_RANGE_REF_BYTES + 2 * (len(b) + len(e))
            self._has_writes = True
            self._clear_range(b, e)

    def clear_range_startswith(self, prefix: bytes) -> None:
        p = check_bytes("prefix", prefix)
        self.clear_range(p, strinc(p) if p else SYSTEM_KEYS)

    def _atomic_op(self, op: str, key: bytes, param: bytes) -> None:
        if not _plain_write(key, param):
            key, param = check_write_key(key), check_value(param)
        if not self._live:
            self._touch()
        self._size += _SET_BYTES + 3 * len(key) + len(param)
        self._has_writes = True
        self._atomic(op, key, param)

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
        check_versionstamp_offset(k)  # the offset, now rather than at commit
        self._touch()
        # The mutation keeps the offset; the write conflict range spans the possible keys
        # without it (getVersionstampKeyRange, fdbclient/ReadYourWrites.cpp).
        self._size += _SET_BYTES + len(k) + 2 * (len(k) - 4) + len(v)
        self._has_writes = True
        self._versionstamped("key", k, v)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """Write ``value`` (with its stamp bytes filled in at commit) at ``key``."""
        k = check_write_key(key)
        v = check_bytes("value", value)
        if len(v) - 4 > VALUE_SIZE_LIMIT:
            raise EngineError(2103, f"value of {len(v) - 4} bytes exceeds {VALUE_SIZE_LIMIT}")
        check_versionstamp_offset(v)
        self._touch()
        self._size += _SET_BYTES + 3 * len(k) + len(v)
        self._has_writes = True
        self._versionstamped("value", k, v)

    def set_journal_entry(
        self,
        order: int,
        entry: bytes,
        value: bytes,
        pointer: bytes | None = None,
        pointer_value: bytes = b"",
        bell: bytes | None = None,
    ) -> None:
        """A journal entry's rows in one call (``contract.Transaction.set_journal_entry``): its
        templates, every argument checked first, through the two calls above."""
        key, pointer_key = journal_templates(order, entry, value, pointer, pointer_value, bell)
        self.set_versionstamped_key(key, value)
        if pointer_key is not None:
            self.set_versionstamped_key(pointer_key, pointer_value)
        if bell is not None:
            self.set_versionstamped_value(bell, BELL_TEMPLATE)

    # -- conflicts, versions, watches ----------------------------------------------------------

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """Add [begin, end) to the read conflict ranges (no read version is taken for it)."""
        b, e = check_read_key(begin), check_range_end(end)
        if e < b:
            raise EngineError(2005, "conflict range end is before begin")
        self._touch()
        self._size += KEY_RANGE_REF_BYTES + len(b) + len(e)
        self._conflict_range("read", b, e)

    def add_read_conflict_key(self, key: bytes) -> None:
        k = check_read_key(key)
        self.add_read_conflict_range(k, key_after(k))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        b, e = check_read_key(begin), check_range_end(end)
        if e < b:
            raise EngineError(2005, "conflict range end is before begin")
        self._touch()
        self._size += KEY_RANGE_REF_BYTES + len(b) + len(e)
        if b < e:
            self._has_writes = True
        self._conflict_range("write", b, e)

    def add_write_conflict_key(self, key: bytes) -> None:
        k = check_read_key(key)
        self.add_write_conflict_range(k, key_after(k))

    def watch(self, key: bytes) -> Watch:
        """A watch armed when this transaction commits (it reads ``key`` serializably)."""
        k = check_write_key(key)
        seen = self._read_get(k, False)
        w = EventWatch(k, seen)
        if self._watches is None:
            self._watches = [w]
        else:
            self._watches.append(w)
        return w

    def get_read_version(self) -> int:
        if not self._live:  # else _touch would find nothing to do
            self._touch()
        if self._has_reads:  # _reading's, inline: the layer asks at every operation (db_now)
            self._check_window()
        else:
            self._has_reads = True
            self._read_at = self.db.clock()
        return self._read_version()

    def get_committed_version(self) -> int:
        """The commit version, or -1 for a read-only or uncommitted transaction."""
        return self._committed_version

    def get_versionstamp(self) -> VersionstampFuture:
        stamp = self._stamp
        if stamp is None:
            stamp = self._stamp = StampFuture()
            if self._state == "committed" and self._committed_version >= 0:
                stamp._version = self._committed_version
        return stamp

    # -- engine primitives ---------------------------------------------------------------------

    def _transaction_size(self) -> int:
        """The size FoundationDB would count; called only when ``_size`` (never lower)
        exceeds the limit, so that an engine that knows its write map can count exactly."""
        return self._size

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


class LocalDatabase(DatabaseConveniences, ABC):
    """The shared half of the sim and sqlite databases."""

    url: str
    engine: str
    retry_base_delay: float = 0.01  # FoundationDB: 10 ms doubling up to max_retry_delay
    # What the layer may skip on an engine that cannot produce it (see engine_traits).
    may_conflict: bool = True
    may_commit_unknown: bool = True

    # Seconds on the engine's clock: CLOCK_MONOTONIC, which tests freeze and move
    # (fdbqueue.engines.versions; the sim engine's can also be a ManualClock). A static
    # alias, not a method: transactions read it before every read. versions.keep_clock makes
    # it time.monotonic itself while no test froze or moved the clock.
    clock: Callable[[], float] = staticmethod(monotonic)

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def backoff(self, seconds: float) -> None:
        """``on_error``'s wait before a retry (the sim engine runs test hooks here)."""
        if seconds > 0:
            self.sleep(seconds)

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


register_transaction_type(LocalTransaction)
keep_clock(LocalDatabase)
