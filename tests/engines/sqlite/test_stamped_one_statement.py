"""A commit that asked SQLite nothing before it (its reads kept from its handle's last commit,
or none) takes its version first, so its versionstamped rows are filled before any statement
and go into the one multi-row INSERT with its sets: a journaled enqueue is one statement, a
journaled dequeue, lease or ack BEGIN, its clears, one INSERT, COMMIT. These tests try to
break that: the stamped rows must still win over a set or a clear of the key they fill to,
apply all or nothing, and carry the commit's own stamp."""

from __future__ import annotations

import sqlite3
import struct
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.sqlite import writes as sqlite_writes
from fdbqueue.errors import QueueError
from tests.support.sqlite_files import STAMP as _STAMP
from tests.support.sqlite_files import stored as _stored
from tests.support.sqlite_files import template as _template

_VALUE_TEMPLATE = b"\0" * 10 + struct.pack("<I", 0)  # a value that is the stamp


def _verbs(db: fdbqueue.Database, body: object) -> list[str]:
    conn = db._store.conn  # type: ignore[attr-defined]
    statements: list[str] = []
    conn.set_trace_callback(statements.append)
    try:
        body()  # type: ignore[operator]
    finally:
        conn.set_trace_callback(None)
    return [s.split()[0] for s in statements]


@pytest.fixture
def fixed_stamp(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sqlite_writes, "make_versionstamp", lambda version, batch=0: _STAMP)


