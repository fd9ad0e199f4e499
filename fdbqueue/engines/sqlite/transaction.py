"""The embedded engine's transaction (``sqlite://``): the store lock from its first operation
to its end, reads through its buffered writes, and a commit that applies them in one SQLite
write transaction with the next version of the store's clock (:class:`.versionclock.VersionClock`).

:mod:`fdbqueue.engines.sqlite.database` says how the engine works as a whole (locking, durability,
versions, nesting); this module is its transaction, which knows the engine only through its
:class:`~.store.Store`, and the SQL it runs. Two bases hold parts of it: its reads
(:class:`~.reads.StoredReads`, ``reads.py``) and its commit's write statements
(:class:`~.writes.WriteApplication`, ``writes.py``).
"""

from __future__ import annotations

import contextlib
import sqlite3
import struct
from types import MappingProxyType

from fdbqueue.engines.contract import (
    KEY_RANGE_REF_BYTES,
    MUTATION_REF_BYTES,
    SYSTEM_KEYS,
    FinishCallback,
    JournalOrder,
)
from fdbqueue.engines.limits import (
    KEY_SIZE_LIMIT,
    TRANSACTION_SIZE_LIMIT,
    TRANSACTION_WINDOW_SECONDS,
    VALUE_SIZE_LIMIT,
)
from fdbqueue.engines.local.mutations import apply_atomic
from fdbqueue.engines.local.transaction import LocalDatabase, LocalTransaction
from fdbqueue.engines.local.watches import EventWatch, StampFuture
from fdbqueue.engines.local.writemap import WriteMap
from fdbqueue.engines.sqlite.files import translate
from fdbqueue.engines.sqlite.reads import StoredReads
from fdbqueue.engines.sqlite.store import Store
from fdbqueue.engines.sqlite.versionclock import Held
from fdbqueue.engines.sqlite.writes import WriteApplication
from fdbqueue.errors import (
    EngineError,
    QueueError,
)

# Python's sqlite3 binds int, float, str and bytearray directly but sends bytes through its
# adapter lookup, which raises and clears two AttributeErrors per parameter (3.11-3.13):
# about a twentieth of a queue operation's CPU. Naming bytes' own adapter makes that lookup
# one dict hit; ``bytes.__bytes__`` (a method, 3.11+), which returns the same object, is a
# direct C call where ``bytes()`` goes through the type's constructor and its own lookup of
# ``__bytes__``. It changes nothing else for any user of sqlite3 in the process: a bytes
# value binds as the same BLOB either way.
sqlite3.register_adapter(bytes, getattr(bytes, "__bytes__", bytes))

_NOTHING: dict[bytes, bytes | None] = {}  # no last commit's writes to trust (never written to)
# A transaction's reads before its begin and after its commit: none, and none may be added
# (a write raises TypeError rather than reach another transaction's reads).
_READ_NOTHING: dict[bytes, bytes | None] = MappingProxyType({})  # type: ignore[assignment]
_VERSION = "SELECT value FROM meta WHERE name = 'version'"


