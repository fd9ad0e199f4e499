"""A transaction that asks SQLite nothing until its commit (its reads all answered by what its
handle's last commit kept, or no reads at all) runs no ``BEGIN``: its writes go in at commit,
as one statement (SQLite's own transaction) when one statement holds them. Each case here is
one where a wrong rule would lose a write, apply one twice, or read a value the store no
longer holds."""

from __future__ import annotations

import os
import sqlite3
import struct
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import EngineError
from fdbqueue.engines import versions
from fdbqueue.errors import NestedTransactionError

ONE = struct.pack("<q", 1)


def _count(value: bytes | None) -> int:
    return 0 if value is None else struct.unpack("<q", value)[0]


def _statements(db: fdbqueue.Database) -> tuple[list[str], sqlite3.Connection]:
    conn = db._store.conn  # type: ignore[attr-defined]
    seen: list[str] = []
    conn.set_trace_callback(seen.append)
    return seen, conn


@fdbqueue.transactional
def _read_and_add(tr: fdbqueue.Transaction) -> int:
    seen = _count(tr[b"n"])  # a read: the commit keeps what it saw, with its write
    tr.add(b"n", ONE)
    return seen


@fdbqueue.transactional
def _add(tr: fdbqueue.Transaction) -> None:
    tr.add(b"n", ONE)  # resolved against the stored value: kept, or asked of SQLite


