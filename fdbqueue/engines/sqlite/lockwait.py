"""Waiting on a kernel lock, and saying who holds it: a thread that blocks in the kernel for
one lock so that its caller can give up (:class:`_Waiter`: the WAL sync's waiters, the store
lock's where it has no wake-up FIFO), the store lock's wake-one FIFO (:class:`WakeChannel`),
and what a waiter that gave up says of the holder (:func:`sqlite_holder`: SQLite's own lock
on the store file, from /proc/locks; a stopped process, from /proc).

Apart from :mod:`.storelock` (the lease itself: its generations, claims, takeovers and pin),
whose waiters and error messages use them, as the WAL sync (:mod:`.walsync`) and the store's
files (:mod:`.files`) do.
"""

from __future__ import annotations

import contextlib
import os
import select
import stat
import threading
import time
from collections.abc import Callable

_SLICE = 0.25  # a blocked waiter looks at the page at least this often
#: The longest a waiter on the wake-up channel waits for a byte (WakeChannel): one lost or
#: never written (a process of an older version releasing, a FIFO removed) costs no more.
WAKE_SLICE = 0.02


def _stopped(pid: int) -> str:
    """ ", stopped" when ``pid`` is a stopped process (SIGSTOP, a debugger), as /proc says."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            state = f.read().rsplit(b")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return ", stopped (SIGSTOP or a debugger)" if state in (b"T", b"t") else ""


def sqlite_holder(real: str) -> str:
    """Who holds SQLite's lock on the store file ``real`` (or on its ``-shm``) against us, as a
    waiter that SQLite's busy timeout gave up on says it.

    SQLite locks with POSIX record locks (fcntl(2), ``F_SETLK``), which /proc/locks lists with
    the holder's pid (Linux; proc(5)): only a write lock keeps a reader out. The last
    connection's close holds one on ``real`` while it copies the WAL into the file and removes
    it (``sqlite3WalClose`` in SQLite's ``src/wal.c``), outside fdbqueue's store lock.
    """
    idents = set()
    for path in (real, real + "-shm"):
        with contextlib.suppress(OSError):
            st = os.stat(path)
            idents.add(f"{os.major(st.st_dev):02x}:{os.minor(st.st_dev):02x}:{st.st_ino}")
    pids: list[int] = []
    with contextlib.suppress(OSError, ValueError), open("/proc/locks") as f:
        for line in f:
            # "1: POSIX  ADVISORY  WRITE 4242 fe:00:2164135 1073741826 1073742335" ("->": a waiter)
            parts = line.split()
            if len(parts) > 5 and parts[1:4] == ["POSIX", "ADVISORY", "WRITE"] and parts[5] in idents:
                pid = int(parts[4])
                if pid != os.getpid() and pid not in pids:
                    pids.append(pid)
    if not pids:
        return (
            "another process holds SQLite's lock on it (a process closing the store, or a program "
            "outside fdbqueue)"
        )
    return (
        "; ".join(f"process {pid} holds SQLite's lock on it{_stopped(pid)}" for pid in pids)
        + " (a process's last close holds it while it copies the WAL into the store file)"
    )


class _Waiter:
    """A thread that blocks in the kernel for one lock so that its caller can give up.

    Runs ``lock(fd)`` (blocking) once asked; hands the lock to a caller still waiting, else
    releases it with ``unlock(fd)``. ``retire()`` ends it once it is out of the kernel. ``fd``
    is a duplicate of the store's descriptor (the same open file description, so the same
    lock owner), closed by the thread: the store may close its own meanwhile.
    """

    def __init__(
        self, fd: int, lock: Callable[[int], object], unlock: Callable[[int], object], name: str
    ) -> None:
        self._fd = os.dup(fd)
        self._lock = lock
        self._unlock = unlock
        self._cond = threading.Condition(threading.Lock())
        self._blocking = False
        self._wanted = False
        self._granted = False
        self._retired = False
        threading.Thread(target=self._run, name=name, daemon=True).start()

    @property
    def blocking(self) -> bool:
        """In the kernel, or about to be: the lock must then come through this waiter (a
        second request by the same open file description would be granted to both)."""
        return self._blocking

    def wait(self, timeout: float) -> bool:
        with self._cond:
            self._wanted = True
            if not self._blocking:
                self._blocking = True
                self._cond.notify_all()
            if self._cond.wait_for(lambda: self._granted, max(timeout, 0.0)):
                self._granted = self._wanted = False
                return True
            self._wanted = False  # the thread hands the lock back if it gets it later
            return False

    def retire(self) -> None:
        with self._cond:
            self._retired = True
            self._cond.notify_all()

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._blocking or self._retired)
                if not self._blocking:
                    os.close(self._fd)
                    return
            try:
                got = self._lock(self._fd) is not False
            except OSError:
                got = False
            if not got:
                with self._cond:
                    self._blocking = False
                time.sleep(_SLICE)  # the caller times out and asks again
                continue
            with self._cond:
                if self._wanted and not self._retired:
                    self._blocking = False
                    self._granted = True
                    self._cond.notify_all()
                    continue
                # Handed back while still marked blocking: until the byte is unlocked, the
                # caller must not lock it through the same open file description (that
                # would succeed, and this unlock would then drop the caller's lock).
                with contextlib.suppress(OSError):
                    self._unlock(self._fd)
                self._blocking = False


class WakeChannel:
    """Wake-one between the processes of a store, for the store lock's waiters: a FIFO beside
    the store (``<db>-wake``) that a releaser writes one byte to when the page says someone
    may wait (:data:`.page.WAITERS`), and a waiter waits on in its own thread, with a timeout.

    Why not the kernel's own queue: a thread blocked in ``F_OFD_SETLKW`` cannot be made to
    give up, so it runs in a helper (:class:`_Waiter`) and the grant costs two more switches
    (helper, then caller); and a release wakes every blocked waiter, of which one wins
    (fcntl(2)). Here the waiting thread is the caller, and ``EPOLLEXCLUSIVE`` has the kernel
    wake one of the processes waiting on the FIFO for a byte, not all (epoll_ctl(2), Linux
    4.5). The lock itself is still only ever taken with ``F_OFD_SETLK``: a byte lost or late
    costs a wait of :data:`WAKE_SLICE` at most, never the lock.

    Opening a FIFO for reading and writing does not block on Linux (fifo(7)), nor does either
    end then: one descriptor, non-blocking, serves to wait and to wake.
    """

    __slots__ = ("_epoll", "fd")

    def __init__(self, fd: int, epoll: select.epoll) -> None:
        self.fd = fd
        self._epoll = epoll

    @classmethod
    def open(cls, path: str, create: bool) -> WakeChannel | None:
        """The channel at ``path`` (made first when ``create``); None where it cannot be had
        (no epoll or no EPOLLEXCLUSIVE, a directory not writable, no FIFOs on this file
        system): the caller then waits as before."""
        exclusive = getattr(select, "EPOLLEXCLUSIVE", None)
        if exclusive is None or not hasattr(select, "epoll"):
            return None
        fd = -1
        try:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkfifo(path, 0o666)
            fd = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
            if not stat.S_ISFIFO(os.fstat(fd).st_mode):
                raise OSError(f"{path} is not a FIFO")
            epoll = select.epoll()
            try:
                epoll.register(fd, select.EPOLLIN | exclusive)
            except BaseException:
                epoll.close()
                raise
        except OSError:
            if fd >= 0:
                os.close(fd)
            return None
        return cls(fd, epoll)

    def wait(self, timeout: float) -> None:
        """Until a byte comes (taken, if no other process took it first) or ``timeout``."""
        if self._epoll.poll(max(timeout, 0.0), 1):
            with contextlib.suppress(BlockingIOError):
                os.read(self.fd, 1)

    def wake(self) -> None:
        """Wake one waiter (a full FIFO already wakes them: the byte is not needed)."""
        with contextlib.suppress(BlockingIOError):
            os.write(self.fd, b"w")

    def close(self) -> None:
        self._epoll.close()
        os.close(self.fd)
