"""The embedded engine: one SQLite file, safe for many threads and processes.

URL: ``sqlite:///abs/path.db``, ``sqlite://rel/path.db`` or ``sqlite://~/path.db`` (the home
directory), with ``sync=full`` (default: every commit is fsynced before it returns, so it
survives power loss) or ``sync=normal`` (survives a process crash; the last commits may be
lost on power loss), ``lock_timeout=10`` (seconds a transaction may wait for the store lock),
``mode=rw`` (default) or ``mode=ro`` (read-only), and ``reserve=16M`` (bytes, units K, M, G,
T; ``0``: off): while the disk holding the store has less free space, enqueues are refused
with StoreFullError so that consumers can still drain it (:mod:`._diskroom`). The file is
created if missing, its directory never: a missing one is a StoreError naming it.

Files: ``X.db`` (the data) and ``X.db-lock`` (the store lock and the shared version page,
4 KB, kept after close: see docs/architecture.md); while a process has the store open,
SQLite's ``X.db-wal`` and ``X.db-shm``, which SQLite removes at the last close, and while one
watches, ``X.db-notify/``, which the last watcher removes. A file that is not a store is
refused before anything is created beside it. Every commit checks that none of the four
files was removed or replaced since the open (:mod:`._storefiles`) and refuses if one was.

Read-only (``mode=ro``, or found so: a read-only mount, no write permission): no lock, no
file created; each transaction reads the last committed state, any write raises StoreError.

Concurrency: pessimistic and serializable, one writer at a time. A transaction takes the
store lock at its first operation and holds it until it commits or rolls back. The lock is
a per-process ``threading.Lock`` (threads), then, between processes, a lease
(:mod:`._storelock`: an open-file-description lock of one byte of ``<db>-lock`` per lock
generation; the kernel wakes the next waiter on release, where SQLite's busy handler would
sleep and poll), then a deferred ``BEGIN`` on the Database's one connection, which only the
lock holder uses. Reads go to SQLite's read snapshot, which begins at the first read (under
the lock); writes are buffered in memory (:mod:`._writemap`) and read through
(read-your-writes, snapshot reads too), atomic ops are resolved against that view when
made (exact: no other fdbqueue transaction commits meanwhile), and conflict ranges record
nothing. At commit the buffered writes are applied in one SQLite write transaction, so
SQLite's write lock is held for the commit only, never across user code.

The 5-second window bounds the lock, as FoundationDB bounds transactions: a process
waiting for it takes it over from a holder that has had it longer than the window (a
stopped process, a slow handler), and the holder's commit then fails with 1007
transaction_too_old, applying nothing. Should another connection have committed since a
snapshot began (SQLite's ``SQLITE_BUSY_SNAPSHOT``: a holder that lost the lock, or a foreign
writer), the commit fails with 1020 and applies nothing: serializability rests on SQLite's
snapshot check, not on the lock alone. Waiting longer than ``lock_timeout`` for the store
lock raises 1037 (retryable).

Nesting: a transaction begun by a thread that already holds the lock (through any handle
on the file) cannot wait for it: that would deadlock. It reads the last committed state
from a WAL snapshot on a connection of its own instead, and its first write raises
:class:`NestedTransactionError`. So ``db.get(k)`` inside an open transaction works (and
does not see that transaction's writes), while a nested write fails at once.

Durability (``sync=full``): SQLite runs at ``synchronous=NORMAL`` and each commit then
fdatasyncs the WAL itself, after releasing the store lock, before it returns; a read-only
transaction that may have seen a commit still in its fsync fdatasyncs too. So commits that
overlap share one flush of the disk (:mod:`._walsync` says how, and why this is safe); a
commit waits for another process's flush 1 s at most (that process may be stopped), then
flushes itself, and a read-only transaction never waits for another's.
What a transaction read is durable once its commit returns; one that is abandoned instead
may, for the length of an fsync, have read a commit that a power loss would still undo.

Storage: WAL journal, ``PRAGMA synchronous=NORMAL``; table
``kv(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID`` (BLOBs compare as bytes, as FDB keys do)
and ``meta(name, value)`` holding ``format``, ``format_version`` (major.minor; a newer major
is refused), ``store_id`` and ``version`` (a reservation, see
``SqliteTransaction._next_version``).

Versions: a version clock advances at 1e6 per second, like FoundationDB's, on
``CLOCK_MONOTONIC`` (shared by every process of one boot, never moved by a wall-clock
correction): a read version is ``max(last commit, clock - 1)``, so it advances even when
nothing commits; a commit with writes gets ``max(last + 1, clock, read version + 1)``:
strictly increasing in commit order across processes and above every read version handed
out before it. Each process reads the clock on its own base, checked at its first use
against the page's stamp (the clock's last reading and the wall clock then), so a process
whose ``CLOCK_MONOTONIC`` is offset (a time namespace, libfaketime) moves database time by at
most 1 s plus 0.1 % of the time since the last transaction, however far off it is. Its
versionstamped keys and values are filled in just before COMMIT.
Read-only commits return -1. (Without a boot id - not Linux - the wall clock drives it.)

Shared state (:mod:`.shared`): the lock, the lock file's first page mapped by every
process (version clock, watchers' token) and the watch hub (:mod:`.notify`: Unix
datagram sockets, no polling for wake-ups; an idle receiver checks its files once a
second). A Database used in a forked child reopens its connection and lock file there
(an inherited lock descriptor is shared with the parent and would not exclude it).

The transaction, and the SQL it runs, are in :mod:`.transaction`; the store file (opening,
format, read-only mode, connections) here.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import threading
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from fdbqueue.engines.local.transaction import LocalDatabase
from fdbqueue.engines.local.watches import EventWatch, park_at_exit
from fdbqueue.engines.sqlite import diskroom as _diskroom
from fdbqueue.engines.sqlite import files as _storefiles
from fdbqueue.engines.sqlite import shared as _shared
from fdbqueue.engines.sqlite import walcheck as _walcheck
from fdbqueue.engines.sqlite.transaction import _CLOCK, _PENDING, SqliteTransaction, _translate
from fdbqueue.engines.sqlite.walsync import WalSync
from fdbqueue.engines.url import ParsedURL, take_params
from fdbqueue.engines.versions import VERSIONS_PER_SECOND, monotonic_us
from fdbqueue.errors import (
    InvalidURLError,
    QueueError,
    StoreError,
    UnsupportedFormatError,
)

FORMAT = "fdbqueue-sqlite"
FORMAT_VERSION = "1.0"
_MAJOR = 1


def _boot_id() -> bytes | None:
    """This boot's id: page-cache contents from before a crash of the machine are not trusted."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return None  # not Linux: the version is then kept in meta at every commit


