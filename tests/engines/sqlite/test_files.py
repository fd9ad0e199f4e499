"""The files of an embedded store: removed or replaced under an open store, foreign files,
missing folders, what stays after close, and read-only stores.

A holder process (``HOLDER`` below, a fresh interpreter) keeps the store open and commits one
key per line it reads, printing ``ok`` only after the commit returned, or ``err <message>``;
the test changes the files between its commits, as a user with ``rm`` would.
"""

from __future__ import annotations

import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO

import pytest

import fdbqueue
from fdbqueue import StoreError
from fdbqueue.engines.sqlite.notify import notify_dir_for
from tests.support import ROOT

HOLDER = r"""
import sys
import fdbqueue

db = fdbqueue.open(sys.argv[1])
for line in sys.stdin:
    key = line.strip().encode()
    try:
        db.set(key, b"v")
    except fdbqueue.QueueError as exc:
        print("err", type(exc).__name__, str(exc).replace("\n", " "), flush=True)
    else:
        print("ok", flush=True)
db.close()
print("closed", flush=True)
"""


class Holder:
    """A process holding the store open; ``commit(key)`` returns its ``ok`` or ``err ...`` line."""

    def __init__(self, url: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.stdin: IO[str] = self.proc.stdin
        self.stdout: IO[str] = self.proc.stdout

    def commit(self, key: str) -> str:
        self.stdin.write(key + "\n")
        self.stdin.flush()
        line = self.stdout.readline()
        assert line, f"the holder exited with {self.proc.wait()}"
        return line.strip()

    def close(self) -> None:
        """End its input: it closes the store cleanly and exits."""
        self.stdin.close()
        assert self.stdout.read().split() == ["closed"]
        assert self.proc.wait(30) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()


def keys_in(url: str) -> set[bytes]:
    db = fdbqueue.open(url)
    try:
        return {kv.key for kv in db.get_range(b"", b"\xff")}  # type: ignore[attr-defined]
    finally:
        db.close()


def open_elsewhere(url: str) -> str:
    """What a new process meets when it opens ``url`` and reads: the keys, or its error."""
    program = (
        "import sys, fdbqueue\n"
        "try:\n"
        "    db = fdbqueue.open(sys.argv[1])\n"
        "    print(sorted(kv.key.decode() for kv in db.get_range(b'', b'\\xff')))\n"
        "except fdbqueue.QueueError as exc:\n"
        "    print('error', exc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program, url],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


# --- files removed or replaced under an open store -------------------------------------------------


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_removed_wal_is_refused_and_loses_no_reported_commit(tmp_path: Path, sync: str) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync={sync}"
    holder = Holder(url)
    try:
        reported = [f"k{i}" for i in range(20)]
        assert [holder.commit(k) for k in reported] == ["ok"] * 20
        os.unlink(tmp_path / "q.db-wal")
        answer = holder.commit("after")
        assert answer.startswith("err StoreError"), answer
        assert "q.db-wal was removed" in answer and "reopen" in answer
        assert holder.commit("again").startswith("err StoreError")  # and it stays refused
        seen = open_elsewhere(url)
        assert "not an fdbqueue store" not in seen
        assert seen == str(sorted(reported)), seen  # consistent: every reported commit, no more
    finally:
        holder.kill()
    assert keys_in(url) == {k.encode() for k in reported}


@pytest.mark.parametrize("name", ["q.db", "q.db-shm", "q.db-lock"])
def test_replaced_or_removed_files_refuse_commits(tmp_path: Path, name: str) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    holder = Holder(url)
    try:
        assert holder.commit("k0") == "ok"
        target = tmp_path / name
        if name == "q.db":  # replaced: a copy moved over it
            shutil.copyfile(target, tmp_path / "copy")
            os.replace(tmp_path / "copy", target)
            how = "replaced"
        else:
            target.unlink()
            how = "removed"
        answer = holder.commit("k1")
        assert answer.startswith("err StoreError"), answer
        assert f"{name} was {how}" in answer and "reopen" in answer
    finally:
        holder.kill()


def test_removed_directory_refuses_commits(tmp_path: Path) -> None:
    folder = tmp_path / "app"
    folder.mkdir()
    holder = Holder(f"sqlite://{folder / 'q.db'}?sync=normal")
    try:
        assert holder.commit("k0") == "ok"
        shutil.rmtree(folder)
        answer = holder.commit("k1")
        assert answer.startswith("err StoreError"), answer
        assert f"its directory {folder} is gone" in answer
    finally:
        holder.kill()


def test_a_store_whose_wal_was_lost_is_an_older_store_not_a_new_one(tmp_path: Path) -> None:
    """A holder killed before it could notice: the store opens as what its file holds."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    holder = Holder(url)
    try:
        assert holder.commit("k0") == "ok"
        os.unlink(tmp_path / "q.db-wal")
    finally:
        holder.kill()
    # Read only what the database file holds (immutable: no WAL), as the next open will.
    conn = sqlite3.connect(f"file:{tmp_path / 'q.db'}?immutable=1", uri=True)
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    conn.close()
    assert {"kv", "meta"} <= tables  # the schema was in the database file from the start
    db = fdbqueue.open(url)  # so this opens the store the holder created, not a new one
    db.close()


def test_every_commit_checks_the_files(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        db.set(b"a", b"1")  # type: ignore[attr-defined]
        os.unlink(tmp_path / "q.db-shm")
        with pytest.raises(StoreError, match=r"q\.db-shm was removed"):
            db.set(b"b", b"2")  # type: ignore[attr-defined]
        with pytest.raises(StoreError, match="reopen"):
            db.get(b"a")  # type: ignore[attr-defined]
    finally:
        db.close()


# --- files that are not stores --------------------------------------------------------------------


def foreign_database(path: Path, wal: bool) -> None:
    conn = sqlite3.connect(path)
    if wal:
        conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()


@pytest.mark.parametrize("kind", ["text", "empty-looking sqlite", "foreign", "foreign-wal", "directory"])
def test_a_file_that_is_not_a_store_is_refused_and_nothing_is_left_beside_it(
    tmp_path: Path, kind: str
) -> None:
    path = tmp_path / "notes.db"
    if kind == "text":
        path.write_text("shopping: milk, eggs\n")
    elif kind == "empty-looking sqlite":  # a SQLite header, then garbage
        path.write_bytes(b"SQLite format 3\0" + os.urandom(4080))
    elif kind == "directory":
        path.mkdir()
    else:
        foreign_database(path, wal=kind == "foreign-wal")
    before = sorted(os.listdir(tmp_path))
    with pytest.raises(StoreError) as err:
        fdbqueue.open(f"sqlite://{path}")
    assert "not an fdbqueue store" in str(err.value) and str(path) in str(err.value)
    assert sorted(os.listdir(tmp_path)) == before  # no -lock, -wal, -shm or -notify
    if kind.startswith("foreign"):
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT name FROM customers").fetchall() == [("ada",)]
        conn.close()


def test_a_store_truncated_to_nothing_is_refused_not_started_afresh(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    fdbqueue.Queue("jobs").enqueue(db, b"acknowledged")
    db.close()
    path.write_bytes(b"")  # the store file truncated, its lock file still there
    with pytest.raises(StoreError) as err:
        fdbqueue.open(f"sqlite://{path}")
    assert "empty" in str(err.value) and "lived here" in str(err.value) and str(path) in str(err.value)
    assert path.read_bytes() == b""  # nothing was written in its place


def test_an_empty_file_with_no_store_history_becomes_a_store(tmp_path: Path) -> None:
    path = tmp_path / "new.db"
    path.write_bytes(b"")  # e.g. made by a tool that creates the file first
    db = fdbqueue.open(f"sqlite://{path}")
    fdbqueue.Queue("jobs").enqueue(db, b"x")
    assert fdbqueue.Queue("jobs").size(db) == 1
    db.close()


# --- what stays after close ----------------------------------------------------------------------

WATCHER = r"""
import sys
import fdbqueue

db = fdbqueue.open(sys.argv[1])
_, watch = db.get_and_watch(b"w")
print("armed", flush=True)
sys.stdin.read()
db.close()
"""


def test_last_close_leaves_only_the_database_and_its_lock_file(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    _, watch = db.get_and_watch(b"w")  # type: ignore[attr-defined]
    assert not watch.is_ready()
    other = subprocess.Popen(
        [sys.executable, "-c", WATCHER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert other.stdout is not None and other.stdout.readline().strip() == "armed"
        notify = notify_dir_for(os.path.realpath(tmp_path / "q.db"))
        assert os.path.isdir(notify)
        db.close()  # not the last: the other process still watches
        assert len(os.listdir(notify)) == 1
        other.communicate("", timeout=30)
        assert other.returncode == 0
    finally:
        if other.poll() is None:
            other.kill()
    # SQLite removes the WAL and its index at the last close; the engine its notify folder.
    assert sorted(os.listdir(tmp_path)) == ["q.db", "q.db-lock"]
    assert not os.path.exists(notify)
    assert keys_in(url) == set()  # and the store opens again


def test_a_closed_store_can_be_removed_with_rm_f() -> None:
    tmp_path = Path(tempfile.mkdtemp(prefix="fq"))  # short enough for the notify folder beside it
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    db.set(b"k", b"v")  # type: ignore[attr-defined]
    _, watch = db.get_and_watch(b"k")  # type: ignore[attr-defined]
    assert not watch.is_ready()
    assert os.path.isdir(f"{tmp_path}/q.db-notify")
    db.close()
    done = subprocess.run(f"rm -f {tmp_path}/q.db*", shell=True, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert os.listdir(tmp_path) == []
    tmp_path.rmdir()


# --- read-only stores ----------------------------------------------------------------------------

READS = [["list"], ["stats", "jobs"], ["peek", "jobs"], ["browse", "jobs"], ["get", "jobs", "ID"]]


def make_store(folder: Path) -> tuple[str, str]:
    """A closed store with queue ``jobs`` holding two messages; its URL and the first id."""
    url = f"sqlite://{folder / 'q.db'}"
    db = fdbqueue.open(url)
    try:
        fdbqueue.create_queue(db, "jobs")
        first = fdbqueue.Queue("jobs").enqueue(db, b"one")
        fdbqueue.Queue("jobs").enqueue(db, b"two")
    finally:
        db.close()
    return url, first


def cli(url: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "fdbqueue", "--url", url, *args],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def test_mode_ro_reads_and_refuses_writes(tmp_path: Path) -> None:
    url, first = make_store(tmp_path)
    ro = url + "?mode=ro"
    files = sorted(os.listdir(tmp_path))
    for args in READS:
        done = cli(ro, *[first if a == "ID" else a for a in args])
        assert done.returncode == 0, (args, done.stderr)
    assert "one" in cli(ro, "peek", "jobs").stdout
    for args in (["enqueue", "jobs", "three"], ["dequeue", "jobs"], ["purge", "jobs", "--yes"]):
        done = cli(ro, *args)
        assert done.returncode == 1, (args, done.stdout, done.stderr)
        assert "read-only" in done.stderr, (args, done.stderr)
    db = fdbqueue.open(ro)
    try:
        with pytest.raises(StoreError, match="read-only"):
            db.set(b"k", b"v")  # type: ignore[attr-defined]
    finally:
        db.close()
    assert sorted(os.listdir(tmp_path)) == files  # nothing created, nothing left behind
    db = fdbqueue.open(url)
    try:
        assert fdbqueue.Queue("jobs").size(db) == 2  # nothing changed
    finally:
        db.close()


def test_mode_ro_follows_a_writer_that_has_the_store_open(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    writer = fdbqueue.open(url)
    try:
        writer.set(b"k", b"1")  # type: ignore[attr-defined]
        reader = fdbqueue.open(url + "&mode=ro")
        try:
            assert reader.get(b"k") == b"1"  # type: ignore[attr-defined]
            writer.set(b"k", b"2")  # type: ignore[attr-defined]
            assert reader.get(b"k") == b"2"  # type: ignore[attr-defined]
            tr = writer.create_transaction()
            tr.set(b"v", b"x")
            tr.commit()
            rtr = reader.create_transaction()
            assert rtr.get_read_version() >= tr.get_committed_version()  # database time agrees
        finally:
            reader.close()
    finally:
        writer.close()


def test_mode_ro_never_creates_a_store(tmp_path: Path) -> None:
    with pytest.raises(StoreError, match="does not exist"):
        fdbqueue.open(f"sqlite://{tmp_path / 'none.db'}?mode=ro")
    assert os.listdir(tmp_path) == []


def test_a_store_on_a_read_only_mount_can_be_read(tmp_path: Path) -> None:
    """The default mode on a read-only file system: reads work, writes say why they cannot."""
    (tmp_path / "src").mkdir()
    _, first = make_store(tmp_path / "src")
    mount = tmp_path / "ro"
    mount.mkdir()
    program = f'mount --bind {tmp_path / "src"} {mount} && mount -o remount,bind,ro {mount} && exec "$@"'
    prefix = ("unshare", "--mount", "sh", "-c", program, "sh")
    probe = subprocess.run([*prefix, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only bind mount here: {probe.stderr.strip()}")
    ro_url = f"sqlite://{mount / 'q.db'}"
    for args in READS:
        done = cli(ro_url, *[first if a == "ID" else a for a in args], prefix=prefix)
        assert done.returncode == 0, (args, done.stderr)
    done = cli(ro_url, "enqueue", "jobs", "three", prefix=prefix)
    assert done.returncode == 1 and "read-only" in done.stderr, done.stderr
    assert "file system is read-only" in done.stderr


def test_a_process_opening_before_the_holder_notices_gets_a_clear_error(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    holder = Holder(url)
    try:
        reported = [f"k{i}" for i in range(5)]
        assert [holder.commit(k) for k in reported] == ["ok"] * 5
        os.unlink(tmp_path / "q.db-wal")
        seen = open_elsewhere(url)  # before the holder's next commit
        assert seen.startswith("error"), seen
        assert "not an fdbqueue store" not in seen and "q.db-wal" in seen and "removed" in seen, seen
        assert holder.commit("after").startswith("err StoreError")
        assert open_elsewhere(url) == str(sorted(reported))  # then consistent
    finally:
        holder.kill()


def test_closing_cleanly_saves_what_the_removed_wal_held(tmp_path: Path) -> None:
    """Even when another process still has the store open, so that SQLite's close is not the last."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    first, other = Holder(url), Holder(url)
    try:
        reported = [f"k{i}" for i in range(5)]
        assert [first.commit(k) for k in reported] == ["ok"] * 5
        assert other.commit("c0") == "ok"
        os.unlink(tmp_path / "q.db-wal")
        first.close()
        other.kill()  # it never commits again
    finally:
        first.kill()
        other.kill()
    assert keys_in(url) == {k.encode() for k in [*reported, "c0"]}


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
def test_a_store_without_write_permission_can_be_read() -> None:
    """Another user's store, with no permission to write it or its directory (root ignores
    permissions, so the reads run as nobody)."""
    folder = Path(tempfile.mkdtemp(prefix="fq"))
    try:
        _, first = make_store(folder)
        for path in folder.iterdir():
            path.chmod(0o444)
        folder.chmod(0o555)
        prefix = ("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups")
        url = f"sqlite://{folder / 'q.db'}"
        for args in READS:
            done = cli(url, *[first if a == "ID" else a for a in args], prefix=prefix)
            assert done.returncode == 0, (args, done.stderr)
        done = cli(url, "enqueue", "jobs", "three", prefix=prefix)
        assert done.returncode == 1 and "read-only" in done.stderr, done.stderr
        assert "no permission to write" in done.stderr
    finally:
        folder.chmod(0o755)
        shutil.rmtree(folder)


# --- wake-ups when the notify folder or the lock file is removed --------------------------------

KEY_WATCHER = r"""
import sys, fdbqueue
db = fdbqueue.open(sys.argv[1])
tr = db.create_transaction()
tr.get(b"k")
w = tr.watch(b"k")
tr.commit()
print("armed", flush=True)
try:
    print("fired" if w.wait(float(sys.argv[2])) else "timeout", flush=True)
except fdbqueue.QueueError as exc:
    print("error", type(exc).__name__, str(exc).replace("\n", " "), flush=True)
"""


def watch_elsewhere(url: str, seconds: float) -> subprocess.Popen[str]:
    """A process watching key ``k`` for ``seconds``; it prints ``armed``, then what happened."""
    proc = subprocess.Popen(
        [sys.executable, "-c", KEY_WATCHER, url, str(seconds)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "armed"
    return proc


def test_a_watcher_whose_notify_folder_was_removed_still_wakes(tmp_path: Path) -> None:
    """``rm -rf q.db-notify`` under a watching process: its socket is gone, committers find
    nobody to wake. The watcher notices within a second, binds again and re-reads its keys."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    try:
        watcher = watch_elsewhere(url, 20)
        try:
            shutil.rmtree(notify_dir_for(str(tmp_path / "q.db")))
            db.set(b"k", b"1")  # type: ignore[attr-defined]
            out, _ = watcher.communicate(timeout=30)
            assert out.strip() == "fired", out
        finally:
            watcher.kill()
            watcher.wait()
        # And it keeps waking: a watch armed after the rebinding hears a later commit at once.
        watcher = watch_elsewhere(url, 20)
        try:
            db.set(b"k", b"2")  # type: ignore[attr-defined]
            out, _ = watcher.communicate(timeout=30)
            assert out.strip() == "fired", out
        finally:
            watcher.kill()
            watcher.wait()
    finally:
        db.close()


def test_a_watcher_whose_lock_file_was_removed_wakes_and_meets_the_error(tmp_path: Path) -> None:
    """``rm q.db-lock`` under a watching process: the next process to open the store makes a
    new lock file, which the watcher's process never sees, so its commits are refused. The
    watcher notices within a second and wakes its waiters, whose next commit says why."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    program = (
        KEY_WATCHER
        + "tr = db.create_transaction(); tr.get(b'k')\n"
        + (
            "try:\n"
            "    tr.commit(); print('committed', flush=True)\n"
            "except fdbqueue.QueueError as exc:\n"
            "    print('error', type(exc).__name__, str(exc).replace('\\n', ' '), flush=True)\n"
        )
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", program, url, "20"],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "armed"
        os.unlink(tmp_path / "q.db-lock")
        out, _ = proc.communicate(timeout=30)
        lines = out.strip().splitlines()
        assert lines[0] == "fired", out
        assert lines[1].startswith("error StoreError") and "q.db-lock was removed" in lines[1], out
    finally:
        proc.kill()
        proc.wait()


def test_a_second_handle_in_one_process_keeps_the_store_open_for_other_processes(tmp_path: Path) -> None:
    """Opening the store again in a process that has it open must not open and close its
    database file outside SQLite: that drops the process's POSIX locks on it, and another
    process closing its last connection then removed the WAL under this one (seen when Spark
    executors read a store a worker was draining)."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.Queue("jobs").enqueue(db, b"x")
    second = fdbqueue.open(url)
    child = "import fdbqueue, sys\ndb = fdbqueue.open(sys.argv[1])\n"
    child += "print(fdbqueue.Queue('jobs').size(db))\ndb.close()"
    out = subprocess.run([sys.executable, "-c", child, url], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["1"], out.stderr
    assert (tmp_path / "q.db-wal").exists()  # still there: this process has the store open
    fdbqueue.Queue("jobs").enqueue(db, b"y")  # and it still commits
    assert fdbqueue.Queue("jobs").size(second) == 2
    second.close()
    db.close()
