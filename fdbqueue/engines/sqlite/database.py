"""The embedded engine: one SQLite file, safe for many threads and processes.

URL: ``sqlite:///abs/path.db``, ``sqlite://rel/path.db`` or ``sqlite://~/path.db`` (the home
directory), with ``sync=full`` (default: every commit is fsynced before it returns, so it
survives power loss) or ``sync=normal`` (survives a process crash; the last commits may be
lost on power loss), ``lock_timeout=10`` (seconds a transaction may wait for the store lock),
``mode=rw`` (default) or ``mode=ro`` (read-only), and ``reserve=16M`` (bytes, units K, M, G,
T; ``0``: off): while the disk holding the store has less free space, enqueues are refused
with StoreFullError so that consumers can still drain it (:mod:`.diskroom`). The file is
created if missing, its directory never: a missing one is a StoreError naming it.

Files: ``X.db`` (the data) and ``X.db-lock`` (the store lock and the shared version page,
4 KB, kept after close: see docs/architecture.md); while a process has the store open,
SQLite's ``X.db-wal`` and ``X.db-shm``, which SQLite removes at the last close, and while one
watches, ``X.db-notify/``, which the last watcher removes. A file that is not a store is
refused before anything is created beside it. Every commit checks that none of the four
files was removed or replaced since the open (:mod:`.files`) and refuses if one was.

Read-only (``mode=ro``, or found so: a read-only mount, no write permission): no lock, no
file created; each transaction reads the last committed state, any write raises StoreError
(:class:`.readonly.ReadOnlyStore`, with the read-only clock here).

Concurrency: pessimistic and serializable, one writer at a time. A transaction takes the
store lock at its first operation and holds it until it commits or rolls back. The lock is
a per-process ``threading.Lock`` (threads), then, between processes, a lease
(:mod:`.storelock`: an open-file-description lock of one byte of ``<db>-lock`` per lock
generation; the kernel wakes the next waiter on release, where SQLite's busy handler would
sleep and poll), then a deferred ``BEGIN`` on the Database's one connection, which only the
lock holder uses (:meth:`.store.WritableStore.begin`). Reads go to SQLite's read snapshot,
which begins at the first read (under the lock); writes are buffered in memory
(:mod:`fdbqueue.engines.local.writemap`) and read through (read-your-writes, snapshot reads
too), atomic ops are resolved against that view when
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
overlap share one flush of the disk (:mod:`.walsync` says how, and why this is safe); a
commit waits for another process's flush 1 s at most (that process may be stopped), then
flushes itself, and a read-only transaction never waits for another's.
What a transaction read is durable once its commit returns; one that is abandoned instead
may, for the length of an fsync, have read a commit that a power loss would still undo.

Storage: WAL journal, ``PRAGMA synchronous=NORMAL``; table
``kv(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID`` (BLOBs compare as bytes, as FDB keys do)
and ``meta(name, value)`` holding ``format``, ``format_version`` (major.minor; a newer major
is refused), ``store_id`` and ``version`` (a reservation, see
``versionclock.VersionClock``).

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
process (:mod:`.page` declares its regions) and the watch hub (:mod:`.notify`: Unix
datagram sockets, no polling for wake-ups; an idle receiver checks its files once a
second). A Database used in a forked child reopens its connection and lock file there
(an inherited lock descriptor is shared with the parent and would not exclude it).

The modules: this one opens a store (the URL, the Database and the read-only clock); the
store a transaction talks to is :mod:`.store` (writable) or :mod:`.readonly`; the
transaction, its version clock and the SQL it runs are :mod:`.transaction`; the guards of a
commit are :mod:`.files` (the files are the ones opened), :mod:`.storelock` (the lease) and,
at open, :mod:`.walcheck` (no acknowledged commit lost from the WAL), with :mod:`.diskroom`
(the room producers may not take).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from fdbqueue.engines.local.transaction import LocalDatabase
from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.engines.sqlite import diskroom as _diskroom
from fdbqueue.engines.sqlite import files as _files
from fdbqueue.engines.sqlite import shared as _shared
from fdbqueue.engines.sqlite.page import CLOCK, PENDING, read_page
from fdbqueue.engines.sqlite.readonly import ReadOnlyStore
from fdbqueue.engines.sqlite.store import Store, WritableStore
from fdbqueue.engines.sqlite.transaction import SqliteTransaction
from fdbqueue.engines.sqlite.versionclock import VersionClock
from fdbqueue.engines.url import ParsedURL, take_params
from fdbqueue.engines.versions import VERSIONS_PER_SECOND, monotonic_us
from fdbqueue.errors import (
    InvalidURLError,
    StoreError,
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
        folder = os.path.dirname(self._real)
        if not os.path.isdir(folder):
            # Never made implicitly: a typo would otherwise become a new, empty store.
            raise StoreError(
                f"{path}: the directory {folder} does not exist; create it first (mkdir -p {folder})"
            )
        if not _shared.open_here(self._real):  # checked by the first open (and see open_here)
            _files.refuse_foreign(self._real, path)
        why = "opened with mode=ro" if read_only else _files.why_read_only(self._real, path)
        self._store: Store
        if why:
            store = ReadOnlyStore(self._real, path, lock_timeout, why)
            store.clock = ReadOnlyClock(store)
            self._store = store
            self._room_check: Callable[[], None] = _no_check  # a read-only store refuses the write itself
        else:
            writable = WritableStore(self._real, path, lock_timeout, sync)
            writable.clock = VersionClock(writable)
            self._store = writable
            # The free-space reserve: producers turned away while the disk is nearly full.
            self._room_check = _diskroom.DiskRoom(folder, path, reserve).check
        #: True when this handle only reads: opened with ``mode=ro``, or its file or folder
        #: cannot be written (a read-only mount, no permission).
        self.read_only = self._store.read_only

    def check_room(self) -> None:
        """Raise StoreFullError while the disk is below the reserve (the engine contract's hook)."""
        self._room_check()

    def create_transaction(self) -> SqliteTransaction:
        store = self._store
        if store.closed or store.broken is not None:
            store.usable()  # raises (closed at interpreter exit under a daemon thread: parks there)
        return SqliteTransaction(self, store)

    def _arm_watches(self, watches: list[EventWatch]) -> None:
        self._store.arm_watches(watches)

    def close(self) -> None:
        """Close the connection; the last Database of this process on the file stops its watches."""
        self._store.close()


def _no_check() -> None:
    pass


class ReadOnlyClock:
    """The version clock of a read-only handle, which cannot take the store lock.

    The version clock of the lock file's page when a writer keeps it this boot, else meta's
    reservation (at or above every committed version) advanced by this process's monotonic
    clock; never below one handed out before.
    """

    def __init__(self, store: ReadOnlyStore) -> None:
        self._store = store
        self._base: int | None = None  # the clock's base, from meta's reservation
        self._last = 0
        self._lock = threading.Lock()

    def read_version(self, reserved: Callable[[], int], nested: bool) -> tuple[int, None]:
        store = self._store
        now: int | None = None
        mono = monotonic_us()
        page = read_page(store.real + "-lock", CLOCK.size)
        if store.clock_tag is not None and page is not None:
            found, last, _, pending, base = page.clock()
            if found == store.clock_tag and pending != PENDING and base + mono + VERSIONS_PER_SECOND >= last:
                now = max(last, base + mono - 1)
        if now is None:
            if self._base is None:
                self._base = reserved() - mono
            now = self._base + mono
        with self._lock:
            self._last = max(self._last, now)
            return self._last, None

    def next_version(
        self,
        conn: object,
        reserved: Callable[[], int],
        read: int | None,
        held: object,
        begin: Callable[[], object] | None = None,
        state: object = None,
    ) -> tuple[int, bool]:
        raise self._store.no_writes()