_BOOT_ID = _boot_id()

_SCHEMA = (
    "CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value)",
)


def open_sqlite(url: str, parsed: ParsedURL) -> SqliteDatabase:
    """Open the store ``parsed.path`` names, creating the file (not its directory) if missing.

    A leading ``~`` is the user's home directory.
    """
    defaults = {"sync": "full", "lock_timeout": "10", "mode": "rw", "reserve": _diskroom.DEFAULT_TEXT}
    params = take_params(parsed, defaults)
    if not parsed.path:
        raise InvalidURLError(f"{url!r} names no file: use sqlite:///abs/path.db or sqlite://rel/path.db")
    # sqlite://~/q.db is the home directory's q.db, as a shell would read it.
    path = os.path.expanduser(parsed.path) if parsed.path.startswith("~") else parsed.path
    sync = params["sync"].lower()
    if sync not in ("full", "normal"):
        raise InvalidURLError(f"sync={params['sync']!r} in {url!r}: use sync=full or sync=normal")
    try:
        lock_timeout = float(params["lock_timeout"])
    except ValueError:
        lock_timeout = -1.0
    if not lock_timeout > 0:
        raise InvalidURLError(f"lock_timeout={params['lock_timeout']!r} in {url!r}: use seconds > 0")
    mode = params["mode"].lower()
    if mode not in ("rw", "ro"):
        raise InvalidURLError(f"mode={params['mode']!r} in {url!r}: use mode=rw or mode=ro (read-only)")
    reserve = _diskroom.parse_reserve(params["reserve"], url)
    return SqliteDatabase(
        url=url, path=path, sync=sync, lock_timeout=lock_timeout, read_only=mode == "ro", reserve=reserve
    )


