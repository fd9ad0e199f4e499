"""Group commit for the embedded engine at ``sync=full``: one fsync serves every commit before it.

SQLite runs at ``synchronous=NORMAL`` (``COMMIT`` writes the WAL frames, no fsync), and each
commit then calls :meth:`WalSync.make_durable` after releasing the store lock and before it
returns, so the next transaction runs while this one waits for the disk. One fsync at a
time per store (a ``flock`` on the WAL; threads of a process queue on a mutex first), as
PostgreSQL's backends queue on its WAL write lock: a committer that gets its turn first
checks whether the fsync it waited behind covered it. The wait is bounded (see below).

Why it is safe: SQLite's WAL recovery keeps the longest run of valid frames (each carries a
checksum chained from the one before), so what a power loss leaves is a prefix of the
commits, and an fsync of the WAL covers every frame written before it began. A commit
returns after an fsync that began after its frames were written. Others can *see* a commit
before its fsync ends, so a read-only transaction that may have seen a version above the
on-disk mark fsyncs too before its commit returns; a writing one needs nothing more, its
own fsync covering everything before it.

A stopped process (SIGSTOP, a debugger) may hold the WAL's lock inside its fsync for as long
as it stays stopped, its commit done and the store lock released: so a committer waits for
that lock :data:`LEADER_WAIT` at most, then fsyncs the WAL itself without it, and a read-only
transaction never queues on it. Safe, because the lock only spares fsyncs: fdatasync(2)
returns once everything written to the file before the call is on disk, whoever else is
syncing it meanwhile (the kernel waits for pages another sync is writing), and an fsync at
any moment only forces to disk what the kernel's own writeback could have written then,
which SQLite's WAL (frames checksummed and salted, recovery keeping the valid prefix)
tolerates at every instant. The sync mark stays true: each process raises it only to the
committed version it read *before* its own fsync began; a race may leave a lower value,
which costs a later commit an fsync it could have skipped, never a skipped one it needed.

Shared state, the sync mark in the lock file's mapped page (:data:`.page.SYNC`): the version
clock's tag (boot + store), the highest version known to be on disk, and the last version
whose ``COMMIT`` has returned. The two versions are trusted only under this store's tag, and
each is written on its own (8 aligned bytes) by different processes.
"""

from __future__ import annotations

import errno
import fcntl
import os
import sqlite3
import threading

from fdbqueue.engines.local.watches import park_at_exit
from fdbqueue.engines.sqlite.lockwait import _Waiter
from fdbqueue.engines.sqlite.page import SharedPage
from fdbqueue.errors import StoreError

# SQLite checkpoints once the WAL passes 1,000 pages; a commit may add a few past that first.
WAL_FRAMES = 1_100
# The zero-fill runs only when this much stays free after it (see WalSync.preallocate).
FILL_ROOM = 64 * 1024 * 1024
#: Seconds a commit waits for another process's fsync of the WAL (its group-commit lock)
#: before it fsyncs the WAL itself: far longer than a healthy fsync of the WAL's ~4 MB, and
#: well inside the 5-second window that bounds the store lock. A module attribute, so that a
#: test may read it.
LEADER_WAIT = 1.0


def _synced(page: SharedPage, tag: bytes) -> int:
    found, synced, _ = page.sync_mark()
    return int(synced) if found == tag else -1


def _free_bytes(real: str) -> int:
    """Bytes an unprivileged writer may still use on the file system holding ``real``."""
    st = os.statvfs(os.path.dirname(real))
    return st.f_bavail * st.f_frsize


