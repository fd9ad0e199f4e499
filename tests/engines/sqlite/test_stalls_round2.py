"""Issue 26, second trial: a process stopped where the embedded store's lease does not reach.

- A process SIGSTOPped inside its commit's fsync (its commit done, the store lock released)
  held the WAL's group-commit lock: every other process's commit, and every read-only
  transaction, waited for it with no limit. Required: a writer waits for that fsync a
  bounded time (``_walsync.LEADER_WAIT``) and then makes its own commit durable itself; a
  reader never waits for another process's fsync.
- An open behind a process stopped while it held SQLite's own lock on ``q.db`` (the last
  connection's close takes it to copy the WAL into the file) failed with a bare
  "stayed locked by another SQLite connection". Required: StoreLockedError naming the holder.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.sqlite import shared as _shared
from fdbqueue.engines.sqlite import walsync as _walsync
from tests.support.processes import Children, real_clock

__all__ = ["real_clock"]


def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def wait_until_stopped(child: Any) -> None:
    deadline = time.monotonic() + 30
    while not stopped(child.proc.pid):
        assert time.monotonic() < deadline and child.proc.is_alive(), "the child never stopped"
        time.sleep(0.01)


def stopped_in_its_fsync(url: str) -> None:
    """Enqueue once, SIGSTOPping this process inside the commit's fdatasync of the WAL: the
    commit is done and the store lock released, the group commit's lock on the WAL held."""
    db = fdbqueue.open(url)
    real = os.fdatasync

    def stop_then_sync(fd: int) -> None:
        os.kill(os.getpid(), signal.SIGSTOP)
        real(fd)

    os.fdatasync = stop_then_sync
    Queue("x").enqueue(db, b"from the stopped one")


def in_thread(call: Callable[[], object], within: float) -> tuple[list[object], float]:
    """Run ``call`` in a daemon thread for up to ``within`` s: (its result, if any; seconds taken)."""
    done: list[object] = []
    t = threading.Thread(target=lambda: done.append(call()), daemon=True)
    start = time.monotonic()
    t.start()
    t.join(within)
    return done, time.monotonic() - start


def test_a_process_stopped_in_its_fsync_holds_up_no_reader_and_no_writer_past_the_bound(
    tmp_path: Path, real_clock: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"sqlite://{tmp_path}/q.db?lock_timeout=3"
    db = fdbqueue.open(url)
    x = Queue("x")
    x.enqueue(db, b"seed")
    children = Children()
    child = children.start("stopped", stopped_in_its_fsync, url)
    try:
        wait_until_stopped(child)
        # A read: it may have seen the stopped one's commit, not on disk yet; it waits for no one.
        sized, took = in_thread(lambda: x.size(db), 0.5)
        assert sized == [2], f"a read still waits after {took:.1f} s behind a process stopped in its fsync"

        # A write: waits for the stopped fsync at most LEADER_WAIT, then fsyncs the WAL itself.
        syncs: list[int] = []
        real = os.fdatasync

        def counted(fd: int) -> None:
            real(fd)
            syncs.append(fd)

        monkeypatch.setattr(os, "fdatasync", counted)
        tr = db.create_transaction()

        def enqueue() -> int:
            x.enqueue(tr, b"meanwhile")
            tr.commit()
            return tr.get_committed_version()

        done, took = in_thread(enqueue, _walsync.LEADER_WAIT + 2)
        assert done, f"an enqueue still waits after {took:.1f} s behind a process stopped in its fsync"
        assert syncs, "the enqueue returned without an fsync of the WAL"
        store = _shared.attach(os.path.realpath(tmp_path / "q.db"), "q.db")
        try:
            on_disk = _walsync._synced(store.page, db._store.clock_tag)  # type: ignore[attr-defined]
        finally:
            _shared.detach(store)
        assert isinstance(done[0], int) and on_disk >= done[0], (on_disk, done)
        monkeypatch.undo()

        os.kill(child.proc.pid, signal.SIGCONT)
        child.proc.join(30)
        assert child.proc.exitcode == 0
        got = sorted(m.payload for m in x.browse(db))
        assert got == [b"from the stopped one", b"meanwhile", b"seed"]
    finally:
        if child.proc.is_alive():
            os.kill(child.proc.pid, signal.SIGCONT)
        children.stop()  # SIGKILL: the kernel releases its locks, so a waiting thread ends
        db.close()


def holding_sqlites_lock(url: str) -> None:
    """Open the store, then hold SQLite's exclusive lock on its database file and SIGSTOP.

    That is the lock the last connection's close takes (``sqlite3WalClose``) while it copies
    the WAL into the file and removes it, which no Python code can interrupt: taken here with
    SQLite's own exclusive locking mode, the same byte-range lock on the same bytes.
    """
    db = fdbqueue.open(url)
    conn = db._store.conn  # type: ignore[attr-defined]
    conn.execute("PRAGMA locking_mode=EXCLUSIVE")
    conn.execute("BEGIN IMMEDIATE")
    conn.execute("UPDATE meta SET value = value WHERE name = 'version'")
    conn.execute("COMMIT")  # exclusive mode keeps the lock after COMMIT
    os.kill(os.getpid(), signal.SIGSTOP)


def test_an_open_behind_a_process_stopped_holding_sqlites_lock_says_who_holds_it(
    tmp_path: Path, real_clock: None, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"sqlite://{tmp_path}/q.db"
    fdbqueue.open(url).close()
    children = Children()
    child = children.start("stopped", holding_sqlites_lock, url)
    try:
        wait_until_stopped(child)
        with pytest.raises(fdbqueue.StoreLockedError) as err:
            fdbqueue.open(url + "?lock_timeout=0.5")
        text = str(err.value)
        assert err.value.code == 1037 and err.value.retryable
        assert f"process {child.proc.pid} holds" in text and "stopped" in text and "kill -CONT" in text, text
        from fdbqueue.cli import main

        assert main(["--url", url + "?lock_timeout=0.5", "list"]) == 1
        said = capsys.readouterr().err.strip().splitlines()
        assert len(said) == 1 and f"process {child.proc.pid} holds" in said[0], said
    finally:
        if child.proc.is_alive():
            os.kill(child.proc.pid, signal.SIGCONT)
        children.stop()
    fdbqueue.open(url + "?lock_timeout=2").close()  # the holder gone, the store opens
