"""What one process shares for one store file, whichever Database objects point at it.

The store lock (a thread lock, then the lease on ``<db>-lock``: :mod:`.storelock`), the lock
file's first page mapped shared by every process (:mod:`.page`), and the watch hub with its
read connection. Handles on the same file share one
:class:`SharedStore`, found by the lock file's (device, inode); after ``fork()`` the
child starts a registry of its own, so that it never uses the parent's descriptors.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import os
import sqlite3
import threading
import time
import weakref
from typing import Any

from fdbqueue.engines.local import watches
from fdbqueue.engines.sqlite.notify import WatchHub, notify_dir_for
from fdbqueue.engines.sqlite.page import allocate_page, map_page
from fdbqueue.engines.sqlite.storelock import StoreLock
from fdbqueue.errors import NestedTransactionError, StoreError, StoreLockedError

_READ = "SELECT v FROM kv WHERE k = ?"  # the kv table (files.SCHEMA)


class SharedStore:
    def __init__(self, real: str, ident: tuple[int, int], fd: int) -> None:
        self.real = real
        self.ident = ident
        self.fd = fd
        self._mapped, self.page = map_page(fd)  # the lock file's page (SharedPage)
        self.refs = 0
        # This process's base of the version clock (version = base + its CLOCK_MONOTONIC):
        # calibrated against the store at first use, so that a monotonic clock offset in
        # this process moves no one's database time (versionclock.VersionClock).
        self.clock_base: int | None = None
        # The store lock, both halves: this process's threads one at a time (its mutex and
        # owner), then the processes' (a transaction's begin takes it inline:
        # WritableStore.begin; its commit releases both in one call: StoreLock.release).
        self.lock = StoreLock(fd, self.page, real + "-wake")
        self.mutex = self.lock.mutex
        self._reader: sqlite3.Connection | None = None
        self._reader_lock = threading.Lock()
        self.hub = WatchHub(notify_dir_for(real), self._read_values, self.page, (real + "-lock", ident))

    def acquire(self, timeout: float, path: str, stealable: bool = False, me: int | None = None) -> None:
        """Take the store lock: this process's threads one at a time, then the processes'.

        ``stealable``: for a transaction, which another process may take the lock from once
        it outlived the 5-second window (:mod:`.storelock`); the holder's commit then fails
        (:meth:`pin`). Anything else (opening, saving a removed WAL) keeps it to the end.
        ``me``: this thread's id, from a caller that found it is not the owner already (a
        transaction's begin: ``WritableStore.begin``).
        """
        if me is None:
            me = threading.get_ident()
            if self.lock.owner == me:
                raise NestedTransactionError(
                    f"this thread already holds a transaction on {path}: finish it before opening another "
                    "(the embedded engine has a single writer; waiting here would deadlock)"
                )
        left = timeout
        if not self.mutex.acquire(False):  # the clock is read only when another thread holds it
            start = time.monotonic()
            if not self.mutex.acquire(True, timeout):
                held = "another thread of this process holds it"
                raise StoreLockedError(self._held_too_long(path, timeout, held))
            left = timeout - (time.monotonic() - start)
        try:
            who = self.lock.acquire(left, stealable)
        except BaseException:
            self.mutex.release()
            raise
        if who is not None:
            self.mutex.release()
            raise StoreLockedError(self._held_too_long(path, timeout, self.lock.holder))
        self.lock.owner = me

    @staticmethod
    def _held_too_long(path: str, timeout: float, who: str) -> str:
        return (
            f"waited {timeout:g} s (lock_timeout) for the store lock of {path}: {who}. A stopped "
            "holder is taken over once the page has not moved for 5 s, unless it stopped while "
            "opening the store or committing: resume it (kill -CONT) or end it, or raise lock_timeout"
        )

    @property
    def owner(self) -> int | None:
        """The thread holding the store lock (:attr:`StoreLock.owner`), or None."""
        return self.lock.owner

    def release(self) -> None:
        """Release both halves (:meth:`StoreLock.release`; a commit calls that directly)."""
        self.lock.release()

    def _read_values(self, keys: list[bytes]) -> dict[bytes, bytes | None]:
        # A connection of its own, used without the store lock: under WAL a reader
        # sees the last commit and never waits for the writer.
        with self._reader_lock:
            if self._reader is None:
                self._reader = sqlite3.connect(self.real, isolation_level=None, check_same_thread=False)
            out: dict[bytes, bytes | None] = {}
            for k in keys:
                row = self._reader.execute(_READ, (k,)).fetchone()
                out[k] = row[0] if row else None
            return out

    def close(self) -> None:
        self.hub.close()
        self._mapped.close()  # the page's views, then the mapping (page.Mapping)
        with self._reader_lock:
            if self._reader is not None:
                self._reader.close()
                self._reader = None
        self.lock.close()
        os.close(self.fd)


_registry_lock = threading.Lock()
_stores: dict[tuple[int, int], SharedStore] = {}
fork_generation = 0
# Connections inherited through fork(): closing one in the child could checkpoint or
# delete the parent's WAL, so the child keeps them referenced and never touches them.
inherited: list[Any] = []


def open_here(real: str) -> bool:
    """Whether this process has the store at ``real`` open already. Then its database file must
    not be opened and closed again outside SQLite: closing any descriptor of a file drops every
    POSIX lock the process holds on it (fcntl(2); https://www.sqlite.org/howtocorrupt.html
    section 2.2), SQLite's shared lock included, and another process closing its last
    connection would then take the store for unused and remove the WAL under this one."""
    try:
        st = os.stat(real + "-lock")
    except OSError:
        return False
    with _registry_lock:
        return (st.st_dev, st.st_ino) in _stores


def attach(real: str, path: str) -> SharedStore:
    try:
        fd = os.open(real + "-lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
    except OSError as exc:
        raise StoreError(f"{path}: cannot open the lock file {real}-lock: {exc.strerror}") from exc
    try:
        st = os.fstat(fd)
        ident = (st.st_dev, st.st_ino)
        with _registry_lock:
            store = _stores.get(ident)
            if store is None:
                try:
                    allocate_page(fd)
                except OSError as exc:
                    if exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                        raise
                    raise StoreError(
                        f"{path}: no space left on the device holding {real}-lock: {exc.strerror}; "
                        "free some space and open the store again"
                    ) from exc
                store = _stores[ident] = SharedStore(real, ident, fd)
                fd = -1
            store.refs += 1
    except OSError as exc:
        raise StoreError(f"{path}: cannot use the lock file {real}-lock: {exc.strerror}") from exc
    finally:
        if fd >= 0:
            os.close(fd)
    return store


def detach(store: SharedStore) -> None:
    with _registry_lock:
        store.refs -= 1
        if store.refs > 0:
            return
        if _stores.get(store.ident) is store:
            del _stores[store.ident]
    store.close()


# This process's open stores (store.WritableStore), closed at interpreter exit: see _at_exit.
_handles: weakref.WeakSet[Any] = weakref.WeakSet()


def close_at_exit(handle: Any) -> None:
    """Have ``handle`` (with ``close()`` and ``shared``) closed at interpreter exit if still open."""
    _handles.add(handle)


def _after_fork_in_child() -> None:
    global _registry_lock, _stores, _handles, fork_generation
    for handle in list(_handles):
        handle.ready = False  # its next begin opens its files again (WritableStore.begin)
    inherited.append(_stores)
    _registry_lock = threading.Lock()
    _stores = {}
    _handles = weakref.WeakSet()  # the parent's handles are not the child's to close
    fork_generation += 1


def _at_exit() -> None:
    """Close the handles a program left open, so that the last process to leave a store
    leaves only its files: SQLite checkpoints and removes ``-wal`` and ``-shm`` at the last
    connection's close, and the last watch hub removes the notify folder. Without it a
    process that had watched kept its hub's thread, and with it the hub's read connection,
    to the end: its store looked in use to SQLite, and kept them all.

    A handle whose store lock a thread of this process still holds (a transaction in a
    daemon thread) is left open, its connection being in use: only its socket file goes.
    """
    watches.EXITING.set()  # a daemon thread still waiting on a store stays where it is
    for handle in list(_handles):
        store = getattr(handle, "shared", None)
        if store is None or store.owner is not None:
            continue
        with contextlib.suppress(Exception):  # never fail the interpreter's exit
            handle.close()
    for store in list(_stores.values()):
        store.hub.unlink_socket()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)
