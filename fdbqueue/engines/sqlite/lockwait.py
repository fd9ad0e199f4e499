"""Waiting on a kernel lock, and saying who holds it: a thread that blocks in the kernel for
one lock so that its caller can give up (:class:`_Waiter`: the store lock's waiters, the WAL
sync's), and what a waiter that gave up says of the holder (:func:`sqlite_holder`: SQLite's own
lock on the store file, from /proc/locks; a stopped process, from /proc).

Apart from :mod:`.storelock` (the lease itself: its generations, claims, takeovers and pin),
whose waiters and error messages use them, as the WAL sync (:mod:`.walsync`) and the store's
files (:mod:`.files`) do.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable

_SLICE = 0.25  # a blocked waiter looks at the page at least this often


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
