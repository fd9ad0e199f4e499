"""The store lock between processes: a lease that a stalled holder loses after 5 seconds.

A kernel lock held by a stopped process (SIGSTOP, a debugger, a machine under swap) cannot
be broken by anyone else, so a plain ``flock`` would let one stalled transaction block every
writer of the store for as long as it is stopped. FoundationDB bounds every transaction to
5 seconds instead (https://apple.github.io/foundationdb/known-limitations.html, "Long running
transactions"); here the bound is enforced on the lock itself:

- The lock is an open-file-description lock (``F_OFD_SETLK``, Linux; fcntl(2), "Open file
  description locks") on one byte of ``<db>-lock``: byte ``page.LEASE_BYTES + generation``.
  The current generation lives in the lock file's shared page (:data:`.page.LEASE`),
  followed by two slots (even and odd generations, :data:`.page.LEASE_SLOTS`), each holding
  the generation it was claimed for, the holder's start, its pid and a claims counter that
  every claim moves on.
- A waiter raises the page's waiters' flag (:data:`.page.WAITERS`), tries the byte once more,
  and waits in its own thread on the store's wake-up FIFO (:class:`.lockwait.WakeChannel`,
  ``<db>-wake``), to which a release that finds the flag up clears it and writes one byte:
  the kernel wakes one waiting process, which tries the byte again (a claim after a wait
  raises the flag again, for the waiters not woken). Where no FIFO can be had, a waiter
  blocks in the kernel on the byte instead (a helper thread, so that it can give up after a
  timeout; the kernel wakes it on release). Either way it looks at the page again at least
  every :data:`.lockwait._SLICE` seconds. When the page has not changed for the
  window (:data:`WINDOW`, 5 s) while the byte stayed held, measured on the waiter's own
  monotonic clock, the waiter takes the lock over: under a short page mutex (another byte)
  it checks the page is still what it saw, locks the next generation's byte, writes that
  generation's slot, then the generation. Waiters still blocked on the old byte move to the
  new one; a helper thread that gets an old byte later hands it straight back.
- Why "unchanged for the window" and not "started more than 5 s ago": a holder stopped
  between taking the byte and writing its claim (or between clearing its claim and
  unlocking the byte) leaves the page saying free while the byte is held, and no start to
  age; and a start written by another process's clock says nothing to a waiter whose
  monotonic clock is offset (a time namespace, libfaketime). So no state of the page and
  the byte can wedge the others past the window, except a commit (see below).
- A claim and a release write only their own generation's slot, without the mutex (one
  system call per acquire, as a plain flock): a late one, by a process stopped for longer
  than the window, cannot undo a takeover, which writes the next generation's slot and the
  generation. The holder that lost the lock learns it from the page when its commit pins
  the lock (:meth:`StoreLock.pin`, under the mutex: from then on nobody may take it over),
  and its commit fails with 1007 transaction_too_old, as a FoundationDB transaction older
  than the window does. Serializability never depends on the lock: a transaction reads a
  SQLite snapshot and buffers its writes, and SQLite refuses to commit over a snapshot that
  another commit overtook (1020), so a takeover can only make a late commit fail.

What is not bounded: a holder stopped *during* its commit (pinned, holding SQLite's write
lock for those microseconds) or while opening the store blocks the others until it runs;
so does a process stopped while holding the page mutex (a committing holder keeps it from its
pin to its release, the commit's microseconds; a takeover a few microseconds), or while
SQLite's last close holds SQLite's own lock on the store file (:func:`.lockwait.sqlite_holder`
names it). A waiter that gives up says who holds the lock (:attr:`StoreLock.holder`: the pid,
whether it is stopped). A waiter thread blocked on the byte of a generation taken
over from a stopped process stays in the kernel, with its descriptor, until that process
resumes or dies.

Without OFD locks (not Linux) the lock is ``flock`` on the whole file, as before: a stopped
holder then blocks writers until ``lock_timeout`` and the layer retries.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import threading
import time

from fdbqueue.engines.limits import TRANSACTION_WINDOW_SECONDS
from fdbqueue.engines.sqlite.lockwait import _SLICE, WAKE_SLICE, WakeChannel, _stopped, _Waiter
from fdbqueue.engines.sqlite.page import (
    GEN_WORD,
    LEASE_BYTES,
    MUTEX_BYTE,
    SLOT_HALVES,
    SLOT_WORDS,
    WANTED_WORD,
    SharedPage,
)

#: ``struct flock`` on Linux: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks).
FLOCK = struct.Struct("hhqqi4x")
OFD = sys.platform.startswith("linux") and hasattr(fcntl, "F_OFD_SETLKW")
#: The window, in seconds: how long a waiter sees the page unchanged while the byte is held
#: before it takes the lock over (a module attribute, so that a test may shorten it).
WINDOW = TRANSACTION_WINDOW_SECONDS
# The start recorded by a holder that must not be taken over (opening, checkpointing a
# removed WAL, a commit: see StoreLock.pin): only transactions are bounded by the window.
_PINNED = 2**62


def _window() -> float:
    return WINDOW


def _pinned(state: tuple[int, int, int, int, int]) -> bool:
    gen, claimed, since, _, _ = state
    return claimed == gen and since == _PINNED


def _holder(state: tuple[int, int, int, int, int], seen_for: float) -> str:
    """Who holds the lock, as a waiter that gave up says it."""
    gen, claimed, since, pid, _ = state
    if claimed != gen or since == 0:
        return (
            f"a process holds it while the lock file's page says free (taking or handing it back; "
            f"unchanged for {seen_for:.1f} s)"
        )
    doing = "opening the store or committing" if since == _PINNED else "in a transaction"
    return f"process {pid} holds it ({doing}{_stopped(pid)}; unchanged for {seen_for:.1f} s)"


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


# The page mutex's requests, packed once: a commit takes it at its pin (StoreLock.pin), a takeover tries it.
# fcntl(2) and the OFD commands, looked up once: the hot calls (acquire, pin, release) run
# at every transaction. (Without OFD locks those paths are never taken: 0 stands in.)
_fcntl = fcntl.fcntl
_SETLK = getattr(fcntl, "F_OFD_SETLK", 0)
_SETLKW = getattr(fcntl, "F_OFD_SETLKW", 0)
_MUTEX_LOCK = byte_request(fcntl.F_WRLCK, MUTEX_BYTE)
_MUTEX_UNLOCK = byte_request(fcntl.F_UNLCK, MUTEX_BYTE)


#: What a transaction asks of one generation's lock (:func:`_requests`).
Requests = tuple[int, bytes, bytes, int, int]


def _requests(gen: int) -> Requests:
    """What a transaction asks of generation ``gen``'s lock: (gen, lock its byte, unlock the
    page mutex through its byte: see StoreLock.release, the word of its slot's generation
    and the half of its pid: page.SLOT_WORDS, page.SLOT_HALVES)."""
    return (
        gen,
        FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, LEASE_BYTES + gen, 1, 0),
        FLOCK.pack(fcntl.F_UNLCK, os.SEEK_SET, MUTEX_BYTE, LEASE_BYTES + gen - MUTEX_BYTE + 1, 0),
        SLOT_WORDS[gen & 1],
        SLOT_HALVES[gen & 1],
    )


def _byte_lock(fd: int, at: int, kind: int, wait: bool) -> bool:
    """An OFD lock of one byte; False when it is held elsewhere (``wait`` False)."""
    cmd = fcntl.F_OFD_SETLKW if wait else fcntl.F_OFD_SETLK
    try:
        # byte_request's struct, packed here: this runs four times a commit.
        fcntl.fcntl(fd, cmd, FLOCK.pack(kind, os.SEEK_SET, at, 1, 0))
    except (BlockingIOError, PermissionError):  # EAGAIN / EACCES: held by another description
        return False
    return True


class StoreLock:
    """The store lock of one process on one store file: its threads' half (:attr:`mutex`, held
    with :attr:`owner` set from the acquire to :meth:`release`) and the processes' half.

    :meth:`take` is a transaction's begin when nothing is in its way: both halves in one call.
    :meth:`acquire` is the processes' half only: callers take :attr:`mutex` first (one acquire
    at a time per process), as :class:`~fdbqueue.engines.sqlite.shared.SharedStore` does, and
    set :attr:`owner`; :meth:`release` releases both (a commit's one call). Used alone (no
    owner set), it is the processes' half only.
    """

    def __init__(self, fd: int, page: SharedPage, wake_path: str | None = None) -> None:
        self.mutex = threading.Lock()
        self.owner: int | None = None  # the thread holding the store lock
        self._fd = fd
        self._page = page
        # The page's native words and halves (SharedPage.words): the lease's fields that the
        # acquire, the pin and the release read and write, one item each (page.GEN_WORD).
        self._words = page.words
        self._halves = page.halves
        # What this process asks of the generation it holds (_requests: the generation, its
        # requests and its slot's fields), or None: the pin and the release look nothing up.
        self._held: Requests | None = None
        self._pinned = False  # pinned since the claim (pin): only release clears it
        self._waiters: dict[int, _Waiter] = {}
        self.holder = "another process holds it"  # who, after an acquire that timed out
        # The page as this process last saw it while waiting, and since when (its own
        # monotonic clock: no other process's clock takes part). Kept across acquires, so
        # that waits shorter than the window (lock_timeout, retried) still add up to it.
        self._seen: tuple[int, int, int, int, int] | None = None
        self._seen_at = self._looked = 0.0
        # The requests of the fast acquire (take) and of release, packed once per generation
        # (it moves only at a takeover): see _requests.
        self._requests: Requests = (-1, b"", b"", 0, 0)
        # The wake-up FIFO (WakeChannel, at wake_path): opened by the first wait, or by the
        # first release that finds the page's waiters' flag up. None until then, and where
        # it cannot be had (_no_channel: a waiter could not make or open it).
        self._wake_path = wake_path
        self._channel: WakeChannel | None = None
        self._no_channel = wake_path is None or not OFD
        self._woken = False  # waited on the channel since the last claim: see _hold

    # -- the page ----------------------------------------------------------------------------

    def _read(self) -> tuple[int, int, int]:
        """(generation, its holder's start - 0 when the page says free -, the last claimer's pid)."""
        gen, claimed, since, pid, _ = self._page.lease()
        return gen, since if claimed == gen else 0, pid

    def _write(self, gen: int, since: int) -> None:
        """Record a claim of ``gen`` in its slot (a new claim: the claims counter moves on)."""
        page = self._page
        page.set_slot[gen & 1](gen, since, _pid, (page.slot[gen & 1]()[3] + 1) & 0xFFFFFFFF)

    def _locked_page(self) -> _PageMutex:
        return _PageMutex(self._fd)

    # -- acquire / release -------------------------------------------------------------------

    def acquire(self, timeout: float, stealable: bool) -> str | None:
        """Take the lock; None, or "another process" when not within ``timeout`` seconds
        (then :attr:`holder` says who, as far as the page tells).

        ``stealable``: a transaction, which another process may take the lock from once it
        outlived the window; otherwise (opening, recovery) nobody may.
        """
        if not OFD:
            return self._acquire_flock(timeout)
        if stealable:
            # The common case first, in one call: no waiter of this process on the current
            # generation and its byte free (the loop below does the same, and everything else).
            gen = self._words[GEN_WORD]
            if gen not in self._waiters:
                requests = self._requests
                if requests[0] != gen:
                    requests = self._requests = _requests(gen)
                try:
                    _fcntl(self._fd, _SETLK, requests[1])  # _byte_lock's
                except (BlockingIOError, PermissionError):  # held by another description: wait below
                    pass
                else:
                    # _claim is a method of its own, looked up at each call: a test stops a
                    # process inside it (tests/engines/sqlite/test_stalls.py).
                    if self._claim(gen, True):
                        self._seen = None
                        return None
        deadline = time.monotonic() + timeout
        while True:
            state = self._page.lease()
            gen = state[0]
            waiter = self._waiters.get(gen)
            free = waiter is None or not waiter.blocking
            if free and _byte_lock(self._fd, LEASE_BYTES + gen, fcntl.F_WRLCK, False):
                if self._claim(gen, stealable):
                    self._seen = None
                    return None
                continue
            now = time.monotonic()
            if state != self._seen or now - self._looked > _window():
                # A new claim, a release, a takeover (the holder is alive), or this process
                # stopped looking for a while: the window starts again.
                self._seen, self._seen_at = state, now
            elif now - self._seen_at > _window() and not _pinned(state) and self._take_over(state, stealable):
                self._seen = None
                return None
            self._looked = now
            seen_at = self._seen_at
            left = deadline - now
            if left <= 0:
                self.holder = _holder(state, now - seen_at)
                if self._woken:  # a wake-up this waiter took is passed on (see _hold)
                    self._woken = False
                    self._words[WANTED_WORD] = 1
                    self._wake_one()
                return "another process"
            # Until the window ends for what we see, or a slice: the page may move on meanwhile.
            until_window = seen_at + _window() - now + 0.01
            wait = min(left, _SLICE, max(until_window, 0.0))
            channel = self._wake(True) if free else None
            if channel is not None:
                # The flag up first, then one more try: a release before the flag was up
                # wrote nothing, and one after it finds the flag and wakes a waiter.
                self._words[WANTED_WORD] = 1
                if _byte_lock(self._fd, LEASE_BYTES + gen, fcntl.F_WRLCK, False):
                    if self._claim(gen, stealable):
                        self._seen = None
                        return None
                    continue
                self._woken = True
                channel.wait(min(wait, WAKE_SLICE))
                continue
            granted = self._waiter(gen).wait(wait)
            if granted and self._claim(gen, stealable):
                self._seen = None
                return None
            self._forget_old(gen)

    def take(self, me: int) -> bool:
        """A transaction's begin, its common case in one call: the thread mutex free, no
        waiter of this process on the current generation and its byte free; then the claim
        recorded (as :meth:`_claim` records it) and ``me`` the :attr:`owner`. False, with
        nothing taken, in every other case: the caller then waits through
        :meth:`SharedStore.acquire <fdbqueue.engines.sqlite.shared.SharedStore.acquire>`,
        which does the same and everything else (waiting, taking over).

        The byte is locked through the module's ``_fcntl``, looked up at each call: a test
        stops a process right after it (tests/engines/sqlite/test_stalls.py), the moment the
        byte is held while the page does not say so yet."""
        mutex = self.mutex
        if not mutex.acquire(False):
            return False
        try:
            words = self._words
            gen = words[GEN_WORD]
            if OFD and gen not in self._waiters:
                requests = self._requests
                if requests[0] != gen:
                    requests = self._requests = _requests(gen)
                try:
                    _fcntl(self._fd, _SETLK, requests[1])  # _byte_lock's
                except (BlockingIOError, PermissionError):  # held by another description
                    pass
                else:
                    # _claim's (stealable) writes, field by field in the slot's order:
                    # generation, since, pid, claims moved on. No page mutex: see _claim.
                    at, half = requests[3], requests[4]
                    halves = self._halves
                    words[at] = gen
                    words[at + 1] = time.monotonic_ns() // 1000
                    halves[half] = _pid
                    halves[half + 1] = (halves[half + 1] + 1) & 0xFFFFFFFF
                    if words[GEN_WORD] == gen:
                        self._held = requests
                        self._pinned = False
                        self._seen = None
                        self.owner = me
                        return True
                    # The generation moved on meanwhile (a takeover): the byte handed back.
                    _byte_lock(self._fd, LEASE_BYTES + gen, fcntl.F_UNLCK, False)
        except BaseException:
            mutex.release()
            raise
        mutex.release()
        return False

    def _claim(self, gen: int, stealable: bool) -> bool:
        """Holding byte ``gen``: record the claim in the generation's slot, unless the
        generation moved on (then the byte is handed back).

        No page mutex for a transaction (one system call per acquire, as a plain flock): the
        claim only writes the slot of its own generation, never the generation, so a claim
        made late - by a process stopped between taking the byte and this write, which a
        waiter took over from - cannot undo the takeover; if the takeover lands between
        this write and the check below, this holder's commit fails at :meth:`pin`, which
        compares the generation under the mutex. A holder that is never taken over
        (opening, recovery: it does not pin) claims under the mutex.
        """
        if stealable:
            # _write(gen, _now_us()) inline, field by field in the slot's order (generation,
            # since, pid, claims moved on), as take writes it.
            words, halves = self._words, self._halves
            at, half = SLOT_WORDS[gen & 1], SLOT_HALVES[gen & 1]
            words[at] = gen
            words[at + 1] = time.monotonic_ns() // 1000
            halves[half] = _pid
            halves[half + 1] = (halves[half + 1] + 1) & 0xFFFFFFFF
            current = words[GEN_WORD]
        else:
            with self._locked_page():
                current = self._page.generation()[0]
                if current == gen:
                    self._write(gen, _PINNED)
        if current == gen:
            self._hold(gen)
            return True
        _byte_lock(self._fd, LEASE_BYTES + gen, fcntl.F_UNLCK, False)
        return False

    def _hold(self, gen: int) -> None:
        """Generation ``gen`` claimed: what the pin and the release ask of it, kept.

        A claim after waiting on the wake-up channel raises the waiters' flag: the release
        that cleared it woke one waiter only, and others may still wait."""
        if self._woken:
            self._woken = False
            self._words[WANTED_WORD] = 1
        requests = self._requests
        if requests[0] != gen:
            requests = self._requests = _requests(gen)
        self._held = requests
        self._pinned = False

    def _take_over(self, seen: tuple[int, int, int, int, int], stealable: bool) -> bool:
        """The page has not moved for the window while someone held the byte: a holder
        stalled inside its transaction, or a process stopped between taking the byte and
        recording (or clearing) its claim. Move the lock to the next generation."""
        gen = seen[0]
        # Tried, not waited for: a holder that pinned since we looked keeps the mutex through
        # its commit (pin), and may be stopped there; the loop then looks at the page again.
        if not _byte_lock(self._fd, MUTEX_BYTE, fcntl.F_WRLCK, False):
            return False
        try:
            if self._page.lease() != seen:
                return False  # claimed, released or taken over meanwhile
            if not _byte_lock(self._fd, LEASE_BYTES + gen + 1, fcntl.F_WRLCK, False):
                return False  # a process still on an older page view: try again
            self._write(gen + 1, _now_us() if stealable else _PINNED)  # the slot first, then
            self._page.set_generation(gen + 1)  # the generation that points at it
            self._hold(gen + 1)
        finally:
            fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _MUTEX_UNLOCK)
        self._forget_old(gen + 1)
        return True

    def _wake(self, create: bool) -> WakeChannel | None:
        """The wake-up channel, opened at the first call (made if ``create``); None where
        there is none (no path, not Linux, the FIFO cannot be made): waiters then block
        through a helper thread (_waiter). A release opens it without making it: one that
        finds the flag up finds the FIFO that the waiter made, as a rule."""
        channel = self._channel
        if channel is None and not self._no_channel and self._wake_path is not None:
            channel = self._channel = WakeChannel.open(self._wake_path, create)
            self._no_channel = channel is None and create
        return channel

    def _wake_one(self) -> None:
        channel = self._wake(False)
        if channel is not None:
            channel.wake()

    def _waiter(self, gen: int) -> _Waiter:
        waiter = self._waiters.get(gen)
        if waiter is None:
            at = LEASE_BYTES + gen
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

        A pin that succeeds keeps the page mutex until :meth:`release`, which drops it with
        the lease's byte in one call: three system calls a writing transaction (take the
        byte, the mutex; drop both), not four. Nothing else waits on the mutex meanwhile: a
        takeover only tries it (:meth:`_take_over`, and never of a pinned holder, which the
        slot already says), and a claim that is never taken over (opening, recovery) holds
        the lease's byte first, which a pinned holder has.
        """
        held = self._held
        if held is None:
            return not OFD  # (without OFD locks there is no lease to lose)
        gen, _, _, at, half = held
        fd, words = self._fd, self._words
        # The page mutex (as _PageMutex), its request packed once: this runs at every commit.
        _fcntl(fd, _SETLKW, _MUTEX_LOCK)
        if words[GEN_WORD] != gen:
            _fcntl(fd, _SETLK, _MUTEX_UNLOCK)
            return False
        # The slot as this holder's pinned claim (its claims counter left as it is).
        words[at] = gen
        words[at + 1] = _PINNED
        self._halves[half] = _pid
        self._pinned = True
        return True

    def release(self) -> None:
        """Release the processes' half, then the threads' when it was taken (:attr:`owner` set:
        :attr:`mutex` held since the acquire): one call at a commit's end."""
        owner, self.owner = self.owner, None
        held, self._held = self._held, None
        try:
            if held is not None:
                gen, _, unlock, at, half = held
                # The slot only, without the mutex: a takeover writes the next generation's
                # slot and the generation, never this slot, so nothing here can undo one.
                # Pinned (a commit), nobody took the lock over since (the page mutex is still
                # held): the slot is this claim's, or a late claim of an older generation of
                # its parity wrote it (storelock's docstring), which the generation already
                # says is not the current one's, so "released" is no news to anyone.
                words = self._words
                if self._pinned:
                    self._pinned = False
                    words[at + 1] = 0  # since: released (the rest of the slot stays this claim's)
                elif words[at] == gen and self._halves[half] == _pid:
                    words[at + 1] = 0
                # One unlock from the page mutex (held since pin, if this holder committed) to
                # the lease's byte: an unlock neither waits nor is refused, and drops only this
                # open file description's locks in the range. The only others it can hold there
                # are older generations' bytes that a waiter thread got late and is handing back
                # anyway (_Waiter): a later unlock of a byte not held is a no-op.
                _fcntl(self._fd, _SETLK, unlock)
                # After the unlock: a waiter raises the flag before its last try, so one that
                # failed it raised the flag before this release could see it (fcntl(2)'s
                # locks are taken and dropped under the kernel's lock of the file's locks).
                if words[WANTED_WORD]:
                    words[WANTED_WORD] = 0
                    self._wake_one()
            elif not OFD:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
        finally:
            if owner is not None:
                self.mutex.release()

    def close(self) -> None:
        channel, self._channel, self._no_channel = self._channel, None, True
        if channel is not None:
            channel.close()
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
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLKW, _MUTEX_LOCK)

    def __exit__(self, *exc: object) -> None:
        fcntl.fcntl(self._fd, fcntl.F_OFD_SETLK, _MUTEX_UNLOCK)