class WalSync:
    """The fsyncs of one Database's WAL (``real`` is the store file's resolved path)."""

    def __init__(self, real: str, path: str) -> None:
        self._real = real
        self._path = path
        self._fd: int | None = None
        self._mutex = threading.Lock()
        # A thread blocked in flock for this descriptor, so that a wait can give up (_lock).
        self._waiter: _Waiter | None = None

    @staticmethod
    def committed(page: SharedPage, tag: bytes | None, version: int) -> int | None:
        """Record ``version`` (-1: none) as committed; the last committed version, or None.

        Called under the store lock, right after COMMIT: every version up to the one
        returned has its WAL frames written (None: not known, so every commit counts).
        """
        if tag is None:
            return None
        found, _, committed = page.sync_mark()
        if found != tag:
            if version < 0:
                return None
            page.set_sync_mark(tag, 0, version)
            return version
        if version < 0:
            return int(committed)
        page.set_committed(version)
        return version

    def make_durable(
        self, page: SharedPage, tag: bytes | None, version: int | None, *, wait: bool = True
    ) -> None:
        """Return once every commit up to ``version`` (None: every commit so far) is on disk.

        Called after the store lock is released. ``wait``: queue behind another process's
        fsync (group commit), for :data:`LEADER_WAIT` at most, before syncing the WAL without
        it; a read-only transaction passes False and never waits for another process. Raises
        StoreError if the fsync fails: the commit was written (and may be seen) but may not
        survive a power loss.
        """
        if tag is not None and version is not None:
            found, synced, _ = page.sync_mark()
            if found == tag and synced >= version:
                return
        try:
            with self._mutex:  # threads of this process share one descriptor (and flock)
                fd = self._fd if self._fd is not None else self._wal()
                locked = wait and self._lock(fd)
                try:
                    if tag is None or version is None:
                        os.fdatasync(fd)
                        return
                    # One read: whether the fsync we waited for covered us, and what the mark
                    # may say after this fsync (read before it begins).
                    found, synced, target = page.sync_mark()
                    if locked and found == tag and synced >= version:
                        return  # the fsync we waited for began after our commit
                    os.fdatasync(fd)
                    # Two processes may race here and leave the lower value: that only costs
                    # a later commit an fsync it could have skipped.
                    if found == tag and target > _synced(page, tag):
                        page.set_on_disk(target)
                finally:
                    if locked:
                        fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            park_at_exit()  # the store closed at interpreter exit under a daemon thread
            raise StoreError(
                f"{self._path}: the commit was written but its fsync failed ({exc.strerror}): it may "
                "not survive a power loss"
            ) from exc

    def _lock(self, fd: int) -> bool:
        """The WAL's flock (call with ``_mutex`` held): False when another process kept it
        :data:`LEADER_WAIT` seconds (stopped in its fsync?), or still keeps it since an earlier
        wait gave up (our waiter thread is still blocked behind it: no second wait then).
        """
        waiter = self._waiter
        if waiter is not None and waiter.blocking:
            # Its request is queued for this open file description: one of ours now would
            # be granted at once by the same lock, which the waiter would then drop.
            return False
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            pass
        if waiter is None:
            waiter = self._waiter = _Waiter(
                fd,
                lambda f: fcntl.flock(f, fcntl.LOCK_EX),
                lambda f: fcntl.flock(f, fcntl.LOCK_UN),
                "fdbqueue-walsync",
            )
        return waiter.wait(LEADER_WAIT)

    def _wal(self) -> int:
        """The WAL's descriptor, opened once (call with ``_mutex`` held)."""
        if self._fd is None:
            self._fd = self._open_wal()
        return self._fd

    def _open_wal(self) -> int:
        # The WAL exists once the connection has read or written, and stays (the same
        # inode: SQLite truncates or rewrites it in place) while any connection is open,
        # ours included. SQLite fsyncs the directory of a new WAL only at its first own
        # sync, which at synchronous=NORMAL is the first checkpoint: do it here once.
        # Read-only where the store is (its reads may still need an fsync of others' commits).
        try:
            fd = os.open(self._real + "-wal", os.O_RDWR | os.O_CLOEXEC)
        except PermissionError:
            fd = os.open(self._real + "-wal", os.O_RDONLY | os.O_CLOEXEC)
        try:
            dir_fd = os.open(os.path.dirname(self._real), os.O_RDONLY | os.O_CLOEXEC)
            try:
                os.fsync(dir_fd)
            finally:
                os.close(dir_fd)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def preallocate(self, conn: sqlite3.Connection) -> None:
        """Extend the WAL with zeros to what it holds between checkpoints (call with the store lock).

        While a WAL file grows, each commit's fdatasync must also commit the file system's
        journal (the file's size changed): a fifth more per fsync on our test machine, paid
        by the first ~500 commits after every fresh open, since SQLite deletes the WAL when
        the last connection closes and then rewrites it in place once checkpointed. PostgreSQL
        zero-fills new WAL segments for the same reason (``wal_init_zero``). Safe: the
        zeros go past the file's end, under SQLite's own write lock (no frame is being
        appended), and a frame of zeros never passes the WAL's salt and checksum check, so
        readers and crash recovery ignore it as they ignore any stale frame.

        Skipped on a nearly full file system (less than the fill plus :data:`FILL_ROOM`
        free, by ``statvfs``): the space is then worth more to the commits than the speed,
        and a fill that fails half-way gives back what it wrote. Never fails the open.
        """
        target = 32 + WAL_FRAMES * (24 + conn.execute("PRAGMA page_size").fetchone()[0])
        try:
            conn.execute("BEGIN IMMEDIATE")  # SQLite's write lock: nobody appends meanwhile
        except sqlite3.Error:
            return  # e.g. a read-only store: its commits will fail on their own terms
        try:
            with self._mutex:
                fd = self._wal()
                size = os.fstat(fd).st_size
                if size < target and _free_bytes(self._real) >= target - size + FILL_ROOM:
                    try:
                        if os.pwrite(fd, bytes(target - size), size) != target - size:
                            raise OSError(errno.ENOSPC, "short write")  # what a full disk does first
                        os.fdatasync(fd)
                    except OSError:
                        os.ftruncate(fd, size)  # only our zeros lie past it (SQLite's write lock)
                        raise
        except OSError:
            pass  # an optimisation only: SQLite reports a WAL it cannot write by itself
        finally:
            conn.execute("ROLLBACK")

    def after_fork(self) -> None:
        """In a forked child: drop the parent's descriptor and mutex (it may have been held)."""
        if self._fd is not None:
            os.close(self._fd)  # this process's copy; the parent's stays open
            self._fd = None
        self._waiter = None  # its thread stayed in the parent
        self._mutex = threading.Lock()

    def close(self) -> None:
        with self._mutex:  # after an fsync in progress in another thread, not under it
            if self._waiter is not None:
                self._waiter.retire()  # it closes its own descriptor once out of the kernel
                self._waiter = None
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
