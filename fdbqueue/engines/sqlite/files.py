"""The files of an embedded store: whether a file is a store (its format), whether it can be
written, whether the files of an open store are still the ones it opened (the commit's first
guard), and what a SQLite error means for them.

A store ``X.db`` is ``X.db`` and ``X.db-lock``, plus SQLite's ``X.db-wal`` and ``X.db-shm``
while a process has it open, and the store lock's wake-up FIFO ``X.db-wake`` once a process
waited for it (docs/architecture.md). A connection keeps using the files it
opened, whatever their paths name later; so the engine records each file's identity at open
and checks it at every commit (:class:`FileIdentities`), and explains what SQLite reports
when a WAL was removed under another process (:func:`wal_lost`, :func:`translate`).
"""

from __future__ import annotations

import os
import sqlite3
import struct
import time
from typing import Any
from urllib.parse import quote

from fdbqueue.engines.local.watches import park_at_exit
from fdbqueue.engines.sqlite.lockwait import sqlite_holder
from fdbqueue.engines.sqlite.page import CLOCK, read_page
from fdbqueue.errors import QueueError, StoreError, StoreLockedError, UnsupportedFormatError

FORMAT = "fdbqueue-sqlite"
FORMAT_VERSION = "1.0"
MAJOR = 1
SCHEMA = (
    "CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID",
    "CREATE TABLE meta (name TEXT PRIMARY KEY, value)",
)
SQLITE_MAGIC = b"SQLite format 3\0"  # the first 16 bytes of every SQLite database file
TABLES = "SELECT name FROM sqlite_master WHERE type = 'table'"
# A folder unchanged for this long has time stamps that any later change moves (the file
# system's clock ticks every few milliseconds): see FileIdentities.changed.
QUIET_NS = 200_000_000
_stat = os.stat
# The WAL index header at the start of -shm (https://www.sqlite.org/walformat.html, 2.1),
# in the machine's byte order: version, unused, change counter, isInit, big-endian
# checksums, page size, frames; two copies, equal unless a writer is changing them.
_WAL_INDEX = struct.Struct("=IIIBBHI")
_WAL_INDEX_COPY = 48
_WAL_VERSION = 3007000


class NotAStore(StoreError):
    """A file that is not an fdbqueue store (raised as the StoreError it is)."""


def foreign(path: str, tables: set[str]) -> NotAStore:
    return NotAStore(
        f"{path} is a SQLite database but not an fdbqueue store "
        f"(tables: {', '.join(sorted(tables))}); refusing to use it"
    )


def refuse_foreign(real: str, path: str) -> None:
    """Refuse a file that is plainly not a store, before anything is created beside it."""
    if os.path.isdir(real):
        raise NotAStore(f"{path} is a directory, not an fdbqueue store")
    try:
        with open(real, "rb") as f:
            head = f.read(len(SQLITE_MAGIC))
    except FileNotFoundError:
        return  # a new store
    except OSError as exc:
        raise StoreError(f"{path}: cannot read it: {exc.strerror}") from exc
    if not head:
        if _lock_names_a_store(real + "-lock"):
            raise StoreError(
                f"{path} is empty, but {path}-lock shows that an fdbqueue store lived here: the "
                "store file was truncated or replaced. Refusing to start a new, empty store in its "
                f"place; restore the file, or remove {path} and {path}-lock to start afresh"
            )
        return  # an empty file with no store history becomes a store
    if head != SQLITE_MAGIC:
        raise NotAStore(f"{path} is not an fdbqueue store: not a SQLite database; refusing to use it")
    # What the database file itself lists (immutable: no lock, no WAL, nothing created).
    # A store's schema is there from its creation on; a listing that fails, or is
    # empty, is left to the open, which reads the WAL too.
    try:
        conn = sqlite3.connect(f"file:{quote(real)}?immutable=1", uri=True)
        try:
            tables = {row[0] for row in conn.execute(TABLES)}
        finally:
            conn.close()
    except sqlite3.Error:
        return
    if tables and not {"kv", "meta"} <= tables:
        raise foreign(path, tables)


def _lock_names_a_store(lock: str) -> bool:
    """Whether the lock file's page names a store: the version clock is tagged with the boot
    id and the store id once the store has committed (:data:`.page.CLOCK`)."""
    page = read_page(lock, CLOCK.at("last"))
    return page is not None and page.buffer[16 : CLOCK.at("last")] != bytes(16)


def why_read_only(real: str, path: str) -> str:
    """Why an existing store cannot be written here ("" when it can)."""
    if not os.path.exists(real):
        return ""  # a new store: creating it says what is wrong, if anything
    folder = os.path.dirname(real)
    try:
        if os.statvfs(folder).f_flag & os.ST_RDONLY:
            return "the file system is read-only"
    except OSError:
        pass
    if not (os.access(real, os.W_OK) and os.access(folder, os.W_OK)):
        return f"no permission to write {path} or its directory"
    return ""


def no_wal_left(real: str) -> bool:
    """No WAL with content beside the file: the database file holds every commit."""
    wal = real + "-wal"
    return not (os.path.exists(wal) and os.path.getsize(wal) > 0)


