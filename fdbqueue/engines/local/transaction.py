"""The shared half of the in-process engines (sim and sqlite).

:class:`LocalTransaction` checks arguments exactly as FoundationDB does, accounts the
transaction's size, keeps the options, the retry backoff, the 5-second window and the
life cycle of watches, and delegates storage to the engine's primitives (``_get``,
``_get_range``, ``_set`` ...). :class:`LocalDatabase` adds the clock and the watch hook.
The reads, writes and conflict ranges are its base :class:`~.readwrite.ReadsAndWrites`
(``readwrite.py``); its life cycle and commit are here.
"""

from __future__ import annotations

import random
import time
import weakref
from abc import ABC, abstractmethod
from collections.abc import Callable

from fdbqueue.engines.checks import (
    check_write_key,
)
from fdbqueue.engines.contract import (
    FinishCallback,
    JournalOrder,
    TransactionOptions,
    VersionstampFuture,
    Watch,
    register_transaction_type,
)
from fdbqueue.engines.conveniences import DatabaseConveniences
from fdbqueue.engines.limits import (
    TRANSACTION_SIZE_LIMIT,
    TRANSACTION_WINDOW_SECONDS,
)
from fdbqueue.engines.local.readwrite import ReadsAndWrites
from fdbqueue.engines.local.snapshot import Snapshot
from fdbqueue.engines.local.watches import EventWatch, StampFuture
from fdbqueue.engines.versions import keep_clock, monotonic
from fdbqueue.errors import RETRYABLE, EngineError

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


class LocalTransaction(ReadsAndWrites):
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

    # -- versions, watches ----------------------------------------------------------------------

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

    def _begin(self) -> None:
        """The first operation of an attempt (the sqlite engine takes its lock here)."""

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
