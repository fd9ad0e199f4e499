"""The store lock's wake-up channel (engines/sqlite/lockwait.py WakeChannel, storelock.py): a
waiter waits on a FIFO in its own thread and a release with the waiters' flag up wakes one, so
that a hand-off between processes costs no helper thread. Open file descriptions in one process
stand for processes (OFD locks conflict between descriptions, as between processes)."""

from __future__ import annotations

import mmap
import os
import stat
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdbqueue.engines.sqlite import storelock as _storelock
from fdbqueue.engines.sqlite.page import WANTED_WORD, SharedPage
from fdbqueue.engines.sqlite.storelock import StoreLock

pytestmark = pytest.mark.skipif(not _storelock.OFD, reason="open-file-description locks are Linux's")


def _make(tmp_path: Path, n: int, wake: str | None) -> tuple[list[StoreLock], list[mmap.mmap], list[int]]:
    path = tmp_path / "q.db-lock"
    if not path.exists():
        path.write_bytes(bytes(4096))
    fds = [os.open(path, os.O_RDWR) for _ in range(n)]
    pages = [mmap.mmap(fd, 4096) for fd in fds]
    return [StoreLock(fd, SharedPage(p), wake) for fd, p in zip(fds, pages, strict=True)], pages, fds


@pytest.fixture
def locks(tmp_path: Path) -> Iterator[list[StoreLock]]:
    made, pages, fds = _make(tmp_path, 4, str(tmp_path / "q.db-wake"))
    yield made
    for lock, page, fd in zip(made, pages, fds, strict=True):
        lock.close()
        lock._page.release()
        page.close()
        os.close(fd)


@pytest.fixture
def no_slice(monkeypatch: pytest.MonkeyPatch) -> None:
    """A waiter on the channel looks again only when woken (or after 30 s): a wake-up lost
    shows as a wait of 30 s."""
    monkeypatch.setattr(_storelock, "WAKE_SLICE", 30.0)
    monkeypatch.setattr(_storelock, "_SLICE", 30.0)


def _helpers() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fdbqueue-lock-")]


def test_a_release_wakes_a_waiter_through_the_fifo_without_a_helper_thread(
    locks: list[StoreLock], tmp_path: Path, no_slice: None
) -> None:
    a, b, _, _ = locks
    assert a.acquire(1.0, stealable=True) is None
    got: list[str | None] = []
    waiter = threading.Thread(target=lambda: got.append(b.acquire(20.0, stealable=True)))
    started = time.monotonic()
    waiter.start()
    time.sleep(0.1)
    assert a._words[WANTED_WORD] == 1  # b waits, and said so
    assert stat.S_ISFIFO(os.stat(tmp_path / "q.db-wake").st_mode)
    a.release()
    waiter.join(10.0)
    assert got == [None] and time.monotonic() - started < 5.0  # woken by the release's byte
    assert not _helpers()  # no thread blocked in the kernel for it
    b.release()
    assert a._words[WANTED_WORD] == 0  # nobody waits any more: b's release wrote nothing
    assert a.acquire(0.0, stealable=True) is None
    a.release()


def test_no_wake_up_is_lost_among_four_waiting_processes(locks: list[StoreLock], no_slice: None) -> None:
    """Each release wakes one waiter only; the flag comes up again (a waiter that failed its
    try, a claim after a wait: StoreLock._hold) so that none is left waiting while the lock is
    free. A lost wake-up shows as a wait of seconds (until the window's look at the page)."""
    rounds = 60
    counts = [0] * len(locks)
    inside = [0]
    longest = [0.0]

    def run(i: int) -> None:
        lock = locks[i]
        for _ in range(rounds):
            started = time.monotonic()
            assert lock.acquire(20.0, stealable=True) is None
            longest[0] = max(longest[0], time.monotonic() - started)
            inside[0] += 1
            assert inside[0] == 1  # one holder at a time
            time.sleep(0.0005)
            inside[0] -= 1
            counts[i] += 1
            lock.release()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(locks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60.0)
    assert counts == [rounds] * len(locks)
    assert longest[0] < 1.0, f"a waiter waited {longest[0]:.1f} s: a wake-up was lost"


def test_a_release_just_before_the_flag_is_up_is_not_missed(
    locks: list[StoreLock], no_slice: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The holder releases after b's first try and before b raised the flag (so the release
    wrote nothing): b's try after raising the flag gets the lock, it does not wait."""
    a, b, _, _ = locks
    assert a.acquire(1.0, stealable=True) is None
    opened = StoreLock._wake

    def release_first(self: StoreLock, create: bool) -> object:
        if self is b and a._held is not None:
            a.release()  # the flag is not up yet: nobody is woken
        return opened(self, create)

    monkeypatch.setattr(StoreLock, "_wake", release_first)
    started = time.monotonic()
    assert b.acquire(20.0, stealable=True) is None
    assert time.monotonic() - started < 1.0
    b.release()


def test_a_waiter_that_gives_up_after_a_wake_up_passes_it_on(locks: list[StoreLock]) -> None:
    """A waiter that took a wake-up (a byte meant for someone, the flag cleared by the release
    that wrote it) and then gives up (lock_timeout) raises the flag and writes a byte: another
    waiter is not left without one."""
    a, b, c, _ = locks
    assert a.acquire(1.0, stealable=True) is None
    channel = c._wake(True)
    assert channel is not None
    b._woken = True  # as after a wait on the channel
    a._words[WANTED_WORD] = 0  # as the release that woke it left it
    assert b.acquire(0.0, stealable=True) == "another process"
    assert a._words[WANTED_WORD] == 1
    assert os.read(channel.fd, 16) == b"w"
    a.release()


def test_without_a_fifo_waiters_wait_through_a_helper_thread(tmp_path: Path) -> None:
    """A FIFO that cannot be made (here: its directory is missing; also a read-only one,
    a file system without FIFOs) leaves the waiting as it was."""
    made, pages, fds = _make(tmp_path, 2, str(tmp_path / "missing" / "q.db-wake"))
    a, b = made
    try:
        assert a.acquire(1.0, stealable=True) is None
        got: list[str | None] = []
        waiter = threading.Thread(target=lambda: got.append(b.acquire(10.0, stealable=True)))
        waiter.start()
        time.sleep(0.1)
        assert _helpers()  # b's helper, blocked in the kernel on the byte
        assert a._words[WANTED_WORD] == 0
        a.release()
        waiter.join(10.0)
        assert got == [None]
        b.release()
    finally:
        for lock, page, fd in zip(made, pages, fds, strict=True):
            lock.close()
            lock._page.release()
            page.close()
            os.close(fd)