def wal_lost(real: str) -> str | None:
    """Why the store's WAL cannot hold what its index says it holds, if it cannot.

    A process that has the store open keeps its WAL index in ``-shm``; when the ``-wal``
    beside it is gone or shorter than the frames it lists, the WAL was removed (or
    truncated) under that process: SQLite then reports "disk I/O error" or reads garbage.
    """
    wal, shm = real + "-wal", real + "-shm"
    try:
        with open(shm, "rb") as f:
            head = f.read(2 * _WAL_INDEX_COPY)
        size = os.path.getsize(wal) if os.path.exists(wal) else 0
    except OSError:
        return None
    if len(head) < 2 * _WAL_INDEX_COPY or head[:_WAL_INDEX_COPY] != head[_WAL_INDEX_COPY:]:
        return None
    version, _, _, init, _, page, frames = _WAL_INDEX.unpack_from(head)
    if version != _WAL_VERSION or not init or not frames:
        return None
    if size >= 32 + frames * (24 + (65536 if page == 1 else page)):
        return None
    return (
        f"{wal} holds less than its index {shm} lists ({frames} frames): it was removed or "
        "truncated while a process had the store open. That process refuses its next commit, "
        "copying the commits it still holds into the database file first (and does so too when "
        "it closes the store); open the store again after that. Never remove a store's files "
        "while a process has it open"
    )


class FileIdentities:
    """The identities (device, inode) of an open store's four files, recorded at open.

    Call once connected: the WAL and its index exist while a connection is open.
    """

    def __init__(self, real: str, path: str, lock_ident: tuple[int, int]) -> None:
        self.wal = real + "-wal"
        self._folder = os.path.dirname(real)
        self._files = [(real + "-lock", lock_ident)]
        for name in (real, self.wal, real + "-shm"):
            try:
                st = os.stat(name)
            except OSError as exc:
                raise StoreError(f"{path}: cannot find {name} of the open store: {exc.strerror}") from exc
            self._files.append((name, (st.st_dev, st.st_ino)))
        # The folder's ctime (ns) and inode at the last full check that found it quiet, or -1.
        self._ctime_seen = self._ino_seen = -1

    def changed(self) -> list[tuple[str, str]]:
        """The files removed or replaced since the open, each with how.

        Checked at every commit: a file's identity is its (device, inode), which only a new
        file changes. Removing, renaming or creating a file in a folder updates the folder's
        change time (its ctime, set with its mtime; a change of the mtime alone, utimensat(2),
        sets the ctime too), so while the folder's (inode, ctime) stay what they were at the
        last full check, one ``stat`` of the folder answers for all four files
        (docs/architecture.md has the cost). A full check is trusted for later commits only
        when the folder has been quiet for a while: a change made in the same tick of the
        file system's clock as the one before it could leave its time stamp unchanged.
        """
        try:
            st = _stat(self._folder)
        except OSError:
            return self._check(None)
        if st.st_ctime_ns == self._ctime_seen and st.st_ino == self._ino_seen:
            return []
        return self._check(st)

    def _check(self, st: os.stat_result | None) -> list[tuple[str, str]]:
        """The full check: each file's identity (``st``: the folder's stat, None without one)."""
        self._ctime_seen = self._ino_seen = -1  # untrusted until this check finds all quiet
        changed = []
        for name, ident in self._files:
            try:
                found = os.stat(name)
            except FileNotFoundError:
                gone = (
                    "removed"
                    if os.path.isdir(self._folder)
                    else f"removed (its directory {self._folder} is gone)"
                )
                changed.append((name, gone))
                continue
            except OSError as exc:
                changed.append((name, f"made unreadable ({exc.strerror})"))
                continue
            if (found.st_dev, found.st_ino) != ident:
                changed.append((name, "replaced by another file"))
        if st is not None and not changed and time.time_ns() - st.st_ctime_ns > QUIET_NS:
            self._ctime_seen, self._ino_seen = st.st_ctime_ns, st.st_ino
        return changed


def read_format(conn: sqlite3.Connection, path: str) -> bytes | None:
    """The store's id for a valid store, None for an empty file; raises for anything else."""
    tables = {row[0] for row in conn.execute(TABLES)}
    if not tables:
        return None
    meta: dict[str, Any] = {}
    if {"kv", "meta"} <= tables:
        try:
            meta = dict(conn.execute("SELECT name, value FROM meta"))
        except sqlite3.OperationalError as exc:
            if "no such column" not in str(exc):
                raise  # e.g. a disk I/O error: the store may be ours, say what happened
            meta = {}  # a foreign table named meta
    if meta.get("format") != FORMAT:
        raise foreign(path, tables)
    found = str(meta.get("format_version", ""))
    major = found.partition(".")[0]
    store_id = meta.get("store_id")
    if not major.isdigit() or "version" not in meta or not isinstance(store_id, bytes):
        raise StoreError(f"{path}: damaged fdbqueue store meta table (format_version {found!r})")
    if int(major) > MAJOR:
        raise UnsupportedFormatError(
            f"{path} has store format {found}, newer than this fdbqueue reads "
            f"({MAJOR}.x): upgrade fdbqueue to open it"
        )
    return store_id


def translate(exc: sqlite3.Error, path: str, real: str | None = None) -> QueueError:
    """A SQLite error as the QueueError a caller can act on (``real``: the store's real path)."""
    text = str(exc)
    low = text.lower()
    if "closed database" in low:
        park_at_exit()  # its connection closed at interpreter exit under a daemon thread
    if real is not None and any(w in low for w in ("disk i/o", "not a database", "malformed")):
        lost = wal_lost(real)
        if lost is not None:
            return StoreError(f"{path}: {lost} ({text})")
    if "locked" in low or "busy" in low:
        # SQLite's busy timeout (lock_timeout) ran out: a lock of SQLite's own, not the store
        # lock, so the page cannot say who holds it, but the kernel can (storelock).
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
        return NotAStore(f"{path} is not an fdbqueue store: not a SQLite database, or corrupt ({text})")
    return StoreError(f"{path}: SQLite error: {text}")
