"""Issue 13, item 9: a stalled transaction must not block the embedded store.

A process SIGSTOPped inside ``q.dequeue(tr)`` holds the store lock (and SQLite's write lock)
for as long as it is stopped, so every other process's enqueue, on any queue, waits
forever (the layer retries 1037). Required: the 5-second transaction window bounds it -
another process proceeds after about 5 s, and the stopped one's commit fails with 1007
once it resumes, nothing lost or duplicated (the store lock is a lease: engines/sqlite/storelock.py).
"""

from __future__ import annotations

import fcntl
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
import fdbqueue.engines.versions
from fdbqueue import Queue
from fdbqueue.engines.sqlite.page import LEASE_BYTES
from tests.support.processes import Children, real_clock

__all__ = ["real_clock"]


def stalled_dequeuer(url: str, outdir: str, hold: float, ready: Any) -> None:
    """Dequeue from ``jobs`` in one transaction, say so, then sleep ``hold`` s inside it
    (to be SIGSTOPped, or as a slow handler)."""
    db = fdbqueue.open(url)
    q = Queue("jobs")
    tr = db.create_transaction()
    try:
        m = q.dequeue(tr)
        assert m is not None
        ready.set()
        time.sleep(hold)  # the parent stops this process here
        tr.commit()
        outcome = "committed"
    except fdbqueue.QueueError as exc:
        outcome = f"{type(exc).__name__} {getattr(exc, 'code', '')}"
    Path(outdir, "outcome").write_text(outcome)


def test_a_stopped_transaction_does_not_block_other_processes(tmp_path: Path, real_clock: None) -> None:
    url = f"sqlite://{tmp_path}/q.db?lock_timeout=2"
    db = fdbqueue.open(url)
    jobs, other = Queue("jobs"), Queue("other")
    jobs.enqueue(db, b"the job")
    children = Children()
    child = children.start("dequeuer", stalled_dequeuer, url, str(tmp_path), 1.0, ready=True)
    t: threading.Thread | None = None
    try:
        assert child.ready.wait(30), "the child never dequeued"
        os.kill(child.proc.pid, signal.SIGSTOP)
        done: list[object] = []
        t = threading.Thread(target=lambda: done.append(other.enqueue(db, b"meanwhile")), daemon=True)
        start = time.monotonic()
        t.start()
        t.join(9)
        waited = time.monotonic() - start
        assert done, f"an enqueue on another queue still waits after {waited:.1f} s behind a stopped process"
        os.kill(child.proc.pid, signal.SIGCONT)
        child.proc.join(30)
        assert (tmp_path / "outcome").read_text() == "EngineError 1007"
        # Nothing lost or duplicated: the job is still there, once; the other message too.
        assert jobs.size(db) == 1 and other.size(db) == 1
        m = jobs.dequeue(db)
        assert m is not None and m.payload == b"the job" and jobs.dequeue(db) is None
    finally:
        if child.proc.is_alive():
            os.kill(child.proc.pid, signal.SIGCONT)
        children.stop()  # SIGKILL: the kernel releases its locks, so a waiting enqueue ends
        if t is not None:
            t.join(30)
        db.close()


def against_a_holder(tmp_path: Path, hold: float) -> tuple[float, str, int, int]:
    """Another process dequeues ``jobs`` in a transaction of ``hold`` seconds while this one
    enqueues on ``other``: (seconds that enqueue waited, the holder's outcome, the sizes of
    jobs and other afterwards)."""
    url = f"sqlite://{tmp_path}/q.db?lock_timeout=30"
    db = fdbqueue.open(url)
    jobs, other = Queue("jobs"), Queue("other")
    jobs.enqueue(db, b"the job")
    children = Children()
    child = children.start("dequeuer", stalled_dequeuer, url, str(tmp_path), hold, ready=True)
    try:
        assert child.ready.wait(30), "the child never dequeued"
        start = time.monotonic()
        other.enqueue(db, b"meanwhile")
        waited = time.monotonic() - start
        child.proc.join(30)
        return waited, (tmp_path / "outcome").read_text(), jobs.size(db), other.size(db)
    finally:
        children.stop()
        db.close()


def test_a_transaction_running_past_the_window_loses_the_lock_to_a_waiting_process(
    tmp_path: Path, real_clock: None
) -> None:
    """A live 6.5-second transaction (a slow exactly-once handler): another process's enqueue
    waits about 5 s, not 6.5, and the slow one's commit fails with 1007, applying nothing."""
    waited, outcome, jobs, other = against_a_holder(tmp_path, 6.5)
    assert waited < 6.2, f"the enqueue waited {waited:.1f} s: the whole slow transaction"
    assert outcome == "EngineError 1007"
    assert (jobs, other) == (1, 1)


