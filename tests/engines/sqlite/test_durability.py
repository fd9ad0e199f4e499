"""sync=full on the embedded engine: every commit's WAL frames are fsynced before it returns.

The fsync runs after the store lock is released (so overlapping commits share a flush), which
means another transaction can briefly see a commit whose fsync is still under way. These tests
watch the real ``os.fdatasync`` calls (recorded, then passed through) to check that no
transaction returns before what it wrote, or read, is on disk.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import StoreError
from fdbqueue.engines.sqlite import page as _page
from fdbqueue.engines.sqlite import walsync as _walsync
from fdbqueue.engines.sqlite.database import SqliteDatabase

pytestmark = pytest.mark.skipif(
    _page.BOOT_ID is None, reason="the shared version clock needs Linux's boot id"
)


@pytest.fixture
def synced_files(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files each os.fdatasync call flushed, in order (the real call still runs)."""
    calls: list[str] = []
    real = os.fdatasync

    def recording(fd: int) -> None:
        calls.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fdatasync", recording)
    return calls


def open_db(tmp_path: Path, sync: str = "full") -> SqliteDatabase:
    db = fdbqueue.open(f"sqlite://{tmp_path}/store.db?sync={sync}")
    assert isinstance(db, SqliteDatabase)
    return db


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDatabase]:
    db = open_db(tmp_path)
    db[b"warm"] = b"up"  # each test starts after a first commit, with its WAL on disk
    yield db
    db.close()


def synced_version(db: SqliteDatabase) -> int:
    tag, synced, _ = db._store.page.sync_mark()  # type: ignore[attr-defined]
    assert tag == db._store.clock_tag
    return int(synced)


def committed_version(db: SqliteDatabase) -> int:
    return int(db._store.page.sync_mark()[2])  # type: ignore[attr-defined]


def set_synced_version(db: SqliteDatabase, version: int) -> None:
    db._store.page.set_on_disk(version)  # type: ignore[attr-defined]


def commit(db: SqliteDatabase, body: Callable[[fdbqueue.Transaction], object]) -> int:
    tr = db.create_transaction()
    body(tr)
    tr.commit()
    return int(tr.get_committed_version())


def wal_of(db: SqliteDatabase) -> str:
    return os.path.realpath(db.path) + "-wal"


def test_a_commit_returns_after_its_wal_is_fsynced(db: SqliteDatabase, synced_files: list[str]) -> None:
    version = commit(db, lambda tr: tr.set(b"k", b"v"))
    assert synced_files == [wal_of(db)]
    assert synced_version(db) >= version > 0
    q = fdbqueue.Queue("jobs")
    synced_files.clear()
    q.enqueue(db, b"payload")
    assert synced_files == [wal_of(db)]
    synced_files.clear()
    assert q.dequeue(db) is not None
    assert synced_files == [wal_of(db)]


def test_a_read_returns_only_what_is_on_disk(db: SqliteDatabase, synced_files: list[str]) -> None:
    version = commit(db, lambda tr: tr.set(b"k", b"v"))
    synced_files.clear()
    # Nothing newer than the last fsync: a read-only transaction costs no fsync.
    assert db[b"k"] == b"v"
    assert synced_files == []
    # As if another process had committed and were still inside its fsync.
    set_synced_version(db, version - 1)
    assert db[b"k"] == b"v"
    assert synced_files == [wal_of(db)]
    assert synced_version(db) >= version


def test_a_commit_already_covered_by_a_later_flush_skips_its_own(
    db: SqliteDatabase, synced_files: list[str]
) -> None:
    set_synced_version(db, 2**63)  # another process's fsync covered every version we could get
    synced_files.clear()
    commit(db, lambda tr: tr.set(b"k", b"v"))
    assert synced_files == []


def test_a_stale_marker_of_another_store_is_not_trusted(db: SqliteDatabase, synced_files: list[str]) -> None:
    db._store.page.set_sync_mark(b"\1" * 32, 2**63, 2**63)  # type: ignore[attr-defined]
    synced_files.clear()
    version = commit(db, lambda tr: tr.set(b"k", b"v"))
    assert synced_files == [wal_of(db)]
    assert synced_version(db) == version


