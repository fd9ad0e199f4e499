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
overlap share one flush of the disk (:mod:`._walsync` says how, and why this is safe).
What a transaction read is durable once its commit returns; one that is abandoned instead
may, for the length of an fsync, have read a commit that a power loss would still undo.

Storage: WAL journal, ``PRAGMA synchronous=NORMAL``; table
``kv(k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID`` (BLOBs compare as bytes, as FDB keys do)
and ``meta(name, value)`` holding ``format``, ``format_version`` (major.minor; a newer major
is refused), ``store_id`` and ``version`` (a reservation, see ``_next_version``).

Versions: a version clock advances at 1e6 per second, like FoundationDB's, on
``CLOCK_MONOTONIC`` (shared by every process of one boot, never moved by a wall-clock
correction): a read version is ``max(last commit, clock - 1)``, so it advances even when
nothing commits; a commit with writes gets ``max(last + 1, clock, read version + 1)``:
strictly increasing in commit order across processes and above every read version handed
out before it. Its versionstamped keys and values are filled in just before COMMIT.
Read-only commits return -1. (Without a boot id - not Linux - the wall clock drives it.)

Shared state (:mod:`._shared`): the lock, the lock file's first page mapped by every
process (version clock, watchers' token) and the watch hub (:mod:`._notify`: Unix
datagram sockets, no polling for wake-ups; an idle receiver checks its files once a
second). A Database used in a forked child reopens its connection and lock file there
(an inherited flock descriptor is shared with the parent and would not exclude it).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import sqlite3
import struct
import threading
import time
import uuid
from collections.abc import Callable
from itertools import repeat
from typing import Any
from urllib.parse import quote

from fdbqueue.clock import VERSIONS_PER_SECOND, monotonic_us
from fdbqueue.engines import _diskroom, _shared, _storefiles, _walcheck
from fdbqueue.engines._url import ParsedURL, take_params
from fdbqueue.engines._walsync import WalSync
from fdbqueue.engines._writemap import WriteMap
from fdbqueue.engines.base import (
    SYSTEM_KEYS,
    KeySelector,
    KeyValue,
    apply_atomic,
    fill_versionstamp,
    make_versionstamp,
)
from fdbqueue.engines.local import EventWatch, LocalDatabase, LocalTransaction
from fdbqueue.errors import (
    EngineError,
    InvalidURLError,
    NestedTransactionError,
    QueueError,
    StoreError,
    UnsupportedFormatError,
)

# Python's sqlite3 binds int, float, str and bytearray directly but sends bytes through its
# adapter lookup, which raises and clears two AttributeErrors per parameter (3.11-3.13):
# about a twentieth of a queue operation's CPU. Naming bytes' own adapter - bytes(), which
# returns the same object - makes that lookup one dict hit. It changes nothing else for
# any user of sqlite3 in the process: a bytes value binds as the same BLOB either way.
sqlite3.register_adapter(bytes, bytes)

FORMAT = "fdbqueue-sqlite"
FORMAT_VERSION = "1.0"
_MAJOR = 1

_GET = "SELECT v FROM kv WHERE k = ?"
_GET_IN: dict[int, str] = {}  # SELECT ... WHERE k IN (?, ...), by the number of keys
_IN_BATCH = 500  # keys a statement asks for at most (SQLite's bound on variables is 999 on old builds)
_PUT = "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"
_PUT_N: dict[int, str] = {}  # INSERT ... VALUES (?, ?), ... by the number of rows
_DEL = "DELETE FROM kv WHERE k = ?"
_DEL_RANGE = "DELETE FROM kv WHERE k >= ? AND k < ?"
_RANGE = (
    "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT ?",
    "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k DESC LIMIT ?",
)
# Key selectors, indexed by or_equal: the n-th key after, or before, the anchor.
_AFTER = (
    "SELECT k FROM kv WHERE k >= ? ORDER BY k LIMIT 1 OFFSET ?",
    "SELECT k FROM kv WHERE k > ? ORDER BY k LIMIT 1 OFFSET ?",
)
_BEFORE = (
    "SELECT k FROM kv WHERE k < ? ORDER BY k DESC LIMIT 1 OFFSET ?",
    "SELECT k FROM kv WHERE k <= ? ORDER BY k DESC LIMIT 1 OFFSET ?",
)
_VERSION = "SELECT value FROM meta WHERE name = 'version'"
_SET_VERSION = "UPDATE meta SET value = ? WHERE name = 'version'"

# The lock file's first page is mapped shared by every process of the store. At 0, the
# version clock (see _next_version): boot id + store id, the last commit version, the
# reservation stored in meta, a pending flag, and the clock's base (version = base +
# CLOCK_MONOTONIC microseconds; last, as a page of an older fdbqueue leaves it zero).
# At 64, the watchers' token (_notify).
_CLOCK = struct.Struct(">32sQQBq")
_PENDING_AT = struct.calcsize(">32sQQ")
_PENDING = 1
_RESERVE_US = 1_000_000  # one meta write per second of versions


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


def _translate(exc: sqlite3.Error, path: str, real: str | None = None) -> QueueError:
    """A SQLite error as the QueueError a caller can act on (``real``: the store's real path)."""
    text = str(exc)
    low = text.lower()
    if real is not None and any(w in low for w in ("disk i/o", "not a database", "malformed")):
        lost = _storefiles.wal_lost(real)
        if lost is not None:
            return StoreError(f"{path}: {lost} ({text})")
    if "locked" in low or "busy" in low:
        return EngineError(1037, f"{path} stayed locked by another SQLite connection ({text})")
    if "full" in low:
        # SQLITE_FULL: SQLite rolled the statement or transaction back; what committed
        # before stays (https://www.sqlite.org/rescode.html#full). docs/architecture.md,
        # "Full disk", says what still works.
        folder = os.path.dirname(real or os.path.realpath(path))
        return StoreError(
            f"{path}: no space left on the device holding {folder} ({text}): the transaction was "
            "not committed, and nothing committed before is lost. Free some space there: until "
            "then writes may fail, a consumer's too (SQLite logs every change before it frees a page)"
        )
    if "disk i/o" in low:
        return StoreError(f"{path}: disk I/O error ({text})")
    if "not a database" in low or "malformed" in low or "corrupt" in low:
        return _storefiles.NotAStore(
            f"{path} is not an fdbqueue store: not a SQLite database, or corrupt ({text})"
        )
    return StoreError(f"{path}: SQLite error: {text}")


# ---------------------------------------------------------------------------------------------


class SqliteTransaction(LocalTransaction):
    """A transaction holding the store lock from its first operation to its end."""

    db: SqliteDatabase

    def __init__(self, db: SqliteDatabase) -> None:
        self._locked = False
        self._nested = False  # reading a snapshot while this thread holds another transaction
        self._conn: sqlite3.Connection = db._conn  # replaced at _begin (a fork may reopen it)
        super().__init__(db)

    def _clear_state(self) -> None:
        super()._clear_state()
        self._dirty = False  # a commit version is due (FDB: any mutation or write conflict)
        self._all = False  # a clear_range: watchers must re-read every key
        self._keys: list[bytes] = []
        self._wm = WriteMap()  # writes, applied at commit
        # Stored values this transaction has read: they stay the committed ones while it holds
        # the store lock (a nested reader: its snapshot), so a second read, and an atomic op
        # resolved here, ask SQLite nothing. The write map still decides first.
        self._seen: dict[bytes, bytes | None] = {}
        self._stamped: list[tuple[str, bytes, bytes]] = []
        self._rv: int | None = None
        self._bumped = False  # this commit raised the version reservation in meta

    def _begin(self) -> None:
        db = self.db
        if db._generation != _shared.fork_generation:
            db._reopen_after_fork()
        if db._closed:
            raise StoreError(f"{db.path}: the database is closed")
        if db._broken is not None:
            raise StoreError(db._broken)
        if db.read_only or db._store.owner == threading.get_ident():
            # This thread holds the lock in another transaction, which cannot end while
            # we wait (or the handle is read-only): read the last committed state from a
            # snapshot instead; writing raises an error (see _no_writes).
            conn = db._take_reader()
            try:
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                db._give_back_reader(conn)
                raise _translate(exc, db.path, db._real) from exc
            self._nested = True
        else:
            conn = db._conn
            db._store.acquire(db._lock_timeout, db.path, stealable=True)
            try:
                # Deferred: the read snapshot starts at the first read, SQLite's write lock
                # is taken only at commit (writes are buffered until then).
                conn.execute("BEGIN")
            except sqlite3.Error as exc:
                db._store.release()
                raise _translate(exc, db.path, db._real) from exc
        self._conn = conn
        self._locked = True

    def _no_writes(self) -> QueueError:
        db = self.db
        if db.read_only:
            return StoreError(
                f"{db.path} is open read-only ({db._read_only}): this handle can read but not write"
            )
        return NestedTransactionError(
            f"this thread holds another transaction on {self.db.path}: a transaction begun meanwhile "
            "may read (the last committed state) but not write, since the embedded engine has a "
            "single writer and waiting for it here would deadlock"
        )

    def _fail(self, exc: sqlite3.Error) -> QueueError:
        # SQLite may already have rolled the transaction back (disk full, I/O error):
        # end it here, and refuse any later operation, which would otherwise run in
        # autocommit mode outside the lock.
        self._rollback()
        self._state = "failed"
        self._live = False
        return _translate(exc, self.db.path, self.db._real)

    def _get(self, key: bytes, snapshot: bool) -> bytes | None:
        if self._wm:
            decided, value = self._wm.get(key)
            if decided:
                return value
        seen = self._seen
        if key in seen:
            return seen[key]
        try:
            row = self._conn.execute(_GET, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        value = None if row is None else row[0]
        seen[key] = value
        return value

    def _get_many(self, keys: list[bytes], snapshot: bool) -> dict[bytes, bytes | None]:
        """One ``SELECT ... IN`` for the keys the write map does not decide, not one a key:
        the statements of an operation's reads, not their rows, are what it pays for."""
        out: dict[bytes, bytes | None] = {}
        ask: list[bytes] = []
        wm, seen = self._wm, self._seen
        for key in dict.fromkeys(keys):
            if wm:
                decided, value = wm.get(key)
                if decided:
                    out[key] = value
                    continue
            if key in seen:
                out[key] = seen[key]
                continue
            out[key] = None
            ask.append(key)
        if not ask:
            return out
        try:
            for lo in range(0, len(ask), _IN_BATCH):
                part = ask[lo : lo + _IN_BATCH]
                sql = _GET_IN.get(len(part)) or _GET_IN.setdefault(
                    len(part), f"SELECT k, v FROM kv WHERE k IN ({','.join('?' * len(part))})"
                )
                for k, v in self._conn.execute(sql, part):
                    out[k] = v
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        for key in ask:
            seen[key] = out[key]
        return out

    def _resolve(self, selector: KeySelector, snapshot: bool) -> bytes:
        if self._wm:
            return self._wm.resolve(self._stored, selector)
        key, or_equal, offset = selector
        try:
            if offset >= 1:
                row = self._conn.execute(_AFTER[or_equal], (key, offset - 1)).fetchone()
                return row[0] if row else SYSTEM_KEYS
            row = self._conn.execute(_BEFORE[or_equal], (key, -offset)).fetchone()
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        return row[0] if row else b""

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        if self._wm:
            return self._wm.get_range(self._stored, begin, end, limit, reverse)
        return self._stored(begin, end, limit, reverse)

    def _stored(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        """The snapshot's pairs of [begin, end), without this transaction's writes."""
        try:
            rows = self._conn.execute(_RANGE[reverse], (begin, end, limit or -1)).fetchall()
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        # tuple.__new__ straight from C: KeyValue._make would run Python code for every row.
        return list(map(tuple.__new__, repeat(KeyValue, len(rows)), rows))

    def _put(self, key: bytes, value: bytes | None) -> None:
        """Buffer a write of ``key`` (None clears it): refused in a nested transaction."""
        if self._nested:
            raise self._no_writes()
        self._wm.set(key, value)
        self._keys.append(key)
        self._dirty = True

    def _set(self, key: bytes, value: bytes) -> None:
        self._put(key, value)

    def _clear(self, key: bytes) -> None:
        self._put(key, None)

    def _clear_range(self, begin: bytes, end: bytes) -> None:
        if self._nested:
            raise self._no_writes()
        self._wm.clear_range(begin, end)
        self._all = self._dirty = True

    def _atomic(self, op: str, key: bytes, param: bytes) -> None:
        # Resolved now against what this transaction sees: it holds the store lock, so no
        # other transaction of fdbqueue commits before it (see the module docstring).
        if self._nested:
            raise self._no_writes()
        existing = self._get(key, True)
        if op == "add" and existing is not None:
            self._put(key, _sql_add(existing, param))
        else:
            self._put(key, apply_atomic(op, existing, param))

    def _versionstamped(self, kind: str, key: bytes, value: bytes) -> None:
        # Applied at commit, once the version is known. Like FDB (which raises 1036),
        # this transaction cannot read what it wrote here: it simply does not see it.
        if self._nested:
            raise self._no_writes()
        self._stamped.append((kind, key, value))
        self._dirty = True

    def _conflict_range(self, kind: str, begin: bytes, end: bytes) -> None:
        # Nothing to record: under the lock nothing can conflict. A write conflict
        # range still earns a commit version, as on FoundationDB.
        if kind == "write":
            if self._nested:
                raise self._no_writes()
            self._dirty = True

    def _read_version(self) -> int:
        if self._rv is None:
            if self.db.read_only:
                self._rv = self.db._read_only_version(self._reserved)
                return self._rv
            last, _, _, now = self._clock()
            # One below the clock: every later commit (at least the clock) is above it.
            self._rv = max(last, now - 1)
        return self._rv

    def _clock(self) -> tuple[int, int, int, int]:
        """(last commit version, reservation, base, the version clock now).

        From the lock file when it names this boot and this store; its last version and
        reservation only when no commit died half-way (flag pending), else meta's
        reservation stands for both. The clock is ``base + CLOCK_MONOTONIC`` microseconds;
        without a trusted base (a new boot) it restarts from the last version, and a clock
        found behind the last version (a page of an older fdbqueue) catches up with it.
        The holder of the store lock records a new base in the page.
        """
        db = self.db
        tag = db._clock_tag
        if tag is None:  # not Linux: no boot id to trust a monotonic base by
            last = self._reserved()
            return last, last, 0, max(last, time.time_ns() // 1000)
        shared = db._store.shared
        found, last, reserved, state, base = _CLOCK.unpack_from(shared)
        mono = monotonic_us()
        trusted = found == tag
        if not trusted or state == _PENDING:
            last = reserved = self._reserved()
        if not trusted or base + mono + VERSIONS_PER_SECOND < last:
            base = last - mono
            if not self._nested:  # under the store lock
                _CLOCK.pack_into(shared, 0, tag, last, reserved, 0, base)
        return last, reserved, base, base + mono

    def _reserved(self) -> int:
        try:
            return int(self._conn.execute(_VERSION).fetchone()[0])
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc

    def _next_version(self) -> int:
        """max(last + 1, the version clock, read version + 1): strictly increasing across
        processes, and above every read version handed out before.

        Writing the version into meta at every commit would dirty a second page and
        halve the commit rate. So meta holds a reservation, and the last version lives
        in the lock file, shared through the page cache by every process (we hold its
        flock). Invariant: every committed version <= meta's reservation, which is
        raised in the same transaction when a version passes it. The lock file is
        trusted only when it names this boot and this store and no commit died
        half-way (flag pending); otherwise the clock restarts from the reservation.
        """
        last, reserved, base, now = self._clock()
        version = max(last + 1, now, -1 if self._rv is None else self._rv + 1)
        self._bumped = version > reserved
        tag = self.db._clock_tag
        if self._bumped:
            # Without a trusted lock file (no boot id), meta holds the last version itself.
            reserved = version + (_RESERVE_US if tag is not None else 0)
            self._conn.execute(_SET_VERSION, (reserved,))
        if tag is not None:
            # Pending only while a raised reservation is not committed yet; a version
            # that never commits is merely a gap.
            state = _PENDING if self._bumped else 0
            _CLOCK.pack_into(self.db._store.shared, 0, tag, version, reserved, state, base)
        return version

    def _commit(self) -> int:
        conn = self._conn
        db = self.db
        version = -1
        if not self._nested:
            changed = db._files.changed()
            if changed:
                raise self._refuse(changed)
            if self._dirty and not db._store.pin():
                # Past the 5-second window another process took the store lock over
                # (_storelock): as on FoundationDB, too old to commit; nothing is applied.
                self._rollback()
                raise EngineError(
                    1007,
                    f"transaction_too_old: this transaction held the store lock of {db.path} past the "
                    "5-second window and another transaction took it over; nothing was committed",
                )
        try:
            if self._dirty:
                self._apply_writes(conn)
                version = self._next_version()
                if self._stamped:
                    self._apply_stamped(conn, make_versionstamp(version))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc  # the clock stays pending: the next commit re-reads meta
        if self._bumped and db._clock_tag is not None:
            db._store.shared[_PENDING_AT] = 0
        if self._dirty:
            db._walheld.record(db._store.shared, db._clock_tag)  # what the WAL holds now (_walcheck)
        # Still under the store lock: what this commit wrote, or (read-only) may have read.
        wal = db._wal
        seen = wal.committed(db._store.shared, db._clock_tag, version) if wal else None
        self._end()
        if self._dirty:
            db._store.hub.publish(None if self._all else self._keys)
        if wal and not (self._dirty and self._only_volatile()):
            # A commit that writes only volatile queues' keys skips the fsync: it survives a
            # process crash (its WAL frames are in the page cache), not a power loss, until the
            # next durable commit or checkpoint flushes the WAL.
            wal.make_durable(db._store.shared, db._clock_tag, seen)
        return version

    def _only_volatile(self) -> bool:
        """Whether every key this transaction writes lies under a declared volatile prefix."""
        prefixes = self.options.volatile
        if not prefixes:
            return False
        wm = self._wm
        inside = [*wm.values, *(key for _, key, _ in self._stamped)] if wm or self._stamped else []
        if not all(k.startswith(prefixes) for k in inside):
            return False
        return all(any(p <= b and e <= _end_of(p) for p in prefixes) for b, e in wm.cleared_ranges)

    def _apply_writes(self, conn: sqlite3.Connection) -> None:
        """Apply the buffered writes: the first one turns the read snapshot into a write
        transaction, which SQLite refuses (SQLITE_BUSY_SNAPSHOT) when another connection
        committed since the snapshot began (https://www.sqlite.org/rescode.html#busy_snapshot):
        then nothing was applied, and the commit fails with 1020 not_committed."""
        wm = self._wm
        try:
            if wm:
                for begin, end in wm.cleared_ranges:
                    conn.execute(_DEL_RANGE, (begin, end))
                puts: list[bytes] = []
                dels: list[bytes] = []
                for k, v in wm.values.items():
                    if v is None:
                        dels.append(k)
                    else:
                        puts += (k, v)
                # One statement for all the rows (up to the variable bound), not one stepped
                # per row: fewer instructions per enqueue (scripts/count_instructions.py).
                for lo in range(0, len(puts), _IN_BATCH):
                    part = puts[lo : lo + _IN_BATCH]
                    n = len(part) // 2
                    sql = _PUT_N.get(n) or _PUT_N.setdefault(
                        n, "INSERT OR REPLACE INTO kv (k, v) VALUES " + ",".join(["(?,?)"] * n)
                    )
                    conn.execute(sql, part)
                if dels:
                    # One statement stepped per key: "k IN (...)" would build SQLite a
                    # temporary index of the list first (more instructions, measured).
                    conn.executemany(_DEL, [(k,) for k in dels])
            else:  # a write conflict range or versionstamps only: the version still needs the write lock
                conn.execute("UPDATE meta SET value = value WHERE name = 'version'")
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != 5:  # SQLITE_BUSY and its extended codes
                raise
            self._rollback()
            self._state = "failed"
            self._live = False
            raise EngineError(
                1020, f"{self.db.path}: another connection committed since this transaction read ({exc})"
            ) from exc

    def _refuse(self, changed: list[tuple[str, str]]) -> StoreError:
        """End this transaction uncommitted, because the store's files changed under it.

        SQLite cannot notice: a connection keeps writing to the descriptors it opened, so
        after ``rm X.db-wal`` its commits land in a file nobody else can see and that vanishes
        when the process ends (https://www.sqlite.org/howtocorrupt.html, sections 1.3-1.4,
        2.4). When only the WAL went, we still hold it open: a checkpoint copies the commits
        it holds into the database file, so none that was reported is lost, and resets the
        WAL index, so a process that opens the store meanwhile reads a consistent file.
        """
        db = self.db
        conn = self._conn
        with contextlib.suppress(sqlite3.Error):  # SQLite may have rolled back already
            conn.execute("ROLLBACK")
        saved = f"; the commits it held were copied into {db.path}" if db._save_lost_wal(changed) else ""
        self._end()
        self._state = "failed"
        self._live = False
        what = "; ".join(f"{path} was {how}" for path, how in changed)
        db._broken = (
            f"{what} while this process had the store {db.path} open{saved}. Commits are refused "
            "until it is reopened (close it and open it again); never remove or replace a store's "
            "files while a process has it open"
        )
        return StoreError(f"the transaction was not committed: {db._broken}")

    def _apply_stamped(self, conn: sqlite3.Connection, stamp: bytes) -> None:
        rows = []
        for kind, key, value in self._stamped:
            if kind == "key":
                key = fill_versionstamp(key, stamp)
            else:
                value = fill_versionstamp(value, stamp)
            rows.append((key, value))
            self._keys.append(key)
        conn.executemany(_PUT, rows)  # one statement for all (a journaled commit has three or more)

    def _rollback(self) -> None:
        if not self._locked:
            return
        try:
            self._conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # SQLite already rolled back (after a failed statement): nothing left to undo
        finally:
            self._end()

    def _end(self) -> None:
        self._locked = False
        if self._nested:
            self._nested = False
            self.db._give_back_reader(self._conn)
        else:
            self.db._store.release()


_I64 = struct.Struct("<q")


def _sql_add(existing: bytes, param: bytes) -> bytes | None:
    if len(existing) == len(param) == 8:  # a counter: wrapping 64-bit add, as FoundationDB's
        total = _I64.unpack(existing)[0] + _I64.unpack(param)[0]
        return _I64.pack((total + 2**63) % 2**64 - 2**63)
    return apply_atomic("add", existing, param)


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

    def producer_room(self) -> None:
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


def _end_of(prefix: bytes) -> bytes:
    """The end of the range of keys starting with ``prefix`` (FoundationDB's strinc)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes((stripped[-1] + 1,)) if stripped else b"\xff"
