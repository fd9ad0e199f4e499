"""The embedded engine on real files with real processes: locking, durability, watches, bad input.

Child processes run the small program ``CHILD`` below (``python -c``), so each one is a
fresh interpreter with its own connection, lock descriptor and watch thread, as a
worker or a Spark executor would be.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import signal
import sqlite3
import statistics
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import pytest

import fdbqueue
from fdbqueue import EngineError, InvalidURLError, NestedTransactionError, StoreError, UnsupportedFormatError
from fdbqueue.engines.sqlite import versionclock as _versionclock
from fdbqueue.engines.sqlite.database import SqliteDatabase
from fdbqueue.engines.sqlite.notify import notify_dir_for
from fdbqueue.engines.transactional import run_transaction
from tests.support import ROOT

CHILD = r"""
import struct, sys, time
import fdbqueue
from fdbqueue.engines.sqlite.notify import notify_dir_for
from fdbqueue.engines.transactional import run_transaction

mode, url = sys.argv[1], sys.argv[2]
db = fdbqueue.open(url)
ONE = struct.pack("<q", 1)

def out(*words):
    print(*words, flush=True)

if mode == "counters":
    n = int(sys.argv[3])

    @fdbqueue.transactional
    def add(tr):
        tr.add(b"atomic", ONE)

    @fdbqueue.transactional
    def incr(tr):
        tr[b"rmw"] = str(int(tr[b"rmw"] or b"0") + 1).encode()

    for _ in range(n):
        add(db)
        incr(db)
elif mode == "writer":
    i = 0
    while True:
        db.set(b"w/%08d" % i, b"x" * 200)
        out(i)  # only after commit returned
        i += 1
elif mode == "setter":
    for line in sys.stdin:
        key, value = (bytes.fromhex(w) for w in line.split())
        db.set(key, value)
        out(repr(time.time()))
elif mode == "stamps":
    n, tag = int(sys.argv[3]), sys.argv[4].encode()

    def body(tr):
        order = int(tr[b"order"] or b"0")
        tr[b"order"] = str(order + 1).encode()
        tr.set_versionstamped_key(b"vs/" + b"\0" * 10 + tag + struct.pack("<I", 3), b"")
        return order, tr.get_versionstamp()

    for _ in range(n):
        order, stamp = run_transaction(db, body)
        out(order, stamp.wait().hex())
elif mode == "watcher":
    _, watch = db.get_and_watch(bytes.fromhex(sys.argv[3]))
    out("armed")
    out("fired" if watch.wait(30) else "timeout")
elif mode == "holder":
    tr = db.create_transaction()
    tr[b"held"] = b"1"
    out("locked")
    time.sleep(float(sys.argv[3]))
    tr.commit()
    out("released", repr(time.time()))
