"""The store a transaction talks to: its connection, the lock file's page, the store lock, the
guards and the marks a commit leaves.

:class:`Store` is all that :class:`~.transaction.SqliteTransaction` knows of the engine: a
small interface, implemented by :class:`WritableStore` (here) and by the read-only store
(:mod:`.readonly`). A Database holds one store; the store holds this handle's files: the
SQLite connection, this process's :class:`~.shared.SharedStore` (lock, page, watch hub), the
files' identities, the WAL's group commit and the WAL record.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import sys
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection
from typing import Any, ClassVar, Protocol

from fdbqueue.engines.local.watches import EventWatch, park_at_exit
from fdbqueue.engines.sqlite import files as _files
from fdbqueue.engines.sqlite import shared as _shared
from fdbqueue.engines.sqlite import walcheck as _walcheck
from fdbqueue.engines.sqlite.notify import WatchHub
from fdbqueue.engines.sqlite.page import (
    BOOT_ID,
    LAST_WORD,
    STORE_WORD,
    WAL_RECORD_BYTES,
    SharedPage,
    clock_tag,
)
from fdbqueue.engines.sqlite.walsync import WalSync
from fdbqueue.errors import NestedTransactionError, QueueError, StoreError

_get_ident = threading.get_ident
_preadv = getattr(os, "preadv", None)  # (not on every system: then os.pread, and a struct)
_HEADER_BYTES = _walcheck.HEADER_BYTES


class Clock(Protocol):
    """The store's version clock (database time): see :class:`~.versionclock.VersionClock`."""

    def read_version(self, reserved: Callable[[], int], nested: bool) -> tuple[int, Any]:
        """A read version: below every later commit's. ``reserved`` reads meta's reservation.
        With it, what the clock read, for :meth:`next_version` (or None)."""

    def next_version(
        self,
        conn: sqlite3.Cursor,
        reserved: Callable[[], int],
        read: int | None,
        held: Any,
        begin: Callable[[], object] | None = None,
        state: Any = None,
    ) -> tuple[int, bool]:
        """The commit version of the write transaction on ``conn``'s connection (above ``read``), and
        whether it raised meta's reservation; ``held``: what :meth:`read_version` returned with ``read``;
        ``begin``: called before its first statement when no SQLite transaction is open yet;
        ``state``: the page's clock as the caller read it under the pin (or None)."""


