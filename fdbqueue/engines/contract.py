"""The transaction contract every engine implements, modelled on FoundationDB's Python API.

The queue layer is written once against :class:`Transaction` and :class:`Database`.
Reads return values (not futures); everything else mirrors ``fdb``: ``tr.snapshot``,
key selectors, atomic ops, conflict ranges, watches, ``commit`` / ``on_error`` / ``reset``.

Here too: the retry loop every loop of the layer is built on (:func:`retry`), and which
objects are an engine's transactions and databases (:func:`adopt`). Beside it,
``engines/transactional.py`` runs a function in a transaction (``@transactional``) on that
loop, and ``engines/checks.py`` holds the argument checks the engines share;
``engines/local/`` builds the in-process engines' common transaction on them (with the write
map, the mutations they apply themselves, and their watches).
"""

from __future__ import annotations

import enum
import inspect
from collections.abc import Callable
from typing import Any, Generic, NamedTuple, Protocol, TypeVar, runtime_checkable

from fdbqueue.errors import EngineError, QueueError
from fdbqueue.errors import unknown_outcome as commit_unknown

SYSTEM_KEYS = b"\xff"

# How FoundationDB sizes a transaction for the 10 MB limit (``Transaction::getSize`` in
# fdbclient/NativeAPI.actor.cpp): mutations.expectedSize() + read_conflict_ranges.expectedSize()
# + write_conflict_ranges.expectedSize(). ``VectorRef::expectedSize`` (flow/include/flow/Arena.h)
# is sizeof(T) per element plus each element's own expectedSize: a MutationRef's is
# len(param1) + len(param2), a KeyRangeRef's len(begin) + len(end)
# (fdbclient/include/fdbclient/CommitTransaction.h, FDBTypes.h). sizeof on 64-bit builds:
# MutationRef 56 bytes since 7.3's mutation checksums (40 before), KeyRangeRef 32.
MUTATION_REF_BYTES = 56
KEY_RANGE_REF_BYTES = 32

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


class JournalOrder:
    """What one attempt of a transaction has journaled so far (``fdbqueue.ops.journaling``): how
    many entries, the next one's order within the commit's versionstamp, and the queues it
    wrote one in (each queue's bell is rung once a commit).

    Each engine's transaction holds its own (:meth:`Transaction.journal_order`) and drops it
    when the attempt ends (``on_error``, ``reset``): the order belongs to the attempt, so no
    table beside it can fill up, reuse an ``id()`` or tell two wrappers of one transaction apart.
    """

    __slots__ = ("entries", "queues", "time")

    def __init__(self) -> None:
        self.entries = 0
        self.queues: set[str] = set()
        # The database time correction this attempt read (fdbqueue.store.clock), None before:
        # it belongs to the attempt's read version as the journal order does.
        self.time: int | None = None


