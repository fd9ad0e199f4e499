"""A store opened read-only: ``mode=ro``, or found so (a read-only mount, no write permission).

It creates no file and takes no lock: each transaction reads the last committed state on a
connection of its own, and any write raises StoreError. Its read versions come from the
version clock of the lock file's page when a writer keeps it, else from meta's reservation
advanced by this process's monotonic clock (the Database's read-only clock).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Collection
from urllib.parse import quote

from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.engines.sqlite import files as _files
from fdbqueue.engines.sqlite import shared as _shared
from fdbqueue.engines.sqlite.page import clock_tag
from fdbqueue.engines.sqlite.store import Store
from fdbqueue.errors import QueueError, StoreError


class ReadOnlyStore(Store):
    """A store this handle only reads (``why``: opened with mode=ro, or why it cannot write)."""

    read_only = True

    def __init__(self, real: str, path: str, lock_timeout: float, why: str) -> None:
        super().__init__(real, path, lock_timeout)
        self.why = why
        self._immutable = False  # reading the database file alone
        self._open()

    def _open(self) -> None:
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
        self.generation = _shared.fork_generation
        real = self.real
        if not os.path.exists(real):
            raise StoreError(f"{self.path} does not exist (opened read-only, nothing is created)")
        self._immutable = not os.path.exists(real + "-shm") and _files.no_wal_left(real)
        try:
            self.conn = self._connect()
        except sqlite3.Error as exc:
            low = str(exc).lower()
            if (
                self._immutable
                or not ("readonly" in low or "unable to open" in low)
                or not _files.no_wal_left(real)
            ):
                raise _files.translate(exc, self.path, real) from exc
            self._immutable = True
            try:
                self.conn = self._connect()
            except sqlite3.Error as again:
                raise _files.translate(again, self.path, real) from again

    def _target(self) -> str:
        """SQLite's URI for a read-only connection (``_immutable``: the file alone, no WAL)."""
        return f"file:{quote(self.real)}?mode=ro" + ("&immutable=1" if self._immutable else "")

    def _connect(self) -> sqlite3.Connection:
        conn = self.connect_reader()
        try:
            store_id = _files.read_format(conn, self.path)
            if store_id is None:
                raise _files.NotAStore(f"{self.path} is not an fdbqueue store: it holds no tables")
            self.clock_tag = clock_tag(store_id)
        except BaseException:
            conn.close()
            raise
        return conn

    def connect_reader(self) -> sqlite3.Connection:
        return sqlite3.connect(
            self._target(), uri=True, timeout=self.lock_timeout, isolation_level=None, check_same_thread=False
        )

    def begin(self) -> tuple[sqlite3.Cursor, bool]:
        if self.generation != _shared.fork_generation:
            _shared.inherited.extend((self.conn, self._readers))
            self._readers = []
            self._open()
        self.usable()
        return self.cursor(self.snapshot()), True

    def no_writes(self) -> QueueError:
        return StoreError(f"{self.path} is open read-only ({self.why}): this handle can read but not write")

    # A transaction on a read-only store never writes: it never reaches the commit's write steps.

    def changed_files(self) -> list[tuple[str, str]]:
        return []

    def refuse(self, changed: list[tuple[str, str]]) -> StoreError:
        raise self.no_writes()

    def pin(self) -> bool:
        raise self.no_writes()

    def release(self) -> None:
        raise self.no_writes()  # never called: a transaction here is always nested

    def after_writes(self, version: int, bumped: bool) -> int | None:
        raise self.no_writes()

    def publish(self, keys: Collection[bytes] | None) -> None:
        raise self.no_writes()

    def arm_watches(self, watches: list[EventWatch]) -> None:
        for w in watches:
            w.fail(4100, f"cannot watch {self.path}: it is open read-only ({self.why})")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.generation != _shared.fork_generation:
            return  # inherited from the parent process: its resources are not ours to release
        self.conn.close()
        self.close_readers()