class Store(ABC):
    """What a transaction needs of its store: a connection to begin on, the clock, the guards
    of a commit and the marks it leaves. The read-only store refuses every write, so a
    transaction on it never reaches the write steps."""

    read_only: ClassVar[bool] = False
    clock: Clock  # set by the Database once the store is open
    syncs = False  # sync=full: each commit's WAL is fsynced before the commit returns

    def __init__(self, real: str, path: str, lock_timeout: float) -> None:
        self.real = real
        self.path = path  # as the user named it, for messages
        self.lock_timeout = lock_timeout
        self.conn: sqlite3.Connection  # the handle's connection (set by the opening)
        self.clock_tag: bytes | None = None  # set once the store's id is known
        self.closed = False
        self.broken: str | None = None  # why this handle refuses work: its files changed
        # The handle's connection's one cursor, made at its first transaction: a statement run
        # through Connection.execute makes (and frees) a cursor each time, a tenth of the
        # cost of a one-key read. Transactions on the connection take turns (the store lock).
        self._cursor: sqlite3.Cursor | None = None
        # Connections for transactions that read a snapshot of their own (rare).
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        # What this handle's last commit read, with the values it left, and that commit's
        # version (see :meth:`keep`); None when there is nothing to trust.
        self.kept: tuple[int, dict[bytes, bytes | None], dict[bytes, bytes | None]] | None = None

    def keep(self, version: int, seen: dict[bytes, bytes | None], wrote: dict[bytes, bytes | None]) -> None:
        """After the COMMIT of ``version``, under the store lock: ``seen``, the stored values
        its transaction read with its own writes applied, and ``wrote``, the values it wrote
        (None: cleared), are what the store holds for those keys until the next commit
        (:meth:`take_kept`)."""
        self.kept = (version, seen, wrote)

    def take_kept(self) -> tuple[int, dict[bytes, bytes | None], dict[bytes, bytes | None]] | None:
        """Under the store lock, after :meth:`begin`: what :meth:`keep` kept (its version, the
        values read, the values written), while the store's last commit is still the one that
        kept it (taken once: the transaction reads into it), else None.

        The begin that took the store lock checked it (``WritableStore.begin``) and dropped
        what a commit since made stale: :attr:`kept` is then None, and this is not asked. (A
        read-only store never keeps anything.)"""
        kept, self.kept = self.kept, None
        return kept

    # -- a transaction's beginning and end ---------------------------------------------------

    @abstractmethod
    def begin(self) -> tuple[sqlite3.Cursor, bool]:
        """Begin a transaction: the cursor of its connection (see :meth:`cursor`), and whether
        it reads a snapshot of its own (``nested``: it may not write) instead of holding the
        store lock."""

    def end(self, conn: sqlite3.Connection, nested: bool) -> None:
        """After COMMIT or ROLLBACK on what :meth:`begin` returned."""
        self.give_back_reader(conn)

    def cursor(self, conn: sqlite3.Connection) -> sqlite3.Cursor:
        """The cursor a transaction on ``conn`` (from :meth:`begin`) runs its statements on:
        the handle's connection keeps one (each ``execute`` on it first resets the statement
        before, so none is left in progress past the transaction's COMMIT); a reader's
        connection gets a fresh one."""
        cur = self._cursor
        if cur is not None and cur.connection is conn:
            return cur
        cur = conn.cursor()
        if conn is self.conn:
            self._cursor = cur
        return cur

    @abstractmethod
    def no_writes(self) -> QueueError:
        """What a write raises in a transaction that may not write."""

    def usable(self) -> None:
        if self.closed:
            park_at_exit()  # closed at interpreter exit under a daemon thread: it stays here
            raise StoreError(f"{self.path}: the database is closed")
        if self.broken is not None:
            raise StoreError(self.broken)

    def snapshot(self) -> sqlite3.Connection:
        """A connection of its own with a read transaction begun (given back at :meth:`end`)."""
        conn = self.take_reader()
        try:
            conn.execute("BEGIN")
        except sqlite3.Error as exc:
            self.give_back_reader(conn)
            raise _files.translate(exc, self.path, self.real) from exc
        return conn

    def take_reader(self) -> sqlite3.Connection:
        with self._readers_lock:
            if self._readers:
                return self._readers.pop()
        try:
            return self.connect_reader()
        except sqlite3.Error as exc:
            raise _files.translate(exc, self.path, self.real) from exc

    @abstractmethod
    def connect_reader(self) -> sqlite3.Connection: ...

    def give_back_reader(self, conn: sqlite3.Connection) -> None:
        with self._readers_lock:
            self._readers.append(conn)

    def close_readers(self) -> None:
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()

    # -- the commit's steps (a transaction that wrote nothing: only the durability) -----------

    #: The guard of the files: those removed or replaced since the open, each with how (an
    #: attribute, bound by a writable store to its files' own method: every commit asks).
    changed_files: Callable[[], list[tuple[str, str]]]

    @abstractmethod
    def refuse(self, changed: list[tuple[str, str]]) -> StoreError:
        """The files guard failed: refuse this handle's commits from now on (the error to raise)."""

    #: The guard of the lease: False when the store lock is no longer this holder's. An
    #: attribute, so that a writable store binds the lock's own method (one call, not three).
    pin: Callable[[], bool]
    #: After COMMIT or ROLLBACK on a connection :meth:`begin` returned with ``nested`` False:
    #: the store lock released (bound like :attr:`pin`).
    release: Callable[[], None]

    @abstractmethod
    def after_writes(self, version: int, bumped: bool) -> int | None:
        """After the COMMIT of ``version``, under the store lock: the marks it leaves."""

    #: After the store lock is released: wake the watches of ``keys`` (None: every key), in
    #: every process (bound like :attr:`changed_files`, to the watch hub's own method).
    publish: Callable[[Collection[bytes] | None], None]

    def after_reads(self) -> int | None:
        """After a COMMIT that wrote nothing, before :meth:`end`: the last version it may have seen."""
        return None

    def make_durable(self, seen: int | None, wait: bool) -> None:  # noqa: B027 - nothing to sync by default
        """After :meth:`end`: return once what the transaction wrote or read is on disk.
        ``wait``: whether it wrote (it may then queue behind another process's fsync, a
        bounded wait; a transaction that only read never queues: see :mod:`.walsync`)."""

    # -- the handle ---------------------------------------------------------------------------

    @abstractmethod
    def arm_watches(self, watches: list[EventWatch]) -> None: ...

    @abstractmethod
    def close(self) -> None: ...