db.close()
"""


class Child:
    """A child interpreter running ``CHILD``; stdout is read line by line."""

    def __init__(self, *args: str, stdin: bool = False) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD, *args],
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
        assert self.proc.stdout is not None
        self.stdout: IO[str] = self.proc.stdout

    def line(self) -> str:
        text = self.stdout.readline()
        assert text, f"child exited early with {self.proc.wait()}"
        return text.strip()

    def send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def finish(self, timeout: float = 30.0) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        assert self.proc.wait(timeout) == 0

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'store.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[SqliteDatabase]:
    database = fdbqueue.open(url)
    assert isinstance(database, SqliteDatabase)
    try:
        yield database
    finally:
        database.close()


# --- several processes on one file ---------------------------------------------------------------


def test_counters_from_four_processes_are_exact(db: SqliteDatabase, url: str) -> None:
    n = 150
    children = [Child("counters", url, str(n)) for _ in range(4)]
    for child in children:
        child.finish(60)
    assert db[b"atomic"] == struct.pack("<q", 4 * n)
    assert db[b"rmw"] == str(4 * n).encode()


@pytest.mark.parametrize("sync", ["full", "normal"])
def test_commits_reported_before_sigkill_survive(tmp_path: Path, sync: str) -> None:
    url = f"sqlite://{tmp_path / 'crash.db'}?sync={sync}"
    fdbqueue.open(url).close()  # the child then starts writing at once
    child = Child("writer", url)
    reported: list[int] = []
    try:
        while len(reported) < 150:
            reported.append(int(child.line()))
        child.proc.send_signal(signal.SIGKILL)
        # Whatever else it printed before dying was committed too.
        reported.extend(int(line) for line in child.stdout.read().split())
    finally:
        child.kill()
    db = fdbqueue.open(url)
    try:
        present = {kv.key for kv in db.get_range_startswith(b"w/")}  # type: ignore[attr-defined]
        assert {b"w/%08d" % i for i in reported} <= present
        db.set(b"after", b"crash")  # type: ignore[attr-defined]  # the store still takes writes
    finally:
        db.close()


def test_versionstamps_follow_commit_order_across_processes(db: SqliteDatabase, url: str) -> None:
    children = [Child("stamps", url, "80", tag) for tag in ("a", "b")]
    by_order: dict[int, bytes] = {}
    for child in children:
        mine = []
        for _ in range(80):
            order, stamp = child.line().split()
            by_order[int(order)] = bytes.fromhex(stamp)
            mine.append(bytes.fromhex(stamp))
        assert mine == sorted(mine)
        child.finish()
    assert sorted(by_order) == list(range(160))  # every commit, each at its own place
    stamps = [by_order[i] for i in range(160)]
    assert all(a < b for a, b in itertools.pairwise(stamps))  # strictly, in commit order
    stored = [kv.key[3:13] for kv in db.get_range_startswith(b"vs/")]
    assert sorted(stored) == stamps


def test_lock_timeout_is_retryable_and_a_waiter_wakes_on_release(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'lock.db'}?sync=normal&lock_timeout=0.3"
    db = fdbqueue.open(url)
    try:
        holder = Child("holder", url, "1.0")
        assert holder.line() == "locked"
        tr = db.create_transaction()
        with pytest.raises(EngineError) as err:
            tr.get(b"held")
        assert err.value.code == 1037 and err.value.retryable
        assert "store lock" in str(err.value)
        # The retry loop waits its turn; the kernel wakes it when the holder commits.
        assert db.get(b"held") == b"1"  # type: ignore[attr-defined]
        woke = time.time()
        _, when = holder.line().split()
        assert woke - float(when) < 0.5
        holder.finish()
    finally:
        db.close()


def test_forked_child_reopens_its_connection_and_lock(db: SqliteDatabase) -> None:
    @fdbqueue.transactional
    def incr(tr: Any) -> None:
        tr[b"n"] = str(int(tr[b"n"] or b"0") + 1).encode()

    incr(db)
    _, watch = db.get_and_watch(b"from-child")

    def child() -> None:
        for _ in range(100):
            incr(db)
        db.set(b"from-child", b"1")

    proc = multiprocessing.get_context("fork").Process(target=child)
    proc.start()
    for _ in range(100):
        incr(db)
    proc.join(30)
    assert proc.exitcode == 0
    assert db[b"n"] == b"201"
    assert watch.wait(5.0)  # the child's commit woke the parent's watch


# --- watches across processes ----------------------------------------------------------------------


def test_watch_wakes_within_milliseconds_of_another_process_commit(db: SqliteDatabase, url: str) -> None:
    setter = Child("setter", url, stdin=True)
    try:
        latencies = []
        for i in range(8):
            _, watch = db.get_and_watch(b"wk")
            setter.send(f"{b'wk'.hex()} {str(i).encode().hex()}")
            assert watch.wait(5.0)
            woke = time.time()
            latencies.append(woke - float(setter.line()))
        print(f"watch wake-up after another process's commit: {[round(x * 1000, 2) for x in latencies]} ms")
        assert statistics.median(latencies) < 0.05
        assert max(latencies) < 0.5
    finally:
        setter.finish()


def test_watch_follows_a_value_changed_back_and_forth(db: SqliteDatabase, url: str) -> None:
    db[b"flip"] = b"0"
    setter = Child("setter", url, stdin=True)
    try:
        for value in (b"1", b"0", b"1"):
            seen, watch = db.get_and_watch(b"flip")
            assert seen != value
            setter.send(f"{b'flip'.hex()} {value.hex()}")
            setter.line()
            assert watch.wait(5.0)
            assert db[b"flip"] == value
        seen, watch = db.get_and_watch(b"flip")
        setter.send(f"{b'flip'.hex()} {seen.hex() if seen else ''}")  # the same value: no change
        setter.line()
        assert watch.wait(0.2) is False
        watch.cancel()
    finally:
        setter.finish()


def test_cancelled_watch_fails_and_is_forgotten(db: SqliteDatabase, url: str) -> None:
    _, watch = db.get_and_watch(b"c")
    watch.cancel()
    with pytest.raises(EngineError) as err:
        watch.wait(1.0)
    assert err.value.code == 1101
    db[b"c"] = b"changed"
    assert not db._store.hub._watches  # nothing left to re-read on the next commit


def test_watch_of_a_reset_transaction_fails_with_1025(db: SqliteDatabase) -> None:
    tr = db.create_transaction()
    watch = tr.watch(b"r")
    tr.reset()
    with pytest.raises(EngineError) as err:
        watch.wait(1.0)
    assert err.value.code == 1025
    tr[b"r"] = b"after reset"  # the transaction is usable again
    tr.commit()


def test_full_socket_queue_loses_no_wake_up(db: SqliteDatabase, url: str) -> None:
    watcher = Child("watcher", url, b"target".hex())
    try:
        assert watcher.line() == "armed"
        watcher.proc.send_signal(signal.SIGSTOP)  # its queue fills: a few datagrams at most
        try:
            for i in range(60):
                db[b"noise/%d" % i] = b"x"
            db[b"target"] = b"set"
        finally:
            watcher.proc.send_signal(signal.SIGCONT)
        assert watcher.line() == "fired"
        watcher.finish()
    finally:
        watcher.kill()


def test_dead_watchers_sockets_are_removed(db: SqliteDatabase, url: str) -> None:
    watcher = Child("watcher", url, b"k".hex())
    assert watcher.line() == "armed"
    watcher.proc.send_signal(signal.SIGKILL)
    watcher.kill()
    notify = Path(notify_dir_for(db._real))
    assert list(notify.glob("*.sock"))
    db[b"other"] = b"x"  # its datagram is refused: the socket is gone
    assert not list(notify.glob("*.sock"))


# --- one process --------------------------------------------------------------------------------


def test_nested_transaction_reads_committed_state_but_cannot_write(db: SqliteDatabase, url: str) -> None:
    db[b"k"] = b"committed"
    outer = db.create_transaction()
    outer[b"k"] = b"uncommitted"
    assert db[b"k"] == b"committed"  # another transaction: the last committed state
    inner = db.create_transaction()
    with pytest.raises(NestedTransactionError) as err:
        inner[b"x"] = b"y"
    assert "deadlock" in str(err.value)
    inner.cancel()
    other = fdbqueue.open(url)  # another handle on the same file, same thread
    try:
        with pytest.raises(NestedTransactionError):
            other.set(b"x", b"y")  # type: ignore[attr-defined]
        outer.commit()
        assert other.get(b"k") == b"uncommitted"  # type: ignore[attr-defined]
    finally:
        other.close()


def test_threads_share_a_handle(db: SqliteDatabase) -> None:
    @fdbqueue.transactional
    def incr(tr: Any) -> None:
        tr[b"t"] = str(int(tr[b"t"] or b"0") + 1).encode()

    threads = [threading.Thread(target=lambda: [incr(db) for _ in range(100)]) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db[b"t"] == b"400"


def test_five_second_window(db: SqliteDatabase, monkeypatch: pytest.MonkeyPatch) -> None:
    now = [1000.0]
    monkeypatch.setattr(db, "clock", lambda: now[0])
    tr = db.create_transaction()
    tr.get(b"k")
    tr[b"k"] = b"v"
    now[0] += 5.5
    with pytest.raises(EngineError) as err:
        tr.get(b"k")
    assert err.value.code == 1007 and err.value.retryable
    with pytest.raises(EngineError) as err:
        tr.commit()
    assert err.value.code == 1007
    tr.reset()
    tr[b"blind"] = b"write"  # no reads: FoundationDB commits it whatever its age
    now[0] += 6.0
    tr.commit()
    assert db[b"blind"] == b"write" and db[b"k"] is None


def test_read_only_commit_has_no_version(db: SqliteDatabase) -> None:
    tr = db.create_transaction()
    tr.get(b"k")
    tr.commit()
    assert tr.get_committed_version() == -1
    with pytest.raises(EngineError) as err:
        tr.get_versionstamp().wait()
    assert err.value.code == 2021


def test_versions_survive_reopen(url: str) -> None:
    def commit_version(database: Any) -> int:
        tr = database.create_transaction()
        tr[b"v"] = b"x"
        tr.commit()
        return int(tr.get_committed_version())

    first = fdbqueue.open(url)
    v1 = commit_version(first)
    first.close()
    second = fdbqueue.open(url)
    try:
        assert commit_version(second) > v1
    finally:
        second.close()


def test_versions_increase_when_the_clock_steps_back_or_the_lock_file_is_lost(
    db: SqliteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    def commit_version() -> int:
        tr = db.create_transaction()
        tr[b"v"] = b"x"
        tr.commit()
        return tr.get_committed_version()

    versions = [commit_version()]
    monkeypatch.setattr(_versionclock.time, "time_ns", lambda: 10**18)  # an NTP step back
    versions += [commit_version(), commit_version()]
    with open(db._real + "-lock", "r+b") as f:
        f.write(b"\0" * 64)  # what a machine crash may leave of the unsynced clock page
    versions.append(commit_version())  # restarts from meta's reservation, not from the clock
    monkeypatch.undo()
    versions.append(commit_version())
    assert all(a < b for a, b in itertools.pairwise(versions))


# --- bad input ----------------------------------------------------------------------------------


def test_corrupt_file_is_a_clear_store_error(tmp_path: Path) -> None:
    path = tmp_path / "corrupt.db"
    path.write_bytes(os.urandom(8192))
    with pytest.raises(StoreError) as err:
        fdbqueue.open(f"sqlite://{path}")
    assert str(path) in str(err.value)
    assert "not an fdbqueue store" in str(err.value)
    assert not isinstance(err.value, UnsupportedFormatError)


def test_foreign_sqlite_database_is_refused_untouched(tmp_path: Path) -> None:
    path = tmp_path / "foreign.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
    conn.execute("INSERT INTO customers (name) VALUES ('ada')")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError) as err:
        fdbqueue.open(f"sqlite://{path}")
    assert str(path) in str(err.value) and "not an fdbqueue store" in str(err.value)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT name FROM customers").fetchall() == [("ada",)]
    conn.close()


def test_newer_major_format_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "future.db"
    fdbqueue.open(f"sqlite://{path}").close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '2.0' WHERE name = 'format_version'")
    conn.commit()
    conn.close()
    with pytest.raises(UnsupportedFormatError) as err:
        fdbqueue.open(f"sqlite://{path}")
    assert str(path) in str(err.value) and "2.0" in str(err.value)


def test_newer_minor_format_opens(tmp_path: Path) -> None:
    path = tmp_path / "minor.db"
    fdbqueue.open(f"sqlite://{path}").close()
    conn = sqlite3.connect(path)
    conn.execute("UPDATE meta SET value = '1.7' WHERE name = 'format_version'")
    conn.commit()
    conn.close()
    fdbqueue.open(f"sqlite://{path}").close()


@pytest.mark.parametrize(
    "query",
    ["sync=bogus", "sync=", "lock_timeout=0", "lock_timeout=soon", "durability=full", "mode=readonly"],
)
def test_bad_parameters(tmp_path: Path, query: str) -> None:
    with pytest.raises(InvalidURLError) as err:
        fdbqueue.open(f"sqlite://{tmp_path / 'p.db'}?{query}")
    assert query.split("=")[0] in str(err.value)


def test_closed_handle_refuses_work(url: str) -> None:
    db = fdbqueue.open(url)
    db.close()
    db.close()  # idempotent
    with pytest.raises(StoreError):
        run_transaction(db, lambda tr: tr.get(b"k"))


def test_get_many_reads_in_one_statement_what_get_reads_key_by_key(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    db[b"a"], db[b"b"], db[b"c"] = b"1", b"2", b"3"
    tr = db.create_transaction()
    try:
        tr[b"b"] = b"written"  # the write map decides b and d, the store a and c
        tr.clear(b"c")
        tr[b"d"] = b"new"
        keys = [b"a", b"b", b"c", b"d", b"e", b"a", b"x" * 20_000]  # absent, repeated, too long
        statements: list[str] = []
        tr._conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
        got = tr.get_many(keys)
        snap = tr.snapshot.get_many(keys)
        tr._conn.set_trace_callback(None)  # type: ignore[attr-defined]
        assert got == snap == [tr.get(k) for k in keys] == [b"1", b"written", None, b"new", None, b"1", None]
        # One for the first get_many; the second, and the gets, find what it read: nothing
        # else commits while this transaction holds the store lock.
        assert len([s for s in statements if s.startswith("SELECT")]) == 1
    finally:
        tr.cancel()
        db.close()


def test_reads_under_the_store_lock_are_asked_of_sqlite_once(tmp_path: Path) -> None:
    """A value read stays the committed one while the transaction holds the store lock: a
    second read of it, and an atomic op on it, ask SQLite nothing; the transaction's own
    writes and clears still decide first."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    db[b"n"] = struct.pack("<q", 5)
    db[b"a"], db[b"b"] = b"1", b"2"
    tr = db.create_transaction()
    statements: list[str] = []
    tr.get(b"z")  # begun before tracing (BEGIN runs on the first operation)
    tr._conn.set_trace_callback(statements.append)  # type: ignore[attr-defined]
    try:
        assert tr.get_many([b"n", b"a", b"b", b"m"]) == [struct.pack("<q", 5), b"1", b"2", None]
        tr.add(b"n", struct.pack("<q", 2))
        tr.add(b"m", struct.pack("<q", 1))
        assert tr.get(b"a") == b"1" and tr.snapshot.get(b"m") == struct.pack("<q", 1)
        tr.clear_range(b"a", b"c")
        assert tr.get_many([b"a", b"b", b"n"]) == [None, None, struct.pack("<q", 7)]
        assert [s for s in statements if s.startswith("SELECT")] == [statements[0]]
        tr.commit()
    finally:
        tr._conn.set_trace_callback(None)  # type: ignore[attr-defined]
    assert [db[b"n"], db[b"m"]] == [struct.pack("<q", 7), struct.pack("<q", 1)]
    assert db[b"a"] is None and db[b"b"] is None
    db.close()