def test_commits_that_wait_for_one_fsync_share_the_next(
    db: SqliteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A commits and fsyncs; B and C commit meanwhile; one more fsync covers both."""
    calls: list[int] = []
    real = os.fdatasync
    others_committed = threading.Event()

    def slow_first(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:  # A's: hold it until B and C have committed
            assert others_committed.wait(10)
        real(fd)

    monkeypatch.setattr(os, "fdatasync", slow_first)
    versions: list[int] = []

    def write(key: bytes) -> None:
        versions.append(commit(db, lambda tr: tr.set(key, b"v")))

    a = threading.Thread(target=write, args=(b"a",))
    a.start()
    deadline = time.monotonic() + 10
    while not calls and time.monotonic() < deadline:
        time.sleep(0.001)
    assert calls, "A never reached its fsync"
    others = [threading.Thread(target=write, args=(k,)) for k in (b"b", b"c")]
    for t in others:
        t.start()
    # B's and C's COMMITs have returned once a plain SQLite reader (no store lock, no
    # fsync of its own) sees both keys; their fsyncs then wait behind A's.
    raw = sqlite3.connect(os.path.realpath(db.path))
    try:
        while time.monotonic() < deadline:
            (n,) = raw.execute("SELECT count(*) FROM kv WHERE k IN (?, ?)", (b"b", b"c")).fetchone()
            if n == 2:
                break
            time.sleep(0.001)
    finally:
        raw.close()
    assert versions == [], "a commit returned before A's fsync did"
    others_committed.set()
    for t in (a, *others):
        t.join(10)
    assert len(versions) == 3
    assert len(calls) == 2
    assert synced_version(db) == max(versions)
    assert [db[k] for k in (b"a", b"b", b"c")] == [b"v"] * 3


def test_sync_normal_never_fsyncs_a_commit(tmp_path: Path, synced_files: list[str]) -> None:
    db = open_db(tmp_path, sync="normal")
    try:
        for i in range(20):
            db[b"k%d" % i] = b"v"
            assert db[b"k%d" % i] == b"v"
    finally:
        db.close()
    assert synced_files == []


def test_a_failed_fsync_is_reported_and_the_commit_is_kept(
    db: SqliteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(os, "fdatasync", failing)
    with pytest.raises(StoreError, match=r"fsync failed.*power loss"):
        commit(db, lambda tr: tr.set(b"k", b"v"))
    monkeypatch.undo()
    assert db[b"k"] == b"v"  # written and visible: only its durability was in doubt


def test_counters_from_processes_are_exact_and_on_disk(tmp_path: Path) -> None:
    """Four processes commit at once; afterwards the marker covers the last version."""
    db = open_db(tmp_path)
    db[b"n"] = struct.pack("<q", 0)
    code = (
        "import struct, sys, fdbqueue\n"
        "from fdbqueue.engines.transactional import run_transaction\n"
        "db = fdbqueue.open(sys.argv[1])\n"
        "for _ in range(200):\n"
        "    run_transaction(db, lambda tr: tr.add(b'n', struct.pack('<q', 1)))\n"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, db.url]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 4
    try:
        assert struct.unpack("<q", db[b"n"])[0] == 800
        last = db._store.page.clock()[1]  # type: ignore[attr-defined]
        assert synced_version(db) == last
    finally:
        db.close()


def test_the_wal_is_zero_filled_up_front_and_reused_in_place(tmp_path: Path) -> None:
    """At sync=full the WAL starts at its working size, so no commit's fsync has to grow it;
    the zeros past the last frame are ignored, by readers and by recovery on reopen."""
    target = 32 + _walsync.WAL_FRAMES * (24 + 4096)
    db = open_db(tmp_path)
    wal = wal_of(db)
    try:
        assert os.path.getsize(wal) == target
        for i in range(1_500):  # past SQLite's checkpoint at 1,000 pages: the WAL restarts
            db[b"k%05d" % i] = b"v" * 100
        assert os.path.getsize(wal) == target
    finally:
        db.close()
    reopened = open_db(tmp_path)
    try:
        assert len(reopened.get_range_startswith(b"k")) == 1_500  # type: ignore[attr-defined]
    finally:
        reopened.close()
    fast = fdbqueue.open(f"sqlite://{tmp_path}/fast.db?sync=normal")
    try:
        fast[b"k"] = b"v"
        assert os.path.getsize(os.path.realpath(f"{tmp_path}/fast.db") + "-wal") < target
    finally:
        fast.close()
