"""Volatile queues: on the embedded engine their commits skip the fsync (they survive a process
crash, not a power loss); a commit that writes anything durable stays durable; FoundationDB
refuses them with advice."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
import fdbqueue.engines.sqlite.walsync as walsync
from fdbqueue import Queue, QueueError


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """The engine's WAL fsyncs, counted: at synchronous=NORMAL SQLite syncs nothing at commit
    (https://www.sqlite.org/pragma.html#pragma_synchronous), so every fsync of a commit is the
    engine's own fdatasync (engines/sqlite/walsync.py)."""
    calls: list[int] = []
    real = os.fdatasync

    def counted(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(walsync.os, "fdatasync", counted)
    yield calls


def _count(fsyncs: list[int], step: Callable[[], object]) -> int:
    before = len(fsyncs)
    step()
    return len(fsyncs) - before


def test_a_volatile_queue_commits_without_fsync_and_a_mixed_commit_is_durable(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    db = fdbqueue.open(f"sqlite:///{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "scratch", volatile=True)
    fdbqueue.create_queue(db, "durable")
    scratch, durable = Queue("scratch"), Queue("durable")
    assert _count(fsyncs, lambda: durable.enqueue(db, b"d")) == 1
    assert _count(fsyncs, lambda: scratch.enqueue(db, b"v")) == 0
    m = scratch.lease(db)
    assert m is not None
    assert _count(fsyncs, lambda: scratch.ack(db, m)) == 0
    assert _count(fsyncs, lambda: scratch.enqueue_many(db, [b"1", b"2"])) == 0
    assert _count(fsyncs, lambda: scratch.dequeue(db)) == 0

    @fdbqueue.transactional
    def both(tr: Any) -> None:  # one transaction: a volatile and a durable queue
        scratch.enqueue(tr, b"v")
        durable.enqueue(tr, b"d")

    assert _count(fsyncs, lambda: both(db)) == 1

    @fdbqueue.transactional
    def with_own_write(tr: Any) -> None:  # the application's own key is durable
        tr[b"app/order"] = b"placed"
        scratch.enqueue(tr, b"v")

    assert _count(fsyncs, lambda: with_own_write(db)) == 1
    fdbqueue.create_queue(db, "scratch", volatile=False)  # durable again from now on
    assert _count(fsyncs, lambda: scratch.enqueue(db, b"durable now")) == 1
    db.close()


CHILD = textwrap.dedent(
    """
    import os, signal, sys
    import fdbqueue
    db = fdbqueue.open(sys.argv[1])
    fdbqueue.create_queue(db, "scratch", volatile=True)
    mid = fdbqueue.Queue("scratch").enqueue(db, b"kept")
    print(mid, flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
    """
)


def test_a_volatile_queue_survives_a_process_crash(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    done = subprocess.run([sys.executable, "-c", CHILD, url], capture_output=True, text=True, timeout=60)
    assert done.returncode == -signal.SIGKILL
    mid = done.stdout.strip()
    db = fdbqueue.open(url)
    m = Queue("scratch").dequeue(db)
    assert m is not None and (m.id, m.payload) == (mid, b"kept")
    db.close()


def test_after_a_power_loss_the_store_opens_with_the_durable_commits(tmp_path: Path) -> None:
    """A power loss leaves the files as the last fsync did: here, copies taken right after the
    last durable commit (a volatile commit follows, whose WAL frames never reached the copy).
    The store opens from them (SQLite's WAL recovery stops at the last whole commit) with the
    durable message, and the volatile one is gone, as documented."""
    db = fdbqueue.open(f"sqlite:///{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "scratch", volatile=True)
    fdbqueue.create_queue(db, "durable")
    Queue("durable").enqueue(db, b"kept")
    disk = tmp_path / "disk"
    disk.mkdir()
    for name in ("q.db", "q.db-wal"):
        shutil.copyfile(tmp_path / name, disk / name)
    Queue("scratch").enqueue(db, b"lost")
    db.close()
    again = fdbqueue.open(f"sqlite:///{disk / 'q.db'}")
    got = Queue("durable").dequeue(again)
    assert got is not None and got.payload == b"kept"
    assert Queue("scratch").dequeue(again) is None
    again.close()


def test_memory_and_sim_accept_volatile_and_foundationdb_refuses_it(fdb_db: Any) -> None:
    for url in ("memory://", "sim://?seed=1"):
        db = fdbqueue.open(url)
        fdbqueue.create_queue(db, "scratch", volatile=True)
        Queue("scratch").enqueue(db, b"x")
        assert Queue("scratch").dequeue(db) is not None
    with pytest.raises(QueueError, match="FoundationDB makes every commit durable"):
        fdbqueue.create_queue(fdb_db, "scratch", volatile=True)
    fdbqueue.create_queue(fdb_db, "durable")  # nothing else refused