def test_an_enqueue_runs_four_statements_and_one_after_its_own_commit(tmp_path: Path) -> None:
    """BEGIN, one SELECT of the queue's small keys (metadata version, counters, work-index
    entry), one INSERT for every write, COMMIT: statements, not rows, are what it pays for.
    When the last commit of the store is this handle's own, what that transaction read and
    wrote is still what the store holds: the next one reads it without asking SQLite, so it
    runs no BEGIN either, and its one INSERT is SQLite's transaction (test_late_begin.py)."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    other = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")  # another handle: its own connection
    assert db._store is not other._store  # type: ignore[attr-defined]
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"first")  # creates the queue (and its metadata version) ...
    q.enqueue(db, b"second")  # ... which this one reads the settings at, and caches them
    q.enqueue(other, b"third")  # the last commit is another handle's: db must read again
    conn = db._store.conn  # type: ignore[attr-defined]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        q.enqueue(db, b"fourth")
        verbs = [s.split()[0] for s in statements]
        assert verbs == ["BEGIN", "SELECT", "INSERT", "COMMIT"], statements
        statements.clear()
        q.enqueue(db, b"fifth")  # the last commit is db's own: nothing to ask
        verbs = [s.split()[0] for s in statements]
        assert verbs == ["INSERT"], statements
    finally:
        conn.set_trace_callback(None)
    assert [m.payload for m in q.browse(db)] == [b"first", b"second", b"third", b"fourth", b"fifth"]
    assert q.size(db) == q.size(other) == 5
    other.close()
    db.close()


def test_what_a_commit_read_is_asked_again_once_anyone_else_commits(tmp_path: Path) -> None:
    """A counter read and added to by turns through two handles and another process: each
    transaction sees every commit before it, whoever made it (the values a handle keeps from
    its own last commit answer only while no other commit followed it)."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    one, two = fdbqueue.open(url), fdbqueue.open(url)
    ONE = struct.pack("<q", 1)

    @fdbqueue.transactional
    def bump(tr: fdbqueue.Transaction) -> int:
        seen = tr[b"atomic"]
        tr.add(b"atomic", ONE)
        tr[b"rmw"] = str(int(tr[b"rmw"] or b"0") + 1).encode()
        return 0 if seen is None else struct.unpack("<q", seen)[0]

    assert [bump(one), bump(one), bump(two), bump(one), bump(two), bump(two), bump(one)] == list(range(7))
    child = subprocess.run(
        [sys.executable, "-c", CHILD, "counters", url, "5"], capture_output=True, text=True, timeout=120
    )
    assert child.returncode == 0, child.stderr
    assert bump(one) == 7 + 5 and bump(two) == 13 and bump(one) == 14
    # A transaction that does not commit leaves nothing for the next to trust.
    tr = one.create_transaction()
    tr.add(b"atomic", ONE)
    tr[b"rmw"] = b"not committed"
    tr.cancel()
    assert bump(one) == 15 and one[b"rmw"] == b"16"
    assert struct.unpack("<q", two[b"atomic"])[0] == 16
    one.close()
    two.close()