class WritableStore(Store):
    """A store this process may write: the store lock, the lock file's page, the guards."""

    def __init__(self, real: str, path: str, lock_timeout: float, sync: str) -> None:
        super().__init__(real, path, lock_timeout)
        # sync=full: SQLite runs at synchronous=NORMAL and each commit fsyncs the WAL itself,
        # after releasing the store lock (see walsync).
        self.wal = WalSync(real, path) if sync == "full" else None
        self.syncs = self.wal is not None
        self.generation = _shared.fork_generation
        # False after a fork (shared marks this process's handles in the child), a close or a
        # refusal: the begin then takes the general way (reopen, or raise). One flag, so
        # that a transaction's begin asks once.
        self.ready = False
        # The version and the page's word for it (page.LAST_WORD) that this handle's last
        # commit left, and the word of its store id (page.STORE_WORD): what the begin compares
        # to trust what that commit kept. None: nothing to trust.
        self._last: tuple[int, int] | None = None
        self._store_word: int | None = None
        self._cur: sqlite3.Cursor  # the connection's cursor (set by the opening)
        self.shared: _shared.SharedStore
        self.hub: WatchHub
        self.page: SharedPage
        self.files: _files.FileIdentities
        self._walheld: _walcheck.Held
        beside = [real + suffix for suffix in ("-lock", "-wal", "-shm")]
        existed = [os.path.lexists(p) for p in beside]
        try:
            self._open()
        except _files.NotAStore:
            # Leave nothing behind that this open created: the file is nobody's store.
            for p, was in zip(beside, existed, strict=True):
                if not was:
                    with contextlib.suppress(OSError):
                        os.unlink(p)
            raise

    # -- opening -----------------------------------------------------------------------------

    def _open(self) -> None:
        self.generation = _shared.fork_generation
        shared = _shared.attach(self.real, self.path)
        self.shared, self.page, self.hub = shared, shared.page, shared.hub
        # The store lock's guard and release, bound to the lock's methods: a commit calls them
        # without passing through this store.
        # pin: False when another process took the store lock over from this holder (past
        # the 5-second window); else nobody may until the release.
        self.pin = shared.lock.pin
        self.release = shared.lock.release  # both halves, in one call (StoreLock.release)
        self.publish = shared.hub.publish
        self._lock = shared.lock
        self._words = shared.page.words
        _shared.close_at_exit(self)  # the last process to leave leaves only the store's files
        try:
            # Refuses a store whose WAL lost acknowledged commits (walcheck).
            with _walcheck.opening(shared, self.real, self.path, BOOT_ID, self.lock_timeout) as held:
                self.conn = self._connect()
            self._walheld = held
            self.files = _files.FileIdentities(self.real, self.path, shared.ident)
            self.changed_files = self.files.changed
        except BaseException:
            _shared.detach(shared)
            raise
        # The one cursor every transaction on the connection runs on (Store.cursor).
        self._cursor = self._cur = self.conn.cursor()
        if self.clock_tag is not None:
            self._record, self._scatter = _walcheck.record_reader(self.clock_tag)
        self._last = None
        self.ready = not self.closed and self.broken is None

    def _connect(self) -> sqlite3.Connection:
        try:
            # timeout is SQLite's busy handler: a backstop for foreign connections only,
            # since our own writers queue on the store lock before they write.
            conn = sqlite3.connect(
                self.real, timeout=self.lock_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise _files.translate(exc, self.path, self.real) from exc
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if not (self._check_format(conn) and mode == "wal"):
                self._initialise(conn)
            if self.wal:
                self.shared.acquire(self.lock_timeout, self.path)
                try:
                    self.wal.preallocate(conn)
                finally:
                    self.shared.release()
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise _files.translate(exc, self.path, self.real) from exc
            raise
        return conn

    def _check_format(self, conn: sqlite3.Connection) -> bool:
        """True for a valid store (its clock tag known), False for an empty file."""
        store_id = _files.read_format(conn, self.path)
        if store_id is None:
            return False
        self.clock_tag = tag = clock_tag(store_id)
        self._store_word = None if tag is None else int.from_bytes(tag[16:24], sys.byteorder, signed=True)
        return True

    def _initialise(self, conn: sqlite3.Connection) -> None:
        self.shared.acquire(self.lock_timeout, self.path)
        try:
            if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
                raise StoreError(f"{self.path}: SQLite refused WAL mode (is the file system local?)")
            conn.execute("BEGIN IMMEDIATE")
            if not self._check_format(conn):  # another process may have just done it
                for statement in _files.SCHEMA:
                    conn.execute(statement)
                conn.executemany(
                    "INSERT INTO meta (name, value) VALUES (?, ?)",
                    [
                        ("format", _files.FORMAT),
                        ("format_version", _files.FORMAT_VERSION),
                        ("version", 0),
                        ("store_id", secrets.token_bytes(16)),
                    ],
                )
                self._check_format(conn)
            conn.execute("COMMIT")
            # The schema into the database file at once: a store whose WAL is lost later
            # is then an older store, never an empty file taken for a new one.
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        finally:
            try:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
            finally:
                self.shared.release()

    def _reopen_after_fork(self) -> None:
        # Connections inherited through fork() stay referenced and untouched (see shared).
        _shared.inherited.extend((self.conn, self._readers))
        self._readers = []
        self.kept = None
        if self.wal:
            self.wal.after_fork()
        self._open()

    def connect_reader(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self.real, timeout=self.lock_timeout, isolation_level=None, check_same_thread=False
        )

    # -- a transaction's beginning and end ---------------------------------------------------

    def begin(self) -> tuple[sqlite3.Cursor, bool]:
        """The store lock, and the handle's connection's cursor, on which the transaction runs
        BEGIN before its first statement (``SqliteTransaction._open_sql``: one that asks SQLite
        nothing before its commit runs none); or, when this thread holds the lock in another
        transaction, which cannot end while we wait, a snapshot of the last committed state on
        a connection of its own, begun (nested: it may read, not write).

        Under the lock it took, it drops what this handle's last commit kept (:attr:`kept`)
        unless that commit is still the store's last: every commit of every process sets the
        version clock's last version in the lock file's page before its COMMIT
        (``VersionClock.next_version``), and versions only grow, so while the page still names
        that version, under this store's id, no other commit has changed any key since. (A
        commit left pending names its own, later version; an untrusted page is rewritten
        under another tag first.) The page is compared as two native words, no ``struct``
        read: the version's bytes as the commit left them (:meth:`after_writes`) and the store
        id's first eight."""
        if not self.ready:
            self._make_ready()
        lock = self._lock
        me = _get_ident()
        if lock.owner == me:
            return self.cursor(self.snapshot()), True
        # The read snapshot starts at the first read, SQLite's write lock is taken only at
        # commit (writes are buffered until then).
        if not lock.take(me):  # the common case in one call, else everything else (waiting)
            self.shared.acquire(self.lock_timeout, self.path, True, me)  # (me: not nested)
        kept = self.kept
        if kept is not None:
            last, words = self._last, self._words
            if (
                last is None
                or kept[0] != last[0]
                or words[LAST_WORD] != last[1]
                or words[STORE_WORD] != self._store_word
            ):
                self.kept = None
        return self._cur, False

    def _make_ready(self) -> None:
        """The begin's rare cases: a handle inherited through fork() opens its files again;
        a closed or refused one raises."""
        if self.generation != _shared.fork_generation:
            self._reopen_after_fork()
        self.usable()
        self.ready = True

    def end(self, conn: sqlite3.Connection, nested: bool) -> None:
        if nested:
            self.give_back_reader(conn)
        else:
            self.shared.release()

    def no_writes(self) -> QueueError:
        return NestedTransactionError(
            f"this thread holds another transaction on {self.path}: a transaction begun meanwhile "
            "may read (the last committed state) but not write, since the embedded engine has a "
            "single writer and waiting for it here would deadlock"
        )

    # -- the commit's guards -----------------------------------------------------------------

    def refuse(self, changed: list[tuple[str, str]]) -> StoreError:
        """The guard of the files failed (``changed``: see :class:`.files.FileIdentities`):
        refuse this handle's commits from now on. Call under the store lock, after ROLLBACK.

        SQLite cannot notice: a connection keeps writing to the descriptors it opened, so
        after ``rm X.db-wal`` its commits land in a file nobody else can see and that vanishes
        when the process ends (https://www.sqlite.org/howtocorrupt.html, sections 1.3-1.4,
        2.4). When only the WAL went, we still hold it open: a checkpoint copies the commits
        it holds into the database file, so none that was reported is lost, and resets the
        WAL index, so a process that opens the store meanwhile reads a consistent file.
        """
        saved = f"; the commits it held were copied into {self.path}" if self._save_lost_wal(changed) else ""
        what = "; ".join(f"{path} was {how}" for path, how in changed)
        self.ready = False
        self.broken = (
            f"{what} while this process had the store {self.path} open{saved}. Commits are refused "
            "until it is reopened (close it and open it again); never remove or replace a store's "
            "files while a process has it open"
        )
        return StoreError(f"the transaction was not committed: {self.broken}")

    def _save_lost_wal(self, changed: list[tuple[str, str]]) -> bool:
        """When only the WAL was removed or replaced: copy what it holds into the database file.

        Call with the store lock held (no writer appends meanwhile) and no transaction open
        on ``conn``. This connection still has the old WAL open; a checkpoint copies every
        commit in it into the database file, and TRUNCATE resets the WAL index, so a process
        that opens the store afterwards reads the database file alone (and the new WAL).
        True when every frame was copied.
        """
        if {path for path, _ in changed} != {self.files.wal}:
            return False
        try:
            busy, log, done = self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return False
        if busy == 0 and log == done:
            _walcheck.all_copied(self.page)  # an empty WAL is no longer a loss
        return bool(busy == 0 and log == done)

    # -- what a commit leaves ----------------------------------------------------------------

    def after_writes(self, version: int, bumped: bool) -> int | None:
        """After the COMMIT of ``version``, still under the store lock: the clock settled (when
        the commit raised meta's reservation), the WAL record, the sync mark; returns the
        version to make durable (for :meth:`make_durable`)."""
        tag = self.clock_tag
        page = self.page
        if tag is not None:
            if bumped:
                page.clear_pending()  # the raised reservation is committed
            # What the next begin compares to trust what this commit keeps (begin).
            self._last = (version, self._words[LAST_WORD])
            # The WAL record (walcheck): what the WAL index says the WAL holds now, read from
            # -shm at every commit with writes (here, not in a call of its own).
            shm = self._walheld.shm
            if shm is not None:
                if _preadv is not None:
                    # Read into the record itself (walcheck.record_reader), copied whole.
                    try:
                        read = _preadv(shm, self._scatter, 0)
                    except OSError:
                        read = 0
                    if read == _HEADER_BYTES:
                        page.buffer[WAL_RECORD_BYTES] = self._record
                else:
                    try:
                        hdr = os.pread(shm, _HEADER_BYTES, 0)
                    except OSError:
                        hdr = b""
                    if len(hdr) == _HEADER_BYTES:
                        mx_frame, salts, backfilled = _walcheck.HEADER.unpack(hdr)
                        page.set_wal_record(tag, mx_frame, backfilled, salts)
        wal = self.wal
        return None if wal is None else wal.committed(page, tag, version)

    def after_reads(self) -> int | None:
        wal = self.wal
        return wal.committed(self.page, self.clock_tag, -1) if wal else None

    def make_durable(self, seen: int | None, wait: bool) -> None:
        wal = self.wal
        if wal is not None:
            wal.make_durable(self.page, self.clock_tag, seen, wait=wait)

    # -- the handle ---------------------------------------------------------------------------

    def arm_watches(self, watches: list[EventWatch]) -> None:
        if self.generation != _shared.fork_generation:
            self._reopen_after_fork()
        try:
            self.hub.add(watches)
        except OSError as exc:
            # The transaction has committed: report the failure on the watches, not here.
            for w in watches:
                w.fail(4100, f"cannot watch {self.path}: {exc}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.ready = False
        if self.generation != _shared.fork_generation:
            return  # inherited from the parent process: its resources are not ours to release
        self._save_at_close()
        self.conn.close()
        if self.wal:
            self.wal.close()
        self.close_readers()
        _shared.detach(self.shared)
        _walcheck.release(self._walheld)  # after every connection of this handle

    def _save_at_close(self) -> None:
        """A WAL removed under this handle: save what it holds, even if SQLite's close will not.

        SQLite checkpoints at the last connection's close only; another process with the
        store open would leave the commits in the removed WAL to vanish with this process.
        """
        changed = self.files.changed()
        if not changed:
            return
        try:
            self.shared.acquire(self.lock_timeout, self.path)
        except QueueError:
            return  # a transaction of this thread, or a stuck one, holds it: SQLite's close may still
        try:
            self._save_lost_wal(changed)
        finally:
            self.shared.release()
