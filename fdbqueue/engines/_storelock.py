"""The store lock between processes: a lease that a stalled holder loses after 5 seconds.

A kernel lock held by a stopped process (SIGSTOP, a debugger, a machine under swap) cannot
be broken by anyone else, so a plain ``flock`` would let one stalled transaction block every
writer of the store for as long as it is stopped. FoundationDB bounds every transaction to
5 seconds instead (https://apple.github.io/foundationdb/known-limitations.html, "Long running
transactions"); here the bound is enforced on the lock itself:

- The lock is an open-file-description lock (``F_OFD_SETLK``, Linux; fcntl(2), "Open file
  description locks") on one byte of ``<db>-lock``: byte ``BASE + generation``. The current
  generation, the holder's start (``CLOCK_MONOTONIC`` microseconds, shared by every process
  of one boot) and its pid live in the lock file's shared page at :data:`LEASE_AT`.
- A waiter blocks in the kernel on the current generation's byte (a helper thread, so that
  it can give up after a timeout; the kernel wakes it on release), and looks at the page
  again at least every :data:`_SLICE` seconds. When the holder started more than the
  5-second window ago, the waiter takes the lock over: under a short page mutex (another
  byte, only ever held for a few microseconds) it moves the generation on and locks the new
  byte. Waiters still blocked on the old byte move to the new one; a helper thread that gets
  an old byte later hands it straight back.
- The holder that lost the lock learns it from the page when its commit pins the lock
  (:meth:`StoreLock.pin`: from then on nobody may take it over), and its commit fails with
  1007 transaction_too_old, as a FoundationDB transaction older than the
  window does. Serializability never depends on the lock: a transaction reads a SQLite
  snapshot and buffers its writes, and SQLite refuses to commit over a snapshot that another
  commit overtook (1020), so a takeover can only make a late commit fail.

What is not bounded: a holder stopped *during* its commit (pinned, holding SQLite's write
lock for those microseconds) blocks the others until it runs; so does a process stopped
while holding the page mutex (a few microseconds). A waiter thread blocked on the byte of a
generation taken over from a stopped process stays in the kernel, with its descriptor, until
that process resumes or dies.

Without OFD locks (not Linux) the lock is ``flock`` on the whole file, as before: a stopped
holder then blocks writers until ``lock_timeout`` and the layer retries.
"""

from __future__ import annotations

import contextlib
import fcntl
import mmap
import os
import struct
import sys
import threading
import time
from collections.abc import Callable

from fdbqueue.engines.base import TRANSACTION_WINDOW_SECONDS

#: Where the lease lives in the lock file's shared page: generation, holder's start (0: free), pid.
LEASE_AT = 192
_LEASE = struct.Struct("=QqI")
_MUTEX_AT = 3 * 4096  # the page mutex byte (the page is 0..4095; 8192 is _walcheck's presence byte)
_BASE = 4 * 4096  # generation g is byte _BASE + g
#: ``struct flock`` on Linux: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
FLOCK = struct.Struct("hhqqi4x")
OFD = sys.platform.startswith("linux") and hasattr(fcntl, "F_OFD_SETLKW")
_WINDOW_US = int(TRANSACTION_WINDOW_SECONDS * 1_000_000)
_SLICE = 0.25  # a blocked waiter looks at the page at least this often
# The start recorded by a holder that must not be taken over (opening, checkpointing a
# removed WAL): only transactions are bounded by the window.
_PINNED = 2**62


_pid = os.getpid()  # written with every claim: a system call each time, were it asked


def _new_pid() -> None:
    global _pid
    _pid = os.getpid()


os.register_at_fork(after_in_child=_new_pid)


def _now_us() -> int:
    """CLOCK_MONOTONIC itself, shared by every process of the boot: never a test's fake clock,
    which moves one process's engine time only, while holders in other processes read theirs."""
    return time.monotonic_ns() // 1000


def byte_request(kind: int, at: int) -> bytes:
    """The ``struct flock`` of an OFD lock (``kind``: F_RDLCK, F_WRLCK, F_UNLCK) of the byte ``at``."""
    return FLOCK.pack(kind, os.SEEK_SET, at, 1, 0)


def _byte_lock(fd: int, at: int, kind: int, wait: bool) -> bool:
    """An OFD lock of one byte; False when it is held elsewhere (``wait`` False)."""
    cmd = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
    try:
        fcntl.fcntl(fd, cmd, byte_request(kind, at))
    except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: held by another description
        return False
    return True


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