def test_what_a_commit_wrote_is_read_back_without_asking_until_anyone_else_commits(tmp_path: Path) -> None:
    """A key one transaction wrote (never read) is what the store holds after its commit: the
    handle's next transaction reads it back without a SELECT (a lease's record, read by its
    ack), and asks SQLite again once another handle has committed."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    one, two = fdbqueue.open(url), fdbqueue.open(url)
    one[b"seed"] = b"0"
    conn = one._store.conn  # type: ignore[attr-defined]
    statements: list[str] = []

    @fdbqueue.transactional
    def write(tr: fdbqueue.Transaction, key: bytes, value: bytes | None) -> None:
        assert tr[b"seed"] is not None  # a read, so that the commit keeps what it saw
        if value is None:
            del tr[key]
        else:
            tr[key] = value

    @fdbqueue.transactional
    def read(tr: fdbqueue.Transaction, key: bytes) -> bytes | None:
        return tr[key]

    conn.set_trace_callback(statements.append)
    try:
        write(one, b"k", b"v1")
        statements.clear()
        assert read(one, b"k") == b"v1"
        assert statements == [], statements  # nothing asked of SQLite: not even BEGIN
        write(one, b"k", None)
        assert read(one, b"k") is None
        write(one, b"k", b"v2")
        write(two, b"k", b"theirs")  # another handle's commit: one must ask again
        statements.clear()
        assert read(one, b"k") == b"theirs"
        assert "SELECT" in [s.split()[0] for s in statements], statements
    finally:
        conn.set_trace_callback(None)
    # A transaction that does not commit leaves nothing to trust.
    write(one, b"k", b"v3")
    tr = one.create_transaction()
    tr[b"k"] = b"not committed"
    tr.cancel()
    assert read(one, b"k") == b"v3" and read(two, b"k") == b"v3"
    one.close()
    two.close()
