"""The store lock's lease (engines/sqlite/storelock.py), two open file descriptions in one process
standing for two processes (OFD locks conflict between descriptions, as between processes)."""

from __future__ import annotations

import fcntl
import mmap
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fdbqueue.engines.sqlite import storelock as _storelock
from fdbqueue.engines.sqlite.page import LEASE, LEASE_BYTES, SharedPage
from fdbqueue.engines.sqlite.storelock import StoreLock

pytestmark = pytest.mark.skipif(not _storelock.OFD, reason="open-file-description locks are Linux's")


@pytest.fixture(params=["helper thread", "wake-up channel"])
def locks(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[list[StoreLock]]:
    """Three locks on one lock file; waiting through a helper thread blocked in the kernel
    (no wake-up channel), or on the wake-up FIFO (lockwait.WakeChannel): every guarantee
    holds both ways."""
    path = tmp_path / "q.db-lock"
    path.write_bytes(bytes(4096))
    wake = str(tmp_path / "q.db-wake") if request.param == "wake-up channel" else None
    fds = [os.open(path, os.O_RDWR) for _ in range(3)]
    pages = [mmap.mmap(fd, 4096) for fd in fds]
    made = [StoreLock(fd, SharedPage(page), wake) for fd, page in zip(fds, pages, strict=True)]
    yield made
    for lock in made:
        lock.close()
        lock._page.release()  # its views of the mapping, before the mapping is closed
    for page, fd in zip(pages, fds, strict=True):
        page.close()
        os.close(fd)


@pytest.fixture
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    """The window is 0.5 s instead of 5 (the waiter measures it on its own clock)."""
    monkeypatch.setattr(_storelock, "WINDOW", 0.5)


def test_a_holder_past_the_window_is_taken_over_and_cannot_pin(
    locks: list[StoreLock], short_window: None
) -> None:
    a, b, _ = locks
    assert a.acquire(1.0, stealable=True) is None
    assert b.acquire(0.3, stealable=True) == "another process"  # young: waited for
    assert b.acquire(1.0, stealable=True) is None  # unchanged for the window: taken over
    assert not a.pin()  # a's commit fails with 1007
    assert b.pin()
    a.release()  # releases only its old byte; b keeps the lock
    assert locks[2].acquire(0.3, stealable=True) == "another process"
    b.release()
    assert locks[2].acquire(1.0, stealable=True) is None


def test_a_pinned_holder_is_never_taken_over(locks: list[StoreLock], short_window: None) -> None:
    a, b, _ = locks
    assert a.acquire(1.0, stealable=True) is None
    assert a.pin()
    assert b.acquire(1.5, stealable=True) == "another process"  # three windows: pinned
    assert "committing" in b.holder and str(os.getpid()) in b.holder
    a.release()
    assert b.acquire(1.0, stealable=True) is None


def test_a_waiter_handing_back_a_lock_never_drops_one_its_process_took(locks: list[StoreLock]) -> None:
    """b gives up waiting (its helper thread still blocked in the kernel), a releases, b's
    thread gets the byte and hands it back; b acquiring meanwhile through the same open file
    description must end up really holding it: c cannot get it."""
    a, b, c = locks
    for _ in range(20):
        assert a.acquire(1.0, stealable=True) is None
        assert b.acquire(0.05, stealable=True) == "another process"
        a.release()
        assert b.acquire(2.0, stealable=True) is None
        time.sleep(0.01)  # let a stale hand-back run, if one is due
        assert c.acquire(0.05, stealable=True) == "another process", "b's lock was dropped under it"
        b.release()


def test_the_lease_lives_in_the_lock_page(locks: list[StoreLock]) -> None:
    a, _, _ = locks
    assert a.acquire(1.0, stealable=True) is None
    gen, since, pid = a._read()
    assert since > 0 and pid == os.getpid() and LEASE.offset == 192
    a.release()
    assert a._read()[:2] == (gen, 0)


def test_a_byte_held_with_the_page_saying_free_is_taken_over_after_the_window(
    locks: list[StoreLock], short_window: None
) -> None:
    """Issue 26, item 12: a holds the byte but was stopped before its claim reached the page
    (or after its release cleared it): b takes over once the page stood still for the
    window, and a's late claim cannot undo that: it hands the byte back."""
    a, b, c = locks
    gen = a._read()[0]
    assert _storelock._byte_lock(a._fd, LEASE_BYTES + gen, fcntl.F_WRLCK, False)
    assert a._read()[1] == 0  # the page says free
    assert b.acquire(0.2, stealable=True) == "another process"
    assert "says free" in b.holder
    assert b.acquire(1.0, stealable=True) is None
    assert b._read()[0] == gen + 1
    assert not a._claim(gen, stealable=True)  # a resumes: the generation moved on
    assert a._read()[:2] == (gen + 1, b._read()[1]) and b.pin()
    assert c.acquire(0.2, stealable=True) == "another process"  # b holds it, nobody else
    b.release()
    assert c.acquire(1.0, stealable=True) is None
    c.release()


def test_a_late_release_does_not_free_a_lock_taken_over(locks: list[StoreLock], short_window: None) -> None:
    """a is taken over while holding; its release afterwards clears only its own slot."""
    a, b, c = locks
    assert a.acquire(1.0, stealable=True) is None
    assert b.acquire(2.0, stealable=True) is None  # after the window
    a.release()
    assert b._read()[1] != 0 and b.pin()
    assert c.acquire(0.2, stealable=True) == "another process"
    b.release()


def test_eight_writers_under_random_sigstops_lose_and_double_nothing() -> None:
    """Issue 26's harness, short (scripts/storelock_stops.py runs it long): 8 processes
    commit read-modify-write transactions while writers are SIGSTOPped at random moments for
    up to 1.5 s: no acknowledged commit lost, no increment lost or applied twice, and no live
    writer waits past the window."""
    from scripts.storelock_stops import run

    r = run(3.0, writers=8)
    assert r.commits > 0 and r.stops > 0, r
    assert (r.lost, r.doubled) == (0, 0), r
    assert r.longest_wait < _storelock.WINDOW + 1.0, r


def test_a_pin_keeps_the_page_mutex_until_release_which_drops_it_with_the_lease(
    locks: list[StoreLock],
) -> None:
    """Issue 30: a commit's pin keeps the page mutex through the commit and its release drops
    both at once (three system calls a writing transaction, not four). Meanwhile a takeover
    only tries the mutex, never waits for it (the holder may be stopped in its commit)."""
    a, b, _ = locks
    mutex = _storelock.MUTEX_BYTE
    assert a.acquire(1.0, stealable=True) is None and a.pin()
    assert not _storelock._byte_lock(b._fd, mutex, fcntl.F_WRLCK, False)  # a's, through its commit
    started = time.monotonic()
    assert not b._take_over(b._page.lease(), True)  # tried, not waited for
    assert time.monotonic() - started < 0.5
    a.release()
    assert _storelock._byte_lock(b._fd, mutex, fcntl.F_WRLCK, False)  # released with the lease
    _storelock._byte_lock(b._fd, mutex, fcntl.F_UNLCK, False)
    assert b.acquire(1.0, stealable=True) is None and b.pin()
    b.release()
    assert a.acquire(1.0, stealable=True) is None  # b's byte went too
    a.release()


def test_a_pinned_release_leaves_the_slot_released_even_after_a_late_claim_wrote_it(
    locks: list[StoreLock],
) -> None:
    """Issue 30, eighth pass: a release after a pin (a commit) writes its slot's "released"
    without reading the slot first, nobody having been able to take the lock over since. A late
    claim of an older generation of the same parity (a process stopped past the window between
    its byte and its claim) may still write the slot meanwhile: the page then reads free, and the
    next holders take the lock and release it as usual."""
    a, b, c = locks
    a._page.set_generation(4)  # as after takeovers: an older generation of its parity exists
    assert a.acquire(1.0, stealable=True) is None and a.pin()
    gen, claimed, since, pid, _ = a._page.lease()
    assert (claimed, since, pid) == (gen, _storelock._PINNED, os.getpid())
    a._page.set_slot[gen & 1](gen - 2, 12345, 999_999, 7)  # a late claim of gen - 2, as it writes it
    a.release()
    assert a._page.lease()[1:3] == (gen - 2, 0)  # not this generation's claim: free
    assert b.acquire(0.5, stealable=True) is None  # the byte went with the release
    assert c.acquire(0.05, stealable=True) == "another process"
    assert b._page.lease()[:2] == (gen, gen) and b._page.lease()[2] > 0  # b's claim
    b.release()
    assert a._page.lease()[2] == 0  # unpinned, its own claim: released
    assert c.acquire(0.5, stealable=True) is None and c.pin()
    c.release()
    assert c._page.lease()[1:3] == (gen, 0)
