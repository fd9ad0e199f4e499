"""The values a commit keeps for its handle's next transaction (``Store.keep``) after a commit
that also wrote versionstamped keys or values (a journaled operation writes three): kept only
where no stamped write landed on a key kept, so the next transaction reads what the store
holds; and a journaled enqueue then reads nothing of SQLite, as a plain one does."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.sqlite import writes as sqlite_writes
from tests.support.sqlite_files import STAMP as _STAMP
from tests.support.sqlite_files import stored as _stored
from tests.support.sqlite_files import template as _template


@pytest.fixture
def fixed_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_writes, "make_versionstamp", lambda version, batch=0: _STAMP)


@pytest.mark.usefixtures("fixed_stamp")
def test_a_stamped_key_landing_on_a_key_read_is_read_again_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    k = b"k" + _STAMP
    try:
        db[k] = b"old"
        tr = db.create_transaction()
        assert tr.get(k) == b"old"  # read: kept, unless a stamped write lands on it
        tr.set_versionstamped_key(_template(b"k"), b"new")
        tr.commit()
        assert _stored(path, k) == b"new"
        tr = db.create_transaction()
        assert tr.get(k) == b"new"
        tr.commit()
    finally:
        db.close()


@pytest.mark.usefixtures("fixed_stamp")
def test_a_stamped_key_landing_on_a_key_written_is_read_again_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    k = b"w" + _STAMP
    try:
        tr = db.create_transaction()
        tr.get(b"other")  # something read, so that the commit keeps
        tr.set(k, b"set first")  # written (kept beside the reads) ...
        tr.set_versionstamped_key(_template(b"w"), b"stamped last")  # ... and stamped over
        tr.commit()
        assert _stored(path, k) == b"stamped last"
        tr = db.create_transaction()
        assert tr.get(k) == b"stamped last"
        tr.commit()
    finally:
        db.close()


@pytest.mark.usefixtures("fixed_stamp")
def test_a_stamped_value_on_a_key_read_is_read_again_from_the_store(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    try:
        db[b"bell"] = b"x" * 10
        tr = db.create_transaction()
        tr.get(b"bell")
        tr.get(b"else")
        tr.set_versionstamped_value(b"bell", b"\0" * 10 + struct.pack("<I", 0))
        tr.commit()
        tr = db.create_transaction()
        assert tr.get(b"bell") == _stored(path, b"bell") == _STAMP
        assert tr.get(b"else") is None
        tr.commit()
    finally:
        db.close()


def test_reads_are_kept_past_a_commit_with_stamped_writes_elsewhere(tmp_path: Path) -> None:
    """What was read is kept, and the stamped rows are in the store, read from it."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    try:
        db[b"a"] = b"1"
        tr = db.create_transaction()
        tr.get(b"a")
        tr[b"a"] = b"2"
        tr.set_versionstamped_key(_template(b"s"), b"row")
        tr.commit()
        stamp = tr.get_versionstamp().wait()
        conn = db._store.conn  # type: ignore[attr-defined]
        statements: list[str] = []
        conn.set_trace_callback(statements.append)
        try:
            tr = db.create_transaction()
            assert tr.get(b"a") == b"2"
            tr[b"b"] = b"x"
            tr.commit()
            # no SELECT: "a" kept; nothing asked of SQLite before the commit, so its one set
            # is one statement (the late BEGIN, SqliteTransaction._write)
            assert [s.split()[0] for s in statements] == ["INSERT"], statements
        finally:
            conn.set_trace_callback(None)
        tr = db.create_transaction()
        assert tr.get(b"s" + stamp) == b"row"
        tr.commit()
    finally:
        db.close()


def test_a_journaled_enqueue_after_its_own_commit_reads_nothing(tmp_path: Path) -> None:
    """A journaled enqueue writes its message and its three stamped rows (entry, history
    pointer, bell); the next one of the same handle, the store's last commit being its own,
    runs no SELECT, as an unjournaled one does; the journal holds every entry."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = fdbqueue.Queue("jobs")
    ids = [q.enqueue(db, b"first"), q.enqueue(db, b"second")]
    conn = db._store.conn  # type: ignore[attr-defined]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        ids.append(q.enqueue(db, b"third"))
    finally:
        conn.set_trace_callback(None)
    verbs = [s.split()[0] for s in statements]
    # its sets and stamped rows in one INSERT (test_stamped_one_statement.py)
    assert verbs == ["INSERT"], statements
    entries = [e for e in fdbqueue.journal(db, "jobs") if e.op == "enqueue"]
    assert [e.message_id for e in entries] == ids
    assert [[e.op for e in fdbqueue.history(db, i)] for i in ids] == [["enqueue"]] * 3
    assert [m.payload for m in q.browse(db)] == [b"first", b"second", b"third"]
    db.close()