def test_a_journaled_enqueue_after_its_own_commit_is_one_insert(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = fdbqueue.Queue("jobs")
    ids = [q.enqueue(db, b"first"), q.enqueue(db, b"second")]
    verbs = _verbs(db, lambda: ids.append(q.enqueue(db, b"third")))
    assert verbs == ["INSERT"], verbs
    assert [e.message_id for e in fdbqueue.journal(db, "jobs") if e.op == "enqueue"] == ids
    assert [[e.op for e in fdbqueue.history(db, i)] for i in ids] == [["enqueue"]] * 3
    db.close()


def test_a_journaled_dequeue_lease_and_ack_put_their_stamped_rows_in_the_one_insert(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = fdbqueue.Queue("jobs")
    ids = q.enqueue_many(db, [b"a", b"b", b"c", b"d"])

    @fdbqueue.transactional
    def take(tr: fdbqueue.Transaction) -> fdbqueue.Message | None:
        return q.dequeue(tr)

    take(db)
    verbs = _verbs(db, lambda: take(db))
    assert verbs == ["BEGIN", "DELETE", "INSERT", "COMMIT"], verbs
    m = q.lease(db, 30)
    assert m is not None
    q.ack(db, m)
    leased: list[fdbqueue.Message | None] = []
    verbs = _verbs(db, lambda: leased.append(q.lease(db, 30)))
    assert verbs == ["BEGIN", "DELETE", "INSERT", "COMMIT"], verbs
    last = leased[0]
    assert last is not None
    verbs = _verbs(db, lambda: q.ack(db, last))
    assert verbs[0] == "BEGIN" and verbs[-2:] == ["INSERT", "COMMIT"] and verbs.count("INSERT") == 1, verbs
    assert [[e.op for e in fdbqueue.history(db, i)] for i in ids] == [
        ["enqueue", "dequeue"],
        ["enqueue", "dequeue"],
        ["enqueue", "lease", "ack"],
        ["enqueue", "lease", "ack"],
    ]
    ops = [e.op for e in fdbqueue.journal(db, "jobs") if e.message_id is not None]
    assert ops == ["enqueue"] * 4 + ["dequeue"] * 2 + ["lease", "ack"] * 2
    db.close()


@pytest.mark.usefixtures("fixed_stamp")
@pytest.mark.parametrize("first", ["set", "clear"])
def test_a_stamped_key_filling_to_a_key_set_or_cleared_wins_in_one_insert(tmp_path: Path, first: str) -> None:
    """No read before (so no BEGIN): the set or clear and the stamped row share the one commit;
    the stamped row comes last, as when it had a statement of its own."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    k = b"w" + _STAMP
    try:
        db[k] = b"old"
        tr = db.create_transaction()
        if first == "set":
            tr.set(k, b"set first")
        else:
            tr.clear(k)
        tr.set(b"other", b"o")
        tr.set_versionstamped_key(_template(b"w"), b"stamped last")
        verbs = _verbs(db, tr.commit)
        assert verbs.count("INSERT") == 1 and "SELECT" not in verbs, verbs
        assert _stored(path, k) == b"stamped last"
        assert _stored(path, b"other") == b"o"
        tr = db.create_transaction()
        assert tr.get(k) == b"stamped last"
        tr.commit()
    finally:
        db.close()


@pytest.mark.usefixtures("fixed_stamp")
@pytest.mark.parametrize("first", ["set", "clear"])
def test_a_stamped_value_on_a_key_set_or_cleared_wins_in_the_one_insert(tmp_path: Path, first: str) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    try:
        db[b"bell"] = b"x" * 10
        tr = db.create_transaction()
        if first == "set":
            tr.set(b"bell", b"set")
        else:
            tr.clear(b"bell")
        tr.set_versionstamped_value(b"bell", _VALUE_TEMPLATE)
        tr.commit()
        assert _stored(path, b"bell") == _STAMP
    finally:
        db.close()


@pytest.mark.usefixtures("fixed_stamp")
def test_two_stamped_keys_filling_to_one_key_the_last_wins(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    try:
        tr = db.create_transaction()
        tr.set(b"a", b"1")
        tr.set_versionstamped_key(_template(b"t"), b"first")
        tr.set_versionstamped_key(_template(b"t"), b"second")
        tr.commit()
        assert _stored(path, b"t" + _STAMP) == b"second"
    finally:
        db.close()


def test_the_rows_carry_the_commits_own_stamp(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    try:
        stamps = []
        for i in range(3):
            tr = db.create_transaction()
            tr.set(b"n%d" % i, b"v")
            tr.set_versionstamped_key(_template(b"s"), b"%d" % i)
            tr.set_versionstamped_value(b"bell", _VALUE_TEMPLATE)
            tr.commit()
            stamp = tr.get_versionstamp().wait()
            assert int.from_bytes(stamp[:8], "big") == tr.get_committed_version()
            assert _stored(path, b"s" + stamp) == b"%d" % i
            assert _stored(path, b"bell") == stamp
            stamps.append(stamp)
        assert stamps == sorted(stamps) and len(set(stamps)) == 3
    finally:
        db.close()


@pytest.mark.parametrize("clear", [False, True])
def test_a_failed_one_insert_applies_nothing(tmp_path: Path, clear: bool) -> None:
    """The stored rows refuse the stamped one (a trigger, a real SQLite failure of the
    statement): neither the sets, nor the clears, nor any stamped row is applied; the next
    commit of the handle writes as before."""
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    try:
        db[b"gone"] = b"still here"
        conn = sqlite3.connect(path)
        conn.execute(
            "CREATE TRIGGER refuse BEFORE INSERT ON kv WHEN NEW.v = x'626164' "
            "BEGIN SELECT RAISE(ABORT, 'refused'); END"
        )
        conn.commit()
        conn.close()
        tr = db.create_transaction()
        tr.set(b"a", b"1")
        if clear:
            tr.clear(b"gone")
        tr.set_versionstamped_value(b"bell", _VALUE_TEMPLATE)
        tr.set_versionstamped_key(_template(b"s"), b"bad")
        with pytest.raises(QueueError):
            tr.commit()
        assert _stored(path, b"a") is None
        assert _stored(path, b"gone") == b"still here"
        assert _stored(path, b"bell") is None
        tr = db.create_transaction()
        tr.set(b"b", b"2")
        tr.set_versionstamped_value(b"bell", _VALUE_TEMPLATE)
        tr.commit()
        assert _stored(path, b"b") == b"2"
        assert _stored(path, b"bell") == tr.get_versionstamp().wait()
        assert _stored(path, b"a") is None and _stored(path, b"gone") == b"still here"
    finally:
        db.close()


def test_more_rows_than_one_insert_holds_all_land(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    db = fdbqueue.open(f"sqlite://{path}")
    try:
        bound = sqlite_writes.ONE_UP_TO
        for sets in (bound - 3, bound - 2, bound + 5):
            tr = db.create_transaction()
            for i in range(sets):
                tr.set(b"k%05d" % i, b"%d" % sets)
            for p in (b"x", b"y", b"z"):
                tr.set_versionstamped_key(_template(p), b"%d" % sets)
            tr.commit()
            stamp = tr.get_versionstamp().wait()
            assert all(_stored(path, b"k%05d" % i) == b"%d" % sets for i in (0, sets - 1))
            assert all(_stored(path, p + stamp) == b"%d" % sets for p in (b"x", b"y", b"z"))
    finally:
        db.close()


def test_dequeues_from_a_kept_head_journal_each_delivery(tmp_path: Path) -> None:
    """``dequeue(tr)`` after ``dequeue(tr)`` of one handle (its head kept between them, no
    SELECT): each entry says ``dequeue`` with the message's deliveries counted, one nacked
    before included, and the raw entry is json.dumps of its fields."""
    import json

    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True, retry_delay=0.0)
    q = fdbqueue.Queue("jobs")
    ids = q.enqueue_many(db, [b"a", b"b", b"c", b"d", b"e"])
    m = q.lease(db, 30)
    assert m is not None and m.id == ids[0]
    q.nack(db, m)  # back at the head, delivered once

    @fdbqueue.transactional
    def take(tr: fdbqueue.Transaction) -> fdbqueue.Message | None:
        return q.dequeue(tr)

    got = [take(db), take(db)]
    verbs = _verbs(db, lambda: got.append(take(db)))
    assert "SELECT" not in verbs, verbs
    got += [take(db), take(db)]
    assert sorted(g.id for g in got if g is not None) == sorted(ids)
    entries = [e for e in fdbqueue.journal(db, "jobs") if e.op == "dequeue"]
    assert {e.message_id: e.deliveries for e in entries} == {i: 2 if i == ids[0] else 1 for i in ids}
    assert [e.message_id for e in entries] == [g.id for g in got if g is not None]
    conn = sqlite3.connect(tmp_path / "q.db")
    try:
        raws = [bytes(v) for (v,) in conn.execute("SELECT v FROM kv") if bytes(v).startswith(b'[1,"dequeue"')]
    finally:
        conn.close()
    assert len(raws) == 5
    for raw in raws:
        fields = json.loads(raw)
        assert raw == json.dumps(fields, separators=(",", ":")).encode()
    db.close()