def test_a_transaction_inside_the_window_keeps_the_lock(tmp_path: Path, real_clock: None) -> None:
    """A holder younger than the window is waited for, and commits."""
    waited, outcome, jobs, other = against_a_holder(tmp_path, 2.0)
    assert waited > 1.0  # it waited for the holder
    assert outcome == "committed"
    assert (jobs, other) == (0, 1)


def test_a_fake_clock_in_one_process_takes_no_lock_over(
    tmp_path: Path, real_clock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The lease runs on CLOCK_MONOTONIC itself: a test's fake clock an hour ahead in this
    process must not make another process's young holder look expired."""
    url = f"sqlite://{tmp_path}/q.db?lock_timeout=0.5"
    db = fdbqueue.open(url)
    Queue("jobs").enqueue(db, b"the job")
    children = Children()
    child = children.start("dequeuer", stalled_dequeuer, url, str(tmp_path), 2.0, ready=True)
    try:
        assert child.ready.wait(30), "the child never dequeued"
        monkeypatch.setattr(fdbqueue.engines.versions, "_ahead_us", 3_600_000_000)
        tr = db.create_transaction()
        with pytest.raises(fdbqueue.EngineError) as err:
            tr.get(b"anything")
        assert err.value.code == 1037
        tr.cancel()
        child.proc.join(30)
        assert (tmp_path / "outcome").read_text() == "committed"
    finally:
        children.stop()
        db.close()


# -- SQLite's write lock is never held across user code ----------------------------------------


def test_an_open_transaction_with_writes_does_not_hold_sqlites_write_lock(tmp_path: Path) -> None:
    """Writes wait in memory until commit: another connection may write meanwhile."""
    db = fdbqueue.open(f"sqlite://{tmp_path}/q.db")
    tr = db.create_transaction()
    tr.set(b"mine", b"1")
    assert tr.get(b"mine") == b"1"
    other = sqlite3.connect(str(tmp_path / "q.db"), timeout=0, isolation_level=None)
    try:
        other.execute("BEGIN IMMEDIATE")  # "database is locked" while SQLite's write lock is held
        other.execute("ROLLBACK")
    finally:
        other.close()
    tr.commit()
    assert db.get(b"mine") == b"1"
    db.close()


def test_a_commit_over_a_stale_snapshot_fails_not_committed(tmp_path: Path) -> None:
    """Another connection committed after this transaction read: 1020, nothing applied.

    (Within fdbqueue only a transaction that lost the store lock can meet this.)
    """
    db = fdbqueue.open(f"sqlite://{tmp_path}/q.db")
    db.set(b"k", b"0")
    tr = db.create_transaction()
    assert tr.get(b"k") == b"0"
    other = sqlite3.connect(str(tmp_path / "q.db"), timeout=5, isolation_level=None)
    try:
        other.execute("UPDATE kv SET v = x'31' WHERE k = x'6b'")
    finally:
        other.close()
    tr.set(b"k", b"2")
    with pytest.raises(fdbqueue.EngineError) as info:
        tr.commit()
    assert info.value.code == 1020 and not info.value.maybe_committed
    assert db.get(b"k") == b"1"
    db.close()


# -- a process stopped between taking the lock byte and recording its claim -----------------------


def stopped_at_the_claim(url: str, outdir: str) -> None:
    """Open the store, then SIGSTOP this process at its next claim of the store lock: the
    moment it holds the lock byte and the page does not say so yet (a waiter thread that
    just took the byte, or the non-blocking path), then enqueue once resumed."""
    from fdbqueue.engines.sqlite import storelock as _storelock

    db = fdbqueue.open(url)
    claim = _storelock.StoreLock._claim
    lock_byte = _storelock._fcntl
    stops = [True]

    def stop() -> None:
        if stops:
            stops.pop()
            os.kill(os.getpid(), signal.SIGSTOP)

    def stop_then_claim(self: _storelock.StoreLock, gen: int, stealable: bool) -> bool:
        stop()  # the byte taken by the waiting way (StoreLock.acquire), the claim not written yet
        return claim(self, gen, stealable)

    def lock_then_stop(fd: int, cmd: int, arg: bytes) -> object:
        out = lock_byte(fd, cmd, arg)
        kind, _, start, _, _ = _storelock.FLOCK.unpack(arg)
        if cmd == _storelock._SETLK and kind == fcntl.F_WRLCK and start >= LEASE_BYTES:
            stop()  # the byte taken by a begin's one call (StoreLock.take), the claim not written yet
        return out

    _storelock.StoreLock._claim = stop_then_claim  # type: ignore[method-assign]
    _storelock._fcntl = lock_then_stop
    try:
        Queue("jobs").enqueue(db, b"from the stopped one")
        outcome = "committed"
    except fdbqueue.QueueError as exc:
        outcome = f"{type(exc).__name__} {getattr(exc, 'code', '')}"
    Path(outdir, "outcome").write_text(outcome)
    db.close()


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_process_stopped_as_it_takes_the_lock_byte_is_taken_over_after_the_window(
    tmp_path: Path, real_clock: None
) -> None:
    """Issue 26, item 12: a process stopped after it took the lock byte and before the page
    records its claim (the page says "free", the byte is held) must not hold the others up
    past the 5-second window; once resumed, its enqueue still lands, once."""
    url = f"sqlite://{tmp_path}/q.db?lock_timeout=9"
    db = fdbqueue.open(url)
    jobs = Queue("jobs")
    jobs.enqueue(db, b"before")
    children = Children()
    t: threading.Thread | None = None
    child = children.start("stopped", stopped_at_the_claim, url, str(tmp_path))
    try:
        deadline = time.monotonic() + 30
        while not stopped(child.proc.pid):
            assert time.monotonic() < deadline and child.proc.is_alive(), "the child never stopped"
            time.sleep(0.01)
        done: list[object] = []
        t = threading.Thread(target=lambda: done.append(jobs.enqueue(db, b"meanwhile")), daemon=True)
        start = time.monotonic()
        t.start()
        t.join(6.5)
        waited = time.monotonic() - start
        assert done, f"an enqueue still waits after {waited:.1f} s behind a process stopped at its claim"
        os.kill(child.proc.pid, signal.SIGCONT)
        child.proc.join(30)
        assert (tmp_path / "outcome").read_text() == "committed"
        got = sorted(m.payload for m in iter(lambda: jobs.dequeue(db), None))
        assert got == [b"before", b"from the stopped one", b"meanwhile"]
    finally:
        if child.proc.is_alive():
            os.kill(child.proc.pid, signal.SIGCONT)
        children.stop()
        if t is not None:
            t.join(30)
        db.close()


def stopped_in_its_commit(url: str) -> None:
    """Open the store, then SIGSTOP this process in its next commit, once pinned (a stop
    there is not bounded: the process holds SQLite's write lock in a moment)."""
    db = fdbqueue.open(url)
    store = db._store  # type: ignore[attr-defined]
    pin = store.pin  # the store lock's own (StoreLock.pin), which a commit calls through the store

    def pin_then_stop() -> bool:
        pinned = pin()
        os.kill(os.getpid(), signal.SIGSTOP)
        return bool(pinned)

    store.pin = pin_then_stop
    Queue("jobs").enqueue(db, b"from the stopped one")


def test_an_open_behind_a_holder_stopped_in_its_commit_says_who_holds_the_store(
    tmp_path: Path, real_clock: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26, item 12: the open that cannot get the store lock fails with a clear
    StoreLockedError (a 1037, retryable) naming the holder's pid and that it is stopped, and
    the CLI says so in one line."""
    url = f"sqlite://{tmp_path}/q.db"
    fdbqueue.open(url).close()
    children = Children()
    child = children.start("stopped", stopped_in_its_commit, url)
    try:
        deadline = time.monotonic() + 30
        while not stopped(child.proc.pid):
            assert time.monotonic() < deadline and child.proc.is_alive(), "the child never stopped"
            time.sleep(0.01)
        with pytest.raises(fdbqueue.StoreLockedError) as err:
            fdbqueue.open(url + "?lock_timeout=0.5")
        text = str(err.value)
        assert err.value.code == 1037 and err.value.retryable
        assert f"process {child.proc.pid} holds it" in text and "stopped" in text and "kill -CONT" in text
        from fdbqueue.cli import main

        assert main(["--url", url + "?lock_timeout=0.5", "list"]) == 1
        said = capsys.readouterr().err.strip().splitlines()
        assert len(said) == 1 and f"process {child.proc.pid} holds it" in said[0], said
    finally:
        if child.proc.is_alive():
            os.kill(child.proc.pid, signal.SIGCONT)
        children.stop()