@runtime_checkable
class Watch(Protocol):
    """A watch on one key: fires once the key's value differs from what its transaction saw.

    Treat a fired watch as a hint: re-read, then re-arm (developer-guide.rst, "Watches").
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

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` (from any thread) once the watch fired or failed; at once if
        it has. How an asyncio waiter waits without a thread of its own."""
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

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` (None where absent), in order: every read issued before
        any is waited on, so one round trip on FoundationDB instead of one per key. The
        same conflicts as ``get`` of each key."""
        ...


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
    def set_journal_entry(
        self,
        order: int,
        entry: bytes,
        value: bytes,
        pointer: bytes | None = None,
        pointer_value: bytes = b"",
        bell: bytes | None = None,
    ) -> None:
        """A journal entry's rows (``fdbqueue.ops.journaling``) in one call: ``value`` at
        ``entry`` + S and ``pointer_value`` at ``pointer`` + S (no pointer when None), S the
        commit's 10-byte versionstamp then ``order`` as two bytes big-endian (a tuple-encoded
        incomplete Versionstamp's 12 bytes, whose code byte the prefixes end with); and, when
        ``bell`` is given, the commit's 10-byte versionstamp as ``bell``'s value. The same
        writes as ``set_versionstamped_key`` of each key's template
        (:func:`journal_templates`) and ``set_versionstamped_value(bell, BELL_TEMPLATE)``, in
        that order; refused whole (nothing written) for what any of them would be refused
        for, or an ``order`` outside 0..65535 (2006). An extension of the FoundationDB API, as
        :meth:`journal_order` is: one call where a journaled operation made three."""
        ...

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
    def journal_order(self) -> JournalOrder: ...


@runtime_checkable
class Database(Protocol):
    """A handle on one store. Thread-safe; each call of ``transactional`` gets its own transaction."""

    url: str
    engine: str
    # Who its transactions act for (``open(url, principal=...)``): set and read by the layer
    # above (its privileges); opaque to the engines, which carry it and never read it.
    principal: str

    def create_transaction(self) -> Transaction: ...
    def close(self) -> None: ...


class TransactionOptions:
    """The per-transaction options FoundationDB keeps across ``on_error`` (the persistent ones)."""

    __slots__ = ("max_retry_delay_ms", "retry_limit", "timeout_ms", "volatile")

    def __init__(self) -> None:
        self.timeout_ms = 0
        self.retry_limit = -1
        self.max_retry_delay_ms = 1000
        self.volatile: tuple[bytes, ...] = ()

    def set_volatile_prefix(self, prefix: bytes) -> None:
        """Keys under ``prefix`` need not survive a power loss: a commit that writes nothing
        else may skip its fsync (the embedded engine; others ignore it). Not a FoundationDB
        option; which keys are volatile is the caller's to say."""
        if prefix not in self.volatile:
            self.volatile = (*self.volatile, bytes(prefix))

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


# set_versionstamped_value's template of a value that is the commit's 10-byte stamp (a bell's)
BELL_TEMPLATE = b"\x00" * 10 + (0).to_bytes(4, "little")


T = TypeVar("T")


class Attempt:
    """What one run of :func:`retry` has met so far, passed to its step and its error hook.

    ``tries``: the retries so far (``on_error`` calls that let the loop go on); ``unknown``:
    some earlier commit may have landed (an error with ``maybe_committed``), so the step must
    check before it writes again; ``conflicts``: the 1020s met. None of them is reset when a
    step commits and goes :class:`Again`: they describe the whole operation.
    """

    # Class attributes, no ``__init__``: every operation makes one, and most never change
    # it; an instance gets a dict of its own only at the first retry (about 1.5k instructions
    # an operation less than a Python ``__init__`` setting three slots).
    tries: int = 0
    unknown: bool = False
    conflicts: int = 0


class Again:
    """A step's answer: commit this transaction, reset it, and run the step again.

    ``then`` runs once the commit succeeded, before the next step: where the step keeps what a
    committed transaction did (a resume point, a count), which a failed commit must not keep.
    """

    __slots__ = ("then",)

    def __init__(self, then: Callable[[], object] | None = None) -> None:
        self.then = then


class Done(Generic[T]):
    """A step's answer: end the loop with ``value`` without committing (the transaction is
    cancelled): for a step that finds nothing to do, or hands the work to another path."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value


class Verdict(enum.Enum):
    """What an ``on_error`` hook of :func:`retry` may answer besides a value to return."""

    RETRY = "retry"  # the default: ``tr.on_error`` backs off and retries, or raises what is not retryable
    RAISE = "raise"  # raise the error as it is, without ``on_error``


RETRY = Verdict.RETRY
RAISE = Verdict.RAISE


def retry(
    db: Database,
    step: Callable[[Transaction, Attempt], T | Again | Done[T]],
    *,
    on_error: Callable[[EngineError, Attempt], T | Verdict] | None = None,
    unknown_outcome: bool | Callable[[Attempt], bool] = False,
) -> T:
    """The retry loop of ``@fdb.transactional``, the one every loop of the layer is built on.

    Runs ``step(tr, attempt)`` in a fresh transaction of ``db`` and commits; an
    :class:`EngineError` (from the step or the commit) goes to ``tr.on_error``, which backs off
    and lets the loop run the step again, or re-raises what is not retryable (as
    ``@fdb.transactional`` does: FoundationDB's api-python.rst). A step answers :class:`Again`
    to commit and go on in a reset transaction (work split over transactions), or
    :class:`Done` to end without a commit.

    ``on_error(exc, attempt)`` sees each error first and answers :data:`RETRY` (the default),
    :data:`RAISE`, or a value that ends the loop (the transaction is cancelled).
    ``unknown_outcome``: when the loop gives up after an earlier commit may have landed
    (``attempt.unknown``, or the predicate given), raise :class:`CommitUnknownError` instead of
    the bare error, so that the caller does not take it for a failure and do it again.
    """
    return retry_loop(_own_database(db, "retry"), step, on_error, unknown_outcome)


def _own_database(db: object, caller: str) -> Database:
    own = adopt(db)
    if is_transaction(own):
        raise QueueError(
            f"{caller} needs a Database (from fdbqueue.open, or an fdb.Database), not a "
            f"transaction ({type(db).__name__}): call body(tr) inside it instead"
        )
    return own  # type: ignore[return-value]


def retry_loop(
    db: Database,
    step: Callable[[Transaction, Attempt], T | Again | Done[T]],
    on_error: Callable[[EngineError, Attempt], T | Verdict] | None,
    unknown_outcome: bool | Callable[[Attempt], bool],
) -> T:
    """:func:`retry`'s loop itself, on a ``db`` already adopted and known to be a Database (a
    caller that checked it saves the second look on every operation)."""
    tr = db.create_transaction()
    attempt = Attempt()
    try:
        while True:
            try:
                result = step(tr, attempt)
                if type(result) is Done:
                    tr.cancel()
                    return result.value
                tr.commit()
                if type(result) is Again:
                    if result.then is not None:
                        result.then()
                    tr.reset()
                    continue
                return result  # type: ignore[return-value]
            except EngineError as exc:
                if exc.maybe_committed:
                    attempt.unknown = True
                if exc.code == 1020:
                    attempt.conflicts += 1
                if on_error is not None:
                    verdict = on_error(exc, attempt)
                    if verdict is not RETRY:
                        if verdict is RAISE:
                            raise
                        tr.cancel()
                        return verdict  # type: ignore[return-value]
                try:
                    tr.on_error(exc)
                except EngineError as final:
                    if attempt.unknown and (
                        unknown_outcome(attempt) if callable(unknown_outcome) else unknown_outcome
                    ):
                        raise commit_unknown(final) from final
                    raise
                attempt.tries += 1
    except BaseException:
        tr.cancel()
        raise


def check_room(db: object) -> None:
    """Raise StoreFullError if ``db``'s engine has no room now for writes that add data.

    An engine opts in with a ``check_room()`` method; the embedded engine's refuses while the
    disk holding the store is below its free-space reserve (``reserve=``,
    engines/sqlite/diskroom.py). Which writes ask is the caller's choice: those that only add
    data, so that the writes that free space still run on a full disk. The other engines never
    refuse: the simulation holds its data in memory, and FoundationDB manages its own space -
    its ratekeeper throttles every transaction as a storage server's or log's free space nears
    its minimum (fdbserver/Ratekeeper.actor.cpp, the knobs MIN_AVAILABLE_SPACE and
    MIN_AVAILABLE_SPACE_RATIO in fdbclient/ServerKnobs.cpp), which it keeps for its own recovery.
    """
    check = getattr(db, "check_room", None)
    if check is not None:
        check()


def engine_traits(db: object) -> tuple[bool, bool]:
    """(may_conflict, may_commit_unknown) of a database; unknown engines: both True.

    A pessimistic engine (the embedded one) never reports a conflict (1020) nor an
    unknown commit result (1021): the layer then skips the staged dequeue path and the
    receipts that settle a 1021, which would be pure cost there.
    """
    found = _traits.get(type(db))
    if found is not None:  # every operation asks: once per class, when the class decides
        own = getattr(db, "__dict__", _NO_DICT)
        # ... unless this instance sets either itself, which Python reads before the class's
        if "may_conflict" not in own and "may_commit_unknown" not in own:
            return found
    kind = type(db)
    traits = bool(getattr(db, "may_conflict", True)), bool(getattr(db, "may_commit_unknown", True))
    # The class's answer is kept only when both are plain class attributes (or absent from a
    # class that hands no attribute on through __getattr__, as a wrapper does: each of its
    # instances answers for what it wraps): a property (the sim engine's may_commit_unknown
    # follows its fault script) is read at every call. An instance's own attribute is looked
    # for at every call (above).
    static = [inspect.getattr_static(kind, name, _ABSENT) for name in ("may_conflict", "may_commit_unknown")]
    hands_on = hasattr(kind, "__getattr__")
    if all(type(value) is bool or (value is _ABSENT and not hands_on) for value in static):
        _traits[kind] = (static[0] is not False, static[1] is not False)
    return traits


_ABSENT = object()
_NO_DICT: dict[str, object] = {}  # an instance without a __dict__ sets nothing of its own


_traits: dict[type, tuple[bool, bool]] = {}


def is_transaction(obj: object) -> bool:
    """True for a transaction of any engine (each engine registers its class)."""
    known = _transaction_kinds.get(type(obj))
    if known is None:  # isinstance of an ABC runs Python code: asked once per type
        known = _transaction_kinds[type(obj)] = isinstance(obj, _TransactionTypes)
    return known


_TransactionTypes: tuple[type, ...] = ()
_transaction_kinds: dict[type, bool] = {}


def register_transaction_type(cls: type) -> None:
    """Let ``transactional`` and the layer recognise an engine's transactions."""
    global _TransactionTypes
    _TransactionTypes = (*_TransactionTypes, cls)
    _transaction_kinds.clear()
    _adopted.clear()


# Raw objects of the ``fdb`` bindings, told apart by their class's module and name: importing
# ``fdb.impl`` to compare classes would load libfdb_c.
_BINDINGS_CLASSES = {("fdb.impl", "Database"): "database", ("fdb.impl", "Transaction"): "transaction"}
_adapters: dict[str, Callable[[Any], Any]] = {}
_load_adapters: Callable[[], object] | None = None
_database_kinds: dict[type, bool] = {}
_adopted: set[type] = set()  # the kinds adopt returns as they are (asked once per type)


def register_bindings_adapter(kind: str, wrap: Callable[[Any], Any]) -> None:
    """How to wrap a raw bindings object of ``kind`` ("database", "transaction"); fdb.py registers."""
    _adapters[kind] = wrap


def register_bindings_loader(load: Callable[[], object]) -> None:
    """What to call, once, when a raw bindings object comes before its adapters are known: the
    package ``fdbqueue.engines`` registers the import of its FoundationDB engine, so that this
    contract names no engine (the engines import it, not the other way)."""
    global _load_adapters
    _load_adapters = load


def adopt(obj: object) -> Transaction | Database:
    """``obj`` as a transaction or database of an fdbqueue engine, or a clear QueueError.

    A raw ``fdb.Database`` of the official bindings becomes an ``FDBDatabase`` (its
    transactions are committed and retried by fdbqueue); a raw ``fdb.Transaction`` becomes
    an ``FDBTransaction`` that joins it: the caller's ``@fdb.transactional`` loop commits and
    retries. Anything else must be an engine's Transaction or Database.
    """
    kind = type(obj)
    if kind in _adopted:  # an engine's own transaction or database: every call of the layer
        return obj  # type: ignore[return-value]
    if is_transaction(obj):
        _adopted.add(kind)
        return obj  # type: ignore[return-value]
    known = _database_kinds.get(kind)
    if known is None:  # isinstance of a protocol runs Python code: asked once per type
        known = _database_kinds[kind] = isinstance(obj, Database)
    if known:
        _adopted.add(kind)
        return obj  # type: ignore[return-value]
    bindings = _BINDINGS_CLASSES.get((kind.__module__, kind.__name__))
    if bindings is not None:
        if bindings not in _adapters and _load_adapters is not None:
            _load_adapters()  # the FoundationDB engine, which registers the adapters
        wrapped: Transaction | Database = _adapters[bindings](obj)
        return wrapped
    raise QueueError(
        f"expected a Database (from fdbqueue.open, or an fdb.Database) or a Transaction of one "
        f"(or an fdb.Transaction), not {kind.__name__}"
    )