class SqliteDatabase(LocalDatabase):
    """A SQLite store file. Thread-safe: the store lock serialises transactions."""

    engine = "sqlite"
    # One writer at a time: nothing conflicts (a 1020 needs a writer outside fdbqueue's
    # store lock), and SQLite's commit is atomic - it happened or was rolled back, never unknown.
    may_conflict = False
    may_commit_unknown = False

    def __init__(
        self,
        *,
        url: str,
        path: str,
        sync: str,
        lock_timeout: float,
        read_only: bool = False,
        reserve: int = _diskroom.DEFAULT_RESERVE,
    ) -> None:
        self.url = url
        self.path = path
        self.sync = sync
        self._real = os.path.realpath(path)
        self._folder = os.path.dirname(self._real)
        #: True when this handle only reads: opened with ``mode=ro``, or its file or folder
        #: cannot be written (a read-only mount, no permission); ``_read_only`` says why.
        self.read_only = read_only
        self._read_only = "opened with mode=ro" if read_only else ""
        self._ro_base: int | None = None  # read-only handles: the version clock's base
        self._immutable = False  # read-only handles: reading the database file alone
        self._ro_last = 0
        # sync=full: SQLite runs at synchronous=NORMAL and each commit fsyncs the WAL itself,
        # after releasing the store lock (see _walsync).
        self._wal = WalSync(self._real, path) if sync == "full" else None
        self._lock_timeout = lock_timeout
        self._room = _diskroom.DiskRoom(self._folder, path, reserve)
        self._closed = False
        self._broken: str | None = None  # why this handle refuses work: its files changed
        self._clock_tag: bytes | None = None  # set once the store's id is known
        # Connections for transactions begun while their thread holds another (rare).
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        if not os.path.isdir(self._folder):
            # Never made implicitly: a typo would otherwise become a new, empty store.
            raise StoreError(
                f"{path}: the directory {self._folder} does not exist; create it first "
                f"(mkdir -p {self._folder})"
            )
        if not _shared.open_here(self._real):  # checked by the first open (and see open_here)
            _storefiles.refuse_foreign(self._real, path)
        why = "" if read_only else _storefiles.why_read_only(self._real, path)
        if why:
            self.read_only, self._read_only = True, why
        if self.read_only:
            self._wal = None
            self._open()
            return
        beside = [self._real + suffix for suffix in ("-lock", "-wal", "-shm")]
        existed = [os.path.lexists(p) for p in beside]
        try:
            self._open()
        except _storefiles.NotAStore:
            # Leave nothing behind that this open created: the file is nobody's store.
            for p, was in zip(beside, existed, strict=True):
                if not was:
                    with contextlib.suppress(OSError):
                        os.unlink(p)
            raise

    def check_room(self) -> None:
        """Raise StoreFullError while the disk is below the reserve (the engine contract's hook)."""
        if not self.read_only:
            self._room.check()

    def _read_only_target(self) -> str:
        """SQLite's URI for a read-only connection (``_immutable``: the file alone, no WAL)."""
        return f"file:{quote(self._real)}?mode=ro" + ("&immutable=1" if self._immutable else "")

    def _open_read_only(self) -> None:
        """Connect read-only: SQLite's ``mode=ro`` while a process has the store open, else
        the database file alone.

        A reader of a WAL database needs the WAL index ``-shm``: SQLite makes it (and a
        ``-wal``) when missing, and leaves both behind a read-only connection, or fails where
        it may not write (https://www.sqlite.org/wal.html#readonly). Neither exists while no
        process has the store open (SQLite removes them at the last close), and the file
        then holds every commit: ``immutable=1`` reads it without locks, WAL or index, and
        creates nothing. Such a handle sees the file as it was: commits made later, by a
        process opening the store afterwards, need a new handle.
        """
        if not os.path.exists(self._real):
            raise StoreError(f"{self.path} does not exist (opened read-only, nothing is created)")
        self._immutable = not os.path.exists(self._real + "-shm") and _storefiles.no_wal_left(self._real)
        try:
            self._conn = self._connect_read_only()
        except sqlite3.Error as exc:
            low = str(exc).lower()
            if (
                self._immutable
                or not ("readonly" in low or "unable to open" in low)
                or not _storefiles.no_wal_left(self._real)
            ):
                raise _translate(exc, self.path, self._real) from exc
            self._immutable = True
            try:
                self._conn = self._connect_read_only()
            except sqlite3.Error as again:
                raise _translate(again, self.path, self._real) from again

    def _connect_read_only(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._read_only_target(),
            uri=True,
            timeout=self._lock_timeout,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            if not self._check_format(conn):
                raise _storefiles.NotAStore(f"{self.path} is not an fdbqueue store: it holds no tables")
        except BaseException:
            conn.close()
            raise
        return conn

    def _read_only_version(self, reserved: Callable[[], int]) -> int:
        """A read version for a read-only handle, which cannot take the store lock.

        The version clock of the lock file's page when a writer keeps it this boot, else
        meta's reservation (at or above every committed version) advanced by this
        process's monotonic clock; never below one handed out before.
        """
        now: int | None = None
        mono = monotonic_us()
        try:
            with open(self._real + "-lock", "rb") as f:
                page = f.read(_CLOCK.size)
        except OSError:
            page = b""
        if self._clock_tag is not None and len(page) == _CLOCK.size:
            found, last, _, state, base = _CLOCK.unpack(page)
            if found == self._clock_tag and state != _PENDING and base + mono + VERSIONS_PER_SECOND >= last:
                now = max(last, base + mono - 1)
        if now is None:
            if self._ro_base is None:
                self._ro_base = reserved() - mono
            now = self._ro_base + mono
        with self._readers_lock:
            self._ro_last = max(self._ro_last, now)
            return self._ro_last

    def _open(self) -> None:
        self._generation = _shared.fork_generation
        if self.read_only:
            self._open_read_only()
            return
        self._store = _shared.attach(self._real, self.path)
        _shared.close_at_exit(self)  # the last process to leave leaves only the store's files
        try:
            # Refuses a store whose WAL lost acknowledged commits (_walcheck).
            with _walcheck.opening(self._store, self._real, self.path, _BOOT_ID, self._lock_timeout) as held:
                self._conn = self._connect()
            self._walheld = held
            self._files = _storefiles.FileIdentities(self._real, self.path, self._store.ident)
        except BaseException:
            _shared.detach(self._store)
            raise

    def _save_lost_wal(self, changed: list[tuple[str, str]]) -> bool:
        """When only the WAL was removed or replaced: copy what it holds into the database file.

        Call with the store lock held (no writer appends meanwhile) and no transaction open
        on ``_conn``. This connection still has the old WAL open; a checkpoint copies every
        commit in it into the database file, and TRUNCATE resets the WAL index, so a process
        that opens the store afterwards reads the database file alone (and the new WAL).
        True when every frame was copied.
        """
        if {path for path, _ in changed} != {self._files.wal}:
            return False
        try:
            busy, log, done = self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        except sqlite3.Error:
            return False
        if busy == 0 and log == done:
            _walcheck.all_copied(self._store.shared)  # an empty WAL is no longer a loss
        return bool(busy == 0 and log == done)

    def _connect(self) -> sqlite3.Connection:
        try:
            # timeout is SQLite's busy handler: a backstop for foreign connections only,
            # since our own writers queue on the flock before BEGIN IMMEDIATE.
            conn = sqlite3.connect(
                self._real, timeout=self._lock_timeout, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise _translate(exc, self.path, self._real) from exc
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            mode = conn.execute("PRAGMA journal_mode").fetchone()[0]
            if not (self._check_format(conn) and mode == "wal"):
                self._initialise(conn)
            if self._wal:
                self._store.acquire(self._lock_timeout, self.path)
                try:
                    self._wal.preallocate(conn)
                finally:
                    self._store.release()
        except BaseException as exc:
            conn.close()
            if isinstance(exc, sqlite3.Error):
                raise _translate(exc, self.path, self._real) from exc
            raise
        return conn

    def _check_format(self, conn: sqlite3.Connection) -> bool:
        """True for a valid store, False for an empty file; raises for anything else."""
        tables = {row[0] for row in conn.execute(_storefiles.TABLES)}
        if not tables:
            return False
        meta: dict[str, Any] = {}
        if {"kv", "meta"} <= tables:
            try:
                meta = dict(conn.execute("SELECT name, value FROM meta"))
            except sqlite3.OperationalError as exc:
                if "no such column" not in str(exc):
                    raise  # e.g. a disk I/O error: the store may be ours, say what happened
                meta = {}  # a foreign table named meta
        if meta.get("format") != FORMAT:
            raise _storefiles.foreign(self.path, tables)
        found = str(meta.get("format_version", ""))
        major = found.partition(".")[0]
        store_id = meta.get("store_id")
        if not major.isdigit() or "version" not in meta or not isinstance(store_id, bytes):
            raise StoreError(f"{self.path}: damaged fdbqueue store meta table (format_version {found!r})")
        if int(major) > _MAJOR:
            raise UnsupportedFormatError(
                f"{self.path} has store format {found}, newer than this fdbqueue reads "
                f"({_MAJOR}.x): upgrade fdbqueue to open it"
            )
        self._clock_tag = None if _BOOT_ID is None else _BOOT_ID + store_id[:16].ljust(16, b"\0")
        return True

    def _initialise(self, conn: sqlite3.Connection) -> None:
        self._store.acquire(self._lock_timeout, self.path)
        try:
            if conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] != "wal":
                raise StoreError(f"{self.path}: SQLite refused WAL mode (is the file system local?)")
            conn.execute("BEGIN IMMEDIATE")
            if not self._check_format(conn):  # another process may have just done it
                for statement in _SCHEMA:
                    conn.execute(statement)
                conn.executemany(
                    "INSERT INTO meta (name, value) VALUES (?, ?)",
                    [
                        ("format", FORMAT),
                        ("format_version", FORMAT_VERSION),
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
                self._store.release()

    def _save_at_close(self) -> None:
        """A WAL removed under this handle: save what it holds, even if SQLite's close will not.

        SQLite checkpoints at the last connection's close only; another process with the
        store open would leave the commits in the removed WAL to vanish with this process.
        """
        changed = self._files.changed()
        if not changed:
            return
        try:
            self._store.acquire(self._lock_timeout, self.path)
        except QueueError:
            return  # a transaction of this thread, or a stuck one, holds it: SQLite's close may still
        try:
            self._save_lost_wal(changed)
        finally:
            self._store.release()

    def _reopen_after_fork(self) -> None:
        _shared.inherited.extend((self._conn, self._readers))
        self._readers = []
        if self._wal:
            self._wal.after_fork()
        self._open()

    def _take_reader(self) -> sqlite3.Connection:
        with self._readers_lock:
            if self._readers:
                return self._readers.pop()
        ro = self.read_only
        try:
            return sqlite3.connect(
                self._read_only_target() if ro else self._real,
                uri=ro,
                timeout=self._lock_timeout,
                isolation_level=None,
                check_same_thread=False,
            )
        except sqlite3.Error as exc:
            raise _translate(exc, self.path, self._real) from exc

    def _give_back_reader(self, conn: sqlite3.Connection) -> None:
        with self._readers_lock:
            self._readers.append(conn)

    def create_transaction(self) -> SqliteTransaction:
        if self._closed:
            park_at_exit()  # closed at interpreter exit under a daemon thread: it stays here
            raise StoreError(f"{self.path}: the database is closed")
        if self._broken is not None:
            raise StoreError(self._broken)
        return SqliteTransaction(self)

    def _arm_watches(self, watches: list[EventWatch]) -> None:
        if self.read_only:
            for w in watches:
                w.fail(4100, f"cannot watch {self.path}: it is open read-only ({self._read_only})")
            return
        if self._generation != _shared.fork_generation:
            self._reopen_after_fork()
        try:
            self._store.hub.add(watches)
        except OSError as exc:
            # The transaction has committed: report the failure on the watches, not here.
            for w in watches:
                w.fail(4100, f"cannot watch {self.path}: {exc}")

    def close(self) -> None:
        """Close the connection; the last Database of this process on the file stops its watches."""
        if self._closed:
            return
        self._closed = True
        if self._generation != _shared.fork_generation:
            return  # inherited from the parent process: its resources are not ours to release
        if not self.read_only:
            self._save_at_close()
        self._conn.close()
        if self._wal:
            self._wal.close()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
        if not self.read_only:
            _shared.detach(self._store)
            _walcheck.release(self._walheld)  # after every connection of this handle