def test_a_transaction_answered_from_kept_values_runs_no_begin(tmp_path: Path) -> None:
    """An enqueue after this handle's own enqueue, an add after its own commit, and a read of
    what it kept: one INSERT, or nothing at all, where BEGIN ... COMMIT ran before."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"first")
    q.enqueue(db, b"second")
    statements, conn = _statements(db)
    try:
        q.enqueue(db, b"third")
        assert [s.split()[0] for s in statements] == ["INSERT"], statements
        _read_and_add(db)
        statements.clear()
        _add(db)
        assert [s.split()[0] for s in statements] == ["INSERT"], statements
        statements.clear()

        @fdbqueue.transactional
        def read(tr: fdbqueue.Transaction) -> bytes | None:
            return tr[b"n"]

        assert _count(read(db)) == 2
        assert statements == [], statements  # read from memory: nothing begun, nothing to commit
    finally:
        conn.set_trace_callback(None)
    assert [m.payload for m in q.browse(db)] == [b"first", b"second", b"third"]
    assert _count(db[b"n"]) == 2
    db.close()


def test_a_blind_commit_between_other_handles_and_processes_commits_loses_nothing(tmp_path: Path) -> None:
    """Adds through one handle whose reads would come from memory, with another handle's and
    another process's commits in between: every add lands exactly once."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    one, two = fdbqueue.open(url), fdbqueue.open(url)
    try:
        assert _read_and_add(one) == 0
        _add(one)  # kept: one statement
        _add(two)  # another handle's commit: one's kept values are stale now
        _add(one)
        child = subprocess.run(
            [
                sys.executable,
                "-c",
                "import struct, sys, fdbqueue\n"
                "from fdbqueue.engines.transactional import run_transaction\n"
                "db = fdbqueue.open(sys.argv[1])\n"
                "for _ in range(5):\n"
                "    run_transaction(db, lambda tr: tr.add(b'n', struct.pack('<q', 1)))\n",
                url,
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert child.returncode == 0, child.stderr
        _add(one)
        _add(one)
        assert _count(two[b"n"]) == 4 + 5 + 2
        assert _read_and_add(two) == 11 and _count(one[b"n"]) == 12
    finally:
        one.close()
        two.close()


def test_a_one_statement_commit_that_fails_applies_nothing_and_its_retry_applies_it_once(
    tmp_path: Path,
) -> None:
    """A writer outside fdbqueue holds SQLite's write lock: the commit's one statement is
    refused (1020, retryable), applies nothing and leaves nothing kept; the retry loop's next
    attempt, once the writer is gone, applies the add exactly once."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}?sync=normal&lock_timeout=0.2")
    try:
        _read_and_add(db)
        foreign = sqlite3.connect(path, isolation_level=None, timeout=5, check_same_thread=False)
        foreign.execute("BEGIN IMMEDIATE")
        statements, conn = _statements(db)
        try:
            tr = db.create_transaction()
            tr.add(b"n", ONE)
            with pytest.raises(EngineError) as caught:
                tr.commit()
            assert caught.value.retryable
            assert [s.split()[0] for s in statements] == ["INSERT"], statements
        finally:
            conn.set_trace_callback(None)
        assert _count(db[b"n"]) == 1  # nothing applied (and read from SQLite, nothing kept)
        timer = threading.Timer(0.5, foreign.execute, ("COMMIT",))
        timer.start()
        try:
            _add(db)  # the first attempts fail as above; one after the writer ends lands
        finally:
            timer.join()
        foreign.close()
        assert _count(db[b"n"]) == 2
        _add(db)
        assert _count(db[b"n"]) == 3
    finally:
        db.close()


# Another process, with the takeover window shortened to 0.3 s, that takes the store lock over
# from a holder sitting on it, and adds 10.
_TAKEOVER = r"""
import struct, sys
from fdbqueue.engines.sqlite import storelock
storelock.WINDOW = 0.3
import fdbqueue
db = fdbqueue.open(sys.argv[1])
tr = db.create_transaction()
tr.add(b"n", struct.pack("<q", 10))
tr.commit()
"""


def test_a_blind_commit_whose_store_lock_was_taken_over_applies_nothing(tmp_path: Path) -> None:
    """A transaction that took its kept values, wrote from them and sat on the store lock past
    the window: another process takes the lock over and commits. Its commit (which asked
    SQLite nothing, so no snapshot of SQLite's could refuse it) must fail, not apply an add
    resolved against the old value over the new one."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    try:
        _read_and_add(db)  # n = 1, kept
        tr = db.create_transaction()
        tr.add(b"n", ONE)  # from the kept value: n = 2 in its write map
        child = subprocess.run(
            [sys.executable, "-c", _TAKEOVER, url], capture_output=True, text=True, timeout=60
        )
        assert child.returncode == 0, child.stderr
        with pytest.raises(EngineError) as caught:
            tr.commit()
        assert caught.value.code == 1007
        assert _count(db[b"n"]) == 11
        _add(db)
        assert _count(db[b"n"]) == 12
    finally:
        db.close()


def test_a_nested_reader_inside_a_transaction_that_began_nothing_in_sqlite(tmp_path: Path) -> None:
    """The outer transaction holds the store lock with no SQLite transaction open: a read on
    the same thread still reads the last committed state (a snapshot of its own), a nested
    write is still refused, and the outer one commits."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        _read_and_add(db)
        tr = db.create_transaction()
        tr.add(b"n", ONE)
        assert _count(db[b"n"]) == 1  # nested: the committed value, not the outer's write
        with pytest.raises(NestedTransactionError):
            db[b"other"] = b"x"
        tr.commit()
        assert _count(db[b"n"]) == 2 and db[b"other"] is None
    finally:
        db.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_commits_between_the_parents_blind_commits(tmp_path: Path) -> None:
    """The child of a fork adds through the handle it inherited (reopened there); the parent's
    next add, whose kept value the child's commit made stale, still counts it."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        _read_and_add(db)
        _add(db)
        pid = os.fork()
        if pid == 0:  # the child
            code = 1
            try:
                for _ in range(3):
                    _add(db)
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        _add(db)
        assert _count(db[b"n"]) == 2 + 3 + 1
    finally:
        db.close()


def test_a_commit_that_raises_the_version_reservation_writes_it_with_the_rows(tmp_path: Path) -> None:
    """Once a second of versions has passed, a commit raises meta's reservation in the same
    SQLite transaction as its rows (BEGIN, UPDATE, INSERT, COMMIT): every committed version
    stays at or below the reservation."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}?sync=normal")
    try:
        _read_and_add(db)
        versions.advance(3_000_000)  # three seconds of versions on
        statements, conn = _statements(db)
        try:
            tr = db.create_transaction()
            tr.add(b"n", ONE)
            tr.commit()
            version = tr.get_committed_version()
            verbs = [s.split()[0] for s in statements]
            assert verbs[0] == "BEGIN" and verbs[-1] == "COMMIT", statements
            assert sorted(verbs[1:-1]) == ["INSERT", "UPDATE"], statements
        finally:
            conn.set_trace_callback(None)
        raw = sqlite3.connect(path)
        try:
            reserved = int(raw.execute("SELECT value FROM meta WHERE name = 'version'").fetchone()[0])
        finally:
            raw.close()
        assert version <= reserved
        assert _count(db[b"n"]) == 2
    finally:
        db.close()


def test_a_blind_commit_checks_the_clock_still_names_the_commit_its_values_came_from(tmp_path: Path) -> None:
    """The check after the pin, on its own: the lock file's clock made to name another commit
    (what no holder but this one could do while it holds the store lock) between the begin
    and the commit. The commit refuses (1007) and applies nothing; the next one reads
    SQLite again."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        _read_and_add(db)
        tr = db.create_transaction()
        tr.add(b"n", ONE)  # begun: the kept values taken
        page = db._store.page  # type: ignore[attr-defined]
        tag, last, meta, pending, base = page.clock()
        page.set_clock(tag, last + 1, meta, pending, base, 0)
        with pytest.raises(EngineError) as caught:
            tr.commit()
        assert caught.value.code == 1007
        assert _count(db[b"n"]) == 1
        _add(db)
        assert _count(db[b"n"]) == 2
    finally:
        db.close()


def test_commits_of_sets_and_clears_land_whole_in_one_statement_or_in_batches(tmp_path: Path) -> None:
    """An ack's shape (a few sets and clears, after this handle's own commit: BEGIN, one
    INSERT, the DELETEs, COMMIT) and a commit of more rows than one INSERT holds (written in
    batches) with clears among them: every set lands, every clear removes, nothing else moves;
    another handle's commit between the two is seen."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    other = fdbqueue.open(url)

    @fdbqueue.transactional
    def fill(tr: fdbqueue.Transaction) -> None:
        for i in range(10):
            tr[b"k%03d" % i] = b"v"

    @fdbqueue.transactional
    def ack_shape(tr: fdbqueue.Transaction) -> None:
        tr[b"c1"] = b"x"
        tr[b"c2"] = b"y"
        del tr[b"k001"]
        del tr[b"k002"]

    fill(db)
    statements, conn = _statements(db)
    try:
        ack_shape(db)
        assert [s.split()[0] for s in statements] == ["BEGIN", "INSERT", "DELETE", "DELETE", "COMMIT"], (
            statements
        )
    finally:
        conn.set_trace_callback(None)
    other[b"k003"] = b"theirs"  # another handle commits between

    @fdbqueue.transactional
    def many(tr: fdbqueue.Transaction) -> None:
        for i in range(700):  # past one INSERT's rows (250): several statements
            tr[b"m%04d" % i] = b"%d" % i
        del tr[b"k004"]
        del tr[b"m0005"]  # a key set earlier in this transaction, then cleared

    many(db)
    rows = dict(db.get_range(b"", b"\xff"))  # type: ignore[attr-defined]
    assert rows[b"c1"] == b"x" and rows[b"c2"] == b"y" and rows[b"k003"] == b"theirs"
    assert not {b"k001", b"k002", b"k004", b"m0005"} & rows.keys()
    assert {k for k in rows if k.startswith(b"m")} == {b"m%04d" % i for i in range(700)} - {b"m0005"}
    assert all(rows[b"m%04d" % i] == b"%d" % i for i in range(700) if i != 5)
    assert len(rows) == 2 + 7 + 699
    db.close()
    other.close()