class SqliteTransaction(StoredReads, WriteApplication, LocalTransaction):
    """A transaction holding the store lock from its first operation to its end (or, nested,
    reading a snapshot of its own: see ``Store.begin``)."""

    __slots__ = (
        "_all",
        "_cur",
        "_dirty",
        "_held",
        "_kept_at",
        "_keys",
        "_locked",
        "_nested",
        "_rv",
        "_seen",
        "_sql",
        "_stamped",
        "_store",
        "_values",
        "_wm",
        "_wrote",
    )

    _cur: sqlite3.Cursor  # the cursor of the connection begun on (see _touch)

    def __init__(self, db: LocalDatabase, store: Store) -> None:
        self._store = store
        self._locked = False
        self._nested = False  # reading a snapshot of its own: may not write (Store.begin)
        # _cur, the cursor the statements run on, is set at the begin (_touch): nothing runs one before.
        # LocalTransaction.__init__'s steps, inline (one is made for every operation).
        self.db = db
        self._options = None  # made when first asked (LocalTransaction.options)
        self._retries = 0
        self._created = db.clock()
        self._clear_state()

    def _clear_state(self) -> None:
        # LocalTransaction._clear_state's fields, set here rather than through super(): one
        # call, not two, for every transaction (tests/engines/sqlite/test_lifetime.py checks
        # that both leave the same state).
        self._started: float | None = None
        self._has_reads = False
        self._read_at: float | None = None
        self._has_writes = False
        self._size = 0
        self._committed_version = -1
        self._stamp: StampFuture | None = None
        self._watches: list[EventWatch] | None = None
        self._finish: list[FinishCallback] | None = None
        self._journal: JournalOrder | None = None
        self._state = "open"
        self._cancel_code = 1025
        self._live = False
        self._dirty = False  # a commit version is due (FDB: any mutation or write conflict)
        self._all = False  # a clear_range: watchers must re-read every key
        # The keys the stamped writes landed on (known at commit: _apply_stamped); the others
        # written are the write map's (publish, at commit).
        self._keys: list[bytes] = []
        # Writes, applied at commit: key -> value (None: cleared), the write map's values. The
        # WriteMap itself (sorted keys, cleared ranges) is made when first needed (_map): a
        # range cleared, or read over this transaction's writes; most transactions need none.
        self._values: dict[bytes, bytes | None] = {}
        self._wm: WriteMap[bytes | None] | None = None
        # Stored values this transaction has read: they stay the committed ones while it holds
        # the store lock (a nested reader: its snapshot), so a second read, and an atomic op
        # resolved here, ask SQLite nothing. The write map still decides first. Made at the
        # begin (_touch), where the kept values often stand in for it; until then, and once
        # committed, an empty mapping that refuses writes (nothing reads or writes it then:
        # every read and write begins the transaction first, or refuses a committed one).
        self._seen: dict[bytes, bytes | None] = _READ_NOTHING
        # The version whose values _seen started from (Store.take_kept) until a statement has
        # read the store and found it still the last commit (_check_kept); else None.
        self._kept_at: int | None = None
        # The values this handle's last commit wrote (None: cleared), when the store's last
        # commit is still that one (Store.take_kept): a key not seen yet is looked up here
        # before SQLite is asked (a lease's record, read back by its ack).
        self._wrote: dict[bytes, bytes | None] = _NOTHING
        # Stamped writes, applied at commit: (offset, key, value), the stamp's offset in the
        # key's template, or ~offset in the value's (see _versionstamped).
        self._stamped: list[tuple[int, bytes, bytes]] = []
        self._rv: int | None = None
        self._held: Held | None = None  # what the clock read at the read version (VersionClock)
        # Whether a SQLite transaction is open on _cur: BEGIN runs before the first statement,
        # not when the store lock is taken (see _open_sql).
        self._sql = False

    @property
    def _conn(self) -> sqlite3.Connection:
        """The connection this transaction runs on: its cursor's once begun, else the handle's
        (not kept in a field: only a nested transaction's end and tests ask)."""
        try:
            return self._cur.connection
        except AttributeError:  # not begun: no cursor yet
            return self._store.conn

    def _map(self) -> WriteMap[bytes | None]:
        """The write map over :attr:`_values` (made at the first need: see _clear_state)."""
        wm = self._wm
        if wm is None:
            wm = self._wm = WriteMap()
            wm.values = self._values  # the same dict: a write to either is the other's
        return wm

    def _touch(self) -> None:
        """``LocalTransaction._touch`` with this engine's begin in it: an open transaction's
        first operation takes the store lock here (one call, not two); every other case - a
        used, cancelled or timed-out transaction, a timeout to check - is the general one's."""
        if self._state != "open" or self._started is not None:
            LocalTransaction._touch(self)
            return
        # The begin (LocalTransaction._begin's hook): if it fails (the store lock), _started
        # stays None and the next operation begins again.
        store = self._store
        self._cur, nested = store.begin()
        self._nested = nested
        self._locked = True
        self._sql = nested  # a nested reader's snapshot is begun; else BEGIN waits (_open_sql)
        if store.kept is not None and not nested:
            # The store's last commit is this handle's (Store.take_kept): what it read and
            # wrote is still stored, and is read from here without asking SQLite.
            kept = store.take_kept()
            if kept is not None:
                self._kept_at, self._seen, self._wrote = kept
            else:
                self._seen = {}
        else:
            self._seen = {}
        self._started = 0.0  # begun (LocalTransaction._touch's: no clock read here)
        options = self._options
        self._live = not ((options is not None and options.timeout_ms) or nested)
        if not self._live:
            LocalTransaction._touch(self)  # begun: only the timeout is left to check

    def _open_sql(self) -> None:
        """BEGIN (deferred), before this transaction's first statement: not when the store lock
        is taken, so that a transaction that asks SQLite nothing before its commit (its reads
        all answered by what its handle's last commit kept: an enqueue after an enqueue, an
        ack after its lease; or no reads at all) runs no BEGIN, and commits its writes as one
        statement when one holds them (:meth:`_write`). A deferred BEGIN does nothing but
        leave autocommit mode: SQLite's read snapshot begins at the first read either way
        (https://www.sqlite.org/lang_transaction.html), so a transaction that reads still
        reads one snapshot, taken where it was before. (Once: a second call does nothing.)"""
        if not self._sql:
            self._cur.execute("BEGIN")
            self._sql = True

    def _fail(self, exc: sqlite3.Error) -> QueueError:
        # SQLite may already have rolled the transaction back (disk full, I/O error):
        # end it here, and refuse any later operation, which would otherwise run in
        # autocommit mode outside the lock.
        self._rollback()
        self._state = "failed"
        self._live = False
        return translate(exc, self._store.path, self._store.real)

    # -- the hot calls on their common case ------------------------------------------------------
    #
    # An operation makes a handful of these calls, and each went through LocalTransaction's
    # checks and then this engine's primitives: three to five Python calls. On the common
    # case - a begun transaction without a timeout, not nested, plain keys and values within
    # the limits, no range cleared - these do the same steps inline (the same checks, the
    # same size accounting, the same reads and buffered writes); any other case takes the
    # general path, which raises the precise errors.

    def _read_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        # The checks of every key in C loops, not a Python loop over the keys: all plain
        # bytes, none a system key, none too long. The keys joined answer the last two for the
        # common case in two cheap steps: no 0xff byte anywhere means no key from b"\xff" on,
        # and all of them within one key's limit means each is; only otherwise is ``max``
        # asked (a call of about 1k instructions each in CPython 3.11: its arguments go
        # through a tuple), and the joined length is the size's sum of the keys' lengths.
        if len(keys) < 2 or set(map(type, keys)) != _BYTES_ONLY:
            return super()._read_many(keys, snapshot)
        together = b"".join(keys)
        joined = len(together)
        if (b"\xff" in together and max(keys) >= SYSTEM_KEYS) or (
            joined > KEY_SIZE_LIMIT and max(map(len, keys)) > KEY_SIZE_LIMIT
        ):
            return super()._read_many(keys, snapshot)
        if not self._live:
            self._touch()  # the first operation begins the transaction (an operation's first read)
        if self._values or self._all:
            return super()._read_many(keys, snapshot)
        if self._has_reads:  # _reading's, inline
            self._check_window()
        else:
            self._has_reads = True
            self._read_at = self.db.clock()
        if not snapshot:
            self._size += len(keys) * _POINT_RANGE_BYTES + 2 * joined
        seen = self._seen
        if seen:
            # All of them already read (kept from this handle's own last commit: an enqueue
            # after an enqueue) is checked in C; else those not read yet are asked.
            if not seen.keys() >= set(keys):
                self._select([k for k in dict.fromkeys(keys) if k not in seen])
        else:  # the transaction's first read (an operation's metadata and counters): all asked
            self._select(list(dict.fromkeys(keys)))
        return list(map(seen.__getitem__, keys))

    def set(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` (blind: adds a write conflict only)."""
        if (
            self._live
            and type(key) is bytes
            and type(value) is bytes
            and (n := len(key)) <= KEY_SIZE_LIMIT
            and key < SYSTEM_KEYS
            and (m := len(value)) <= VALUE_SIZE_LIMIT
        ):
            self._size += _SET_BYTES + 3 * n + m
            self._has_writes = self._dirty = True
            wm = self._wm
            if wm is None:  # WriteMap.set without the map: no sorted keys to keep
                self._values[key] = value
            else:
                wm.set(key, value)
            return
        super().set(key, value)

    __setitem__ = set

    def add(self, key: bytes, param: bytes) -> None:
        """Little-endian add; never a read conflict, so hot counters do not conflict."""
        if (
            self._live
            and not self._all
            and type(key) is bytes
            and type(param) is bytes
            and len(key) <= KEY_SIZE_LIMIT
            and key < SYSTEM_KEYS
            and len(param) <= VALUE_SIZE_LIMIT
        ):
            values = self._values
            if key in values:
                existing = values[key]
            else:
                seen = self._seen
                existing = seen[key] if key in seen else self._get(key, True)
            self._size += _SET_BYTES + 3 * len(key) + len(param)
            self._has_writes = self._dirty = True
            if existing is None:
                value = apply_atomic("add", None, param)
            elif len(existing) == len(param) == 8:  # a counter: wrapping 64-bit add, as FoundationDB's
                value = _I64_PACK((_I64_UNPACK(existing)[0] + _I64_UNPACK(param)[0] + 2**63) % 2**64 - 2**63)
            else:
                value = apply_atomic("add", existing, param)
            wm = self._wm
            if wm is None:  # WriteMap.set without the map, as in set
                values[key] = value
            else:
                wm.set(key, value)
            return
        super().add(key, param)

    def clear(self, key: bytes) -> None:
        if self._live and type(key) is bytes and (n := len(key)) <= KEY_SIZE_LIMIT and key < SYSTEM_KEYS:
            # A clear is the mutation ClearRange(key, keyAfter(key)) and that write conflict range.
            self._size += _SET_BYTES + 4 * n + 1
            self._has_writes = self._dirty = True
            wm = self._wm
            if wm is None:  # WriteMap.set without the map, as in set
                self._values[key] = None
            else:
                wm.set(key, None)
            return
        super().clear(key)

    __delitem__ = clear

    def add_read_conflict_key(self, key: bytes) -> None:
        # Nothing to record (see _conflict_range): the checks and the size accounting only.
        if self._live and type(key) is bytes and len(key) <= KEY_SIZE_LIMIT and key < SYSTEM_KEYS:
            self._size += KEY_RANGE_REF_BYTES + 2 * len(key) + 1
            return
        super().add_read_conflict_key(key)

    def _put(self, key: bytes, value: bytes | None) -> None:
        """Buffer a write of ``key`` (None clears it): refused in a nested transaction."""
        if self._nested:
            raise self._store.no_writes()
        wm = self._wm
        if wm is None:
            self._values[key] = value
        else:
            wm.set(key, value)
        self._dirty = True

    def _set(self, key: bytes, value: bytes) -> None:
        self._put(key, value)

    def _clear(self, key: bytes) -> None:
        self._put(key, None)

    def _clear_range(self, begin: bytes, end: bytes) -> None:
        if self._nested:
            raise self._store.no_writes()
        self._map().clear_range(begin, end)
        self._all = self._dirty = True

    def _atomic(self, op: str, key: bytes, param: bytes) -> None:
        # Resolved now against what this transaction sees: it holds the store lock, so no
        # other transaction of fdbqueue commits before it (see the module docstring).
        if self._nested:
            raise self._store.no_writes()
        existing = self._get(key, True)
        if op == "add" and existing is not None:
            self._put(key, _sql_add(existing, param))
        else:
            self._put(key, apply_atomic(op, existing, param))

    def _conflict_range(self, kind: str, begin: bytes, end: bytes) -> None:
        # Nothing to record: under the lock nothing can conflict. A write conflict
        # range still earns a commit version, as on FoundationDB.
        if kind == "write":
            if self._nested:
                raise self._store.no_writes()
            self._dirty = True

    def _read_version(self) -> int:
        if self._rv is None:
            self._rv, self._held = self._store.clock.read_version(self._reserved, self._nested)
        return self._rv

    def _reserved(self) -> int:
        """meta's version reservation (see :class:`VersionClock`)."""
        try:
            if not self._sql:
                self._open_sql()
            return int(self._cur.execute(_VERSION).fetchone()[0])
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc

    # -- the commit: a pipeline of steps, in this order ------------------------------------------

    def commit(self) -> None:
        """Atomically apply every write (``LocalTransaction.commit``). The common case - begun,
        no timeout, writes within the size limit, a read version inside the 5-second window -
        makes the checks ``_commit_attempt`` makes in one condition, then the same
        ``_apply_commit`` (its errors marked ``during_commit``). Anything else (a read-only
        commit, a timeout set, a used or cancelled transaction, too big or too old) takes the
        general path, which raises the precise error (tests/engines/sqlite/test_flat_commit.py
        compares the two)."""
        if self._live and self._dirty and self._has_writes and self._size <= TRANSACTION_SIZE_LIMIT:
            read_at = self._read_at
            if read_at is None or self.db.clock() - read_at <= TRANSACTION_WINDOW_SECONDS:
                # LocalTransaction._apply_commit's steps, inline (one call fewer a commit)
                self._state = "committing"
                self._live = False
                try:
                    version = self._commit()
                except BaseException as exc:
                    self._commit_failed(exc)
                    if isinstance(exc, EngineError):
                        exc.during_commit = True
                    raise
                self._state = "committed"
                self._committed_version = version
                if version >= 0 and self._stamp is not None:
                    self._stamp._version = version
                if self._watches:
                    self.db._arm_watches(self._watches)
                finish = self._finish
                if finish is not None:  # _run_finish's, inline
                    self._finish = None
                    for cb in finish:
                        cb(None)
                return
        LocalTransaction.commit(self)

    def _commit(self) -> int:
        """Commit, as a pipeline of steps in this order: the guards (the store's files are the
        ones opened; the lease is still this holder's, pinned), the writes with their version
        in one SQLite transaction, the marks the commit leaves under the store lock, the lock
        released, the watchers woken, and the WAL made durable (sync=full).

        A transaction that wrote nothing commits its read snapshot only (see
        :meth:`_commit_reads`).
        """
        if not self._dirty:
            return self._commit_reads()
        store = self._store
        changed = store.changed_files()  # guard: the files (a nested reader never writes)
        if changed:
            raise self._refuse(changed)
        if not store.pin():  # guard: the lease
            raise self._too_old()
        version, bumped = self._write()
        seen = store.after_writes(version, bumped)  # the clock settled, the WAL record, the sync mark
        read = self._seen
        if (
            read
            and len(read) <= _KEEP_UP_TO
            and not self._all
            and (not self._stamped or self._stamped_apart())
        ):
            # What this transaction read, with its writes to those keys, is what the store
            # holds for them until another commit: kept for the next transaction to begin
            # (Store.take_kept). The keys it wrote are kept beside them, up to as many, but not
            # merged in: only the next transaction looks at them, for a key it has not seen (a
            # lease's record, read back by its ack), and what it does not read of them is not
            # carried further (an enqueue's new message). A clear of a range or a versionstamp
            # (a key known only now) landing on a key read or written keeps nothing.
            values = self._values
            for key in read.keys() & values.keys():
                read[key] = values[key]
            store.kept = (version, read, values if len(values) <= _KEEP_UP_TO else _NOTHING)  # Store.keep's
            self._seen = _READ_NOTHING  # handed on: committed, this transaction reads no more
        self._locked = False  # _end's, inline: a transaction that wrote is never nested
        store.release()
        # The keys written: the write map's (its keys view, made no list of), and the stamped
        # rows' landed keys when there are any. Nothing mutates the write map after its commit.
        values = self._values
        store.publish(None if self._all else [*values, *self._keys] if self._keys else values.keys())
        if store.syncs and not self._only_volatile():
            # A commit that writes only volatile queues' keys skips the fsync: it survives a
            # process crash (its WAL frames are in the page cache), not a power loss, until the
            # next durable commit or checkpoint flushes the WAL.
            store.make_durable(seen, True)
        return version

    def _commit_reads(self) -> int:
        """Commit a transaction that wrote nothing: its files guarded (unless nested: it holds
        no lock), then, sync=full, wait until what it may have read is on disk."""
        store = self._store
        if not self._nested:
            changed = store.changed_files()
            if changed:
                raise self._refuse(changed)
        if self._sql:  # else it read nothing of SQLite's (all from kept values): nothing to end
            try:
                self._cur.execute("COMMIT")
            except sqlite3.Error as exc:
                raise self._fail(exc) from exc
        seen = store.after_reads()  # under the store lock: what it may have read
        self._end()
        store.make_durable(seen, False)  # never queues behind another's fsync
        return -1

    def _refuse(self, changed: list[tuple[str, str]]) -> QueueError:
        """End this transaction uncommitted: the store's files changed under it
        (``Store.refuse`` says what the handle does about it)."""
        if self._sql:
            with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
                self._cur.execute("ROLLBACK")
            self._sql = False
        error = self._store.refuse(changed)  # still under the store lock
        self._end()
        self._state = "failed"
        self._live = False
        return error

    def _too_old(self) -> EngineError:
        # Past the 5-second window another process took the store lock over (storelock): as
        # on FoundationDB, too old to commit; nothing is applied.
        self._rollback()
        return EngineError(
            1007,
            f"transaction_too_old: this transaction held the store lock of {self._store.path} past the "
            "5-second window and another transaction took it over; nothing was committed",
        )

    def _busy(self, exc: sqlite3.OperationalError) -> EngineError:
        """A write SQLite refused as SQLITE_BUSY (another connection, outside the store lock,
        committed since this transaction read): rolled back, 1020 as FoundationDB's conflict."""
        self._rollback()
        self._state = "failed"
        self._live = False
        return EngineError(
            1020, f"{self._store.path}: another connection committed since this transaction read ({exc})"
        )

    def _rollback(self) -> None:
        if not self._locked:
            return
        try:
            if self._sql:  # else nothing is open: a one-statement commit undoes itself on failure
                self._sql = False
                self._cur.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite already rolled back (after a failed statement): nothing left to undo
        finally:
            self._end()

    def __del__(self) -> None:
        # LocalTransaction.__del__'s rule (an open, begun transaction dropped unfinished is
        # rolled back: its store lock released) on this engine's one flag for it: _locked is
        # set at the begin and cleared by every end (_end, the commit's release).
        try:
            if self._locked:
                self._rollback()
        except Exception:
            pass

    def _end(self) -> None:
        self._locked = False
        if self._nested:
            self._nested = False
            self._store.end(self._conn, True)
        else:
            self._store.release()  # the store lock's own release (Store.release)


_I64 = struct.Struct("<q")
_I64_PACK, _I64_UNPACK = _I64.pack, _I64.unpack
# Bytes one write adds to a transaction's size as FoundationDB counts it (as in
# LocalTransaction): a mutation and a write conflict range [key, keyAfter(key)).
_SET_BYTES = MUTATION_REF_BYTES + KEY_RANGE_REF_BYTES + 1
_POINT_RANGE_BYTES = KEY_RANGE_REF_BYTES + 1
_BYTES_ONLY = {bytes}
_KEEP_UP_TO = 64  # keys a commit keeps for the next transaction at most (Store.keep)


def _sql_add(existing: bytes, param: bytes) -> bytes | None:
    if len(existing) == len(param) == 8:  # a counter: wrapping 64-bit add, as FoundationDB's
        total = _I64.unpack(existing)[0] + _I64.unpack(param)[0]
        return _I64.pack((total + 2**63) % 2**64 - 2**63)
    return apply_atomic("add", existing, param)
