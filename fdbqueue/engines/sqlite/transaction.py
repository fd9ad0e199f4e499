"""The embedded engine's transaction (``sqlite://``): the store lock from its first operation
to its end, reads through its buffered writes, and a commit that applies them in one SQLite
write transaction with the next version of the store's clock.

:mod:`fdbqueue.engines.sqlite.database` says how the engine works as a whole (locking, durability,
versions, nesting); this module is its transaction, and the SQL both share.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import sqlite3
import struct
import threading
import time
from itertools import repeat
from typing import TYPE_CHECKING

from fdbqueue.engines.contract import SYSTEM_KEYS, KeySelector, KeyValue
from fdbqueue.engines.local.mutations import apply_atomic, fill_versionstamp, make_versionstamp
from fdbqueue.engines.local.transaction import LocalTransaction
from fdbqueue.engines.local.watches import park_at_exit
from fdbqueue.engines.local.writemap import WriteMap
from fdbqueue.engines.sqlite import files as _storefiles
from fdbqueue.engines.sqlite import shared as _shared
from fdbqueue.engines.sqlite.storelock import sqlite_holder
from fdbqueue.engines.versions import VERSIONS_PER_SECOND, monotonic_us, wall_us
from fdbqueue.errors import (
    EngineError,
    NestedTransactionError,
    QueueError,
    StoreError,
    StoreLockedError,
)

if TYPE_CHECKING:
    from fdbqueue.engines.sqlite.database import SqliteDatabase

# Python's sqlite3 binds int, float, str and bytearray directly but sends bytes through its
# adapter lookup, which raises and clears two AttributeErrors per parameter (3.11-3.13):
# about a twentieth of a queue operation's CPU. Naming bytes' own adapter - bytes(), which
# returns the same object - makes that lookup one dict hit. It changes nothing else for
# any user of sqlite3 in the process: a bytes value binds as the same BLOB either way.
sqlite3.register_adapter(bytes, bytes)

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
# At 64, the watchers' token (notify.py).
_CLOCK = struct.Struct(">32sQQBq")
_PENDING_AT = struct.calcsize(">32sQQ")
_PENDING = 1
_RESERVE_US = 1_000_000  # one meta write per second of versions
# At _shared.STAMP_AT: the version clock's last reading handed out under the store lock, and
# the wall clock (µs) of the process that read it: what a process opening the store checks
# its own monotonic clock against (_calibrated).
_STAMP = struct.Struct("=qq")
# How far a process's clock may run ahead of the stamp's reading plus the wall-clock time
# since, before its monotonic clock is taken for offset: 1 s, plus 0.1 % of that time (NTP
# slews a wall clock by 0.05 % at most: ntpd's 500 ppm).
_AGREE_US = 1_000_000


def _calibrated(shared: mmap.mmap, base: int, mono: int) -> int:
    """This process's base of the version clock, at its first use of the store.

    The page's base, unless the clock it gives (``base + mono``) runs ahead of the stamp's
    reading plus the wall-clock time since by more than :data:`_AGREE_US` (+0.1 %): then this
    process's monotonic clock is ahead of the others' (they stamped the page on theirs),
    and its clock starts from that estimate instead. The lower of the two is taken because
    a deadline read late is a delay, read early a duplicate; a wall clock stepped back
    between the stamp and now makes the estimate low, and a process starting then reads
    the store's time late by at most that step until another process's commit carries
    it forward (the catch-up in ``_clock``).
    """
    reading, wall = _STAMP.unpack_from(shared, _shared.STAMP_AT)
    if reading <= 0 or wall <= 0:
        return base  # no stamp: a page of an older fdbqueue
    since = max(0, wall_us() - int(wall))
    estimate = int(reading) + since
    if base + mono > estimate + _AGREE_US + since // 1000:
        return estimate - mono
    return base


def _translate(exc: sqlite3.Error, path: str, real: str | None = None) -> QueueError:
    """A SQLite error as the QueueError a caller can act on (``real``: the store's real path)."""
    text = str(exc)
    low = text.lower()
    if "closed database" in low:
        park_at_exit()  # its connection closed at interpreter exit under a daemon thread
    if real is not None and any(w in low for w in ("disk i/o", "not a database", "malformed")):
        lost = _storefiles.wal_lost(real)
        if lost is not None:
            return StoreError(f"{path}: {lost} ({text})")
    if "locked" in low or "busy" in low:
        # SQLite's busy timeout (lock_timeout) ran out: a lock of SQLite's own, not the store
        # lock, so the page cannot say who holds it, but the kernel can (_storelock).
        who = sqlite_holder(real or os.path.realpath(path))
        return StoreLockedError(
            f"{path} stayed locked by another SQLite connection ({text}): {who}. Resume it "
            "(kill -CONT) or end it, or raise lock_timeout"
        )
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
            park_at_exit()  # closed at interpreter exit under a daemon thread: it stays here
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
            if not self._nested and self.db._clock_tag is not None:
                _STAMP.pack_into(self.db._store.shared, _shared.STAMP_AT, self._rv, wall_us())
        return self._rv

    def _clock(self) -> tuple[int, int, int, int]:
        """(last commit version, reservation, the page's base, the version clock now).

        From the lock file when it names this boot and this store; its last version and
        reservation only when no commit died half-way (flag pending), else meta's
        reservation stands for both. Without a trusted page (a new boot) the clock restarts
        from the last version, on this process's ``CLOCK_MONOTONIC``, and the page records
        that base for the others.

        Each process reads the clock as ``its base + its CLOCK_MONOTONIC``. Its base is the
        page's, checked at its first use against the page's stamp (the clock's last reading
        and the wall clock then, :func:`_calibrated`), so a process whose monotonic clock is
        offset (a time namespace, libfaketime) reads the store's time, not its own: database
        time never follows one process's clock. A process found behind the last commit
        catches up with it (its own base only).
        """
        db = self.db
        tag = db._clock_tag
        if tag is None:  # not Linux: no boot id to trust a monotonic base by
            last = self._reserved()
            return last, last, 0, max(last, time.time_ns() // 1000)
        store = db._store
        shared = store.shared
        found, last, reserved, state, base = _CLOCK.unpack_from(shared)
        mono = monotonic_us()
        trusted = found == tag
        if not trusted or state == _PENDING:
            last = reserved = self._reserved()
        own = store.clock_base
        if not trusted:
            own = base = last - mono
            if not self._nested:  # under the store lock
                _CLOCK.pack_into(shared, 0, tag, last, reserved, 0, base)
                _STAMP.pack_into(shared, _shared.STAMP_AT, last, wall_us())
        elif own is None:
            own = _calibrated(shared, base, mono)
        if own + mono + VERSIONS_PER_SECOND < last:
            own = last - mono
        store.clock_base = own
        return last, reserved, base, own + mono

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
        in the lock file, shared through the page cache by every process (we hold the
        store lock). Invariant: every committed version <= meta's reservation, which is
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
            _STAMP.pack_into(self.db._store.shared, _shared.STAMP_AT, version, wall_us())
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
            # A read-only transaction syncs what it may have read without queueing behind
            # another process's fsync (which a stopped process may hold): see _walsync.
            wal.make_durable(db._store.shared, db._clock_tag, seen, wait=self._dirty)
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


def _end_of(prefix: bytes) -> bytes:
    """The end of the range of keys starting with ``prefix`` (FoundationDB's strinc)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes((stripped[-1] + 1,)) if stripped else b"\xff"