class StoreLock:
    """The inter-process half of the store lock, for one process and one store file.

    Callers serialise their own threads (one acquire at a time per process, then release),
    as :class:`~fdbqueue.engines._shared.SharedStore` does.
    """

    def __init__(self, fd: int, shared: mmap.mmap) -> None:
        self._fd = fd
        self._page = shared  # the mmapped page (a writable buffer)
        self._gen: int | None = None  # the generation this process holds
        self._waiters: dict[int, _Waiter] = {}

    # -- the page ----------------------------------------------------------------------------

    def _read(self) -> tuple[int, int, int]:
        gen, since, pid = _LEASE.unpack_from(self._page, LEASE_AT)
        return int(gen), int(since), int(pid)

    def _write(self, gen: int, since: int) -> None:
        _LEASE.pack_into(self._page, LEASE_AT, gen, since, _pid)

    def _locked_page(self) -> _PageMutex:
        return _PageMutex(self._fd)

    # -- acquire / release -------------------------------------------------------------------

    def acquire(self, timeout: float, stealable: bool) -> str | None:
        """Take the lock; None, or why not within ``timeout`` seconds ("another process").

        ``stealable``: a transaction, which another process may take the lock from once it
        outlived the window; otherwise (opening, recovery) nobody may.
        """
        if not OFD:
            return self._acquire_flock(timeout)
        deadline = time.monotonic() + timeout
        while True:
            gen, since, _ = self._read()
            waiter = self._waiters.get(gen)
            free = waiter is None or not waiter.blocking
            if free and _byte_lock(self._fd, _BASE + gen, fcntl.F_WRLCK, False):
                if self._claim(gen, stealable):
                    return None
                continue
            now = _now_us()
            if since and now - since > _WINDOW_US and self._take_over(gen, since, stealable):
                return None
            left = deadline - time.monotonic()
            if left <= 0:
                return "another process"
            # Until the holder's window ends, or a slice: the page may move on meanwhile.
            until_window = (since + _WINDOW_US - now) / 1e6 + 0.01 if since else _SLICE
            granted = self._waiter(gen).wait(min(left, _SLICE, max(until_window, 0.0)))
            if granted and self._claim(gen, stealable):
                return None
            self._forget_old(gen)

    def _claim(self, gen: int, stealable: bool) -> bool:
        """Holding byte ``gen``: make it ours in the page, unless the generation moved on.

        Without the page mutex (one system call per acquire, as a plain flock) when the page
        says free (a takeover compares the holder's start, which is not 0); a start left by
        a holder that died: a waiter may be taking it over, and the mutex decides.
        """
        current, since, _ = self._read()
        if current == gen and since != 0:  # a dead holder's start: a waiter may take it over now
            with self._locked_page():
                current = self._read()[0]
                if current == gen:
                    self._write(gen, _now_us() if stealable else _PINNED)
        elif current == gen:
            self._write(gen, _now_us() if stealable else _PINNED)
        if current == gen:
            self._gen = gen
            return True
        _byte_lock(self._fd, _BASE + gen, fcntl.F_UNLCK, False)
        return False

    def _take_over(self, gen: int, since: int, stealable: bool) -> bool:
        """The holder of ``gen`` outlived the window: move the lock to the next generation."""
        with self._locked_page():
            current, found, _ = self._read()
            if (current, found) != (gen, since) or found == _PINNED:
                return False  # released, or taken over by another waiter meanwhile
            if not _byte_lock(self._fd, _BASE + gen + 1, fcntl.F_WRLCK, False):
                return False  # a process still on an older page view: try again
            self._write(gen + 1, _now_us() if stealable else _PINNED)
            self._gen = gen + 1
        self._forget_old(gen + 1)
        return True

    def _waiter(self, gen: int) -> _Waiter:
        waiter = self._waiters.get(gen)
        if waiter is None:
            at = _BASE + gen
            waiter = self._waiters[gen] = _Waiter(
                self._fd,
                lambda fd: _byte_lock(fd, at, fcntl.F_WRLCK, True),
                lambda fd: _byte_lock(fd, at, fcntl.F_UNLCK, False),
                f"fdbqueue-lock-{gen}",
            )
        return waiter

    def _forget_old(self, gen: int) -> None:
        for old in [g for g in self._waiters if g < gen]:
            self._waiters.pop(old).retire()

    def pin(self) -> bool:
        """Before a commit applies anything: False when another process took the lock over;
        else no one may take it over from now until release (a commit is microseconds).

        Checking alone would leave a window between the check and COMMIT in which a takeover
        lets both commit, and the page's marks written after COMMIT (the version clock's
        pending flag, the durable version) go out of order.
        """
        if not OFD:
            return True
        gen = self._gen
        if gen is None:
            return False
        with self._locked_page():
            if self._read()[0] != gen:
                return False
            self._write(gen, _PINNED)
        return True

    def release(self) -> None:
        if not OFD:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            return
        gen, self._gen = self._gen, None
        if gen is None:
            return
        # Under the page mutex unless pinned: a waiter may be taking the lock over at this
        # very moment, and must not see its generation undone.
        current, since, _ = self._read()
        if current == gen and since != _PINNED:
            with self._locked_page():
                if self._read()[0] == gen:
                    self._write(gen, 0)
        elif current == gen:
            self._write(gen, 0)  # pinned (see pin): nobody takes it over meanwhile
        _byte_lock(self._fd, _BASE + gen, fcntl.F_UNLCK, False)

    def close(self) -> None:
        for waiter in self._waiters.values():
            waiter.retire()
        self._waiters.clear()

    # -- without OFD locks -------------------------------------------------------------------

    def _acquire_flock(self, timeout: float) -> str | None:
        waiter = self._waiters.get(-1)
        if waiter is None or not waiter.blocking:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return None
            except BlockingIOError:
                pass
        if waiter is None:
            waiter = self._waiters[-1] = _Waiter(
                self._fd,
                lambda fd: fcntl.flock(fd, fcntl.LOCK_EX),
                lambda fd: fcntl.flock(fd, fcntl.LOCK_UN),
                "fdbqueue-flock",
            )
        return None if waiter.wait(timeout) else "another process"


class _PageMutex:
    """The page mutex: an OFD lock of one byte, held while the lease fields change."""

    __slots__ = ("_fd",)

    def __init__(self, fd: int) -> None:
        self._fd = fd

    def __enter__(self) -> None:
        _byte_lock(self._fd, _MUTEX_AT, fcntl.F_WRLCK, True)

    def __exit__(self, *exc: object) -> None:
        _byte_lock(self._fd, _MUTEX_AT, fcntl.F_UNLCK, False)
