"""``move``: ready messages from one queue to another of the same database, each in one
transaction, keeping what they were; exactly once across commit_unknown_result."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, Queue, QueueError, QueueNotFoundError
from fdbqueue.engines.contract import Database
from fdbqueue.store.clock import fake_clock
from fdbqueue.testing import FaultScript


def test_moved_messages_keep_what_they_were(db: Database) -> None:
    src, dst = Queue("jobs.error"), Queue("jobs")
    big = b"b" * 25_000  # chunked
    ids = [
        src.enqueue(db, b"one", headers={"k": "a"}),
        src.enqueue(db, big, priority=5, headers={"k": "b"}, ttl=3600.0),
        src.enqueue(db, {"three": 3}),
    ]
    m = src.lease(db)  # a delivery counted: kept across the move
    assert m is not None and m.id == ids[1]
    src.nack(db, m, delay=0.0)
    before = {i: src.get(db, i) for i in ids}
    assert fdbqueue.move(db, "jobs.error", "jobs") == 3
    assert src.size(db) == 0 and dst.size(db) == 3
    got = [dst.dequeue(db) for _ in ids]
    assert [g.id for g in got if g is not None] == [ids[1], ids[0], ids[2]]  # dequeue order
    for g in got:
        assert g is not None
        b = before[g.id]
        assert b is not None
        assert (g.payload, g.headers, g.priority, g.enqueued_at) == (
            b.payload,
            b.headers,
            b.priority,
            b.enqueued_at,
        )
        assert g.deliveries == b.deliveries + 1  # this dequeue's
        assert (g.expires_at is None) == (b.expires_at is None)
    assert got[0] is not None and got[0].payload == big


def test_where_limit_and_leased_or_delayed_messages_stay(db: Database) -> None:
    src = Queue("src")
    for i in range(6):
        src.enqueue(db, b"%d" % i, headers={"n": str(i % 2)})
    src.enqueue(db, b"later", delay=60.0)
    held = src.lease(db)
    assert held is not None
    assert fdbqueue.move(db, "src", "odd", where={"n": "1"}) == 3 - (held.headers["n"] == "1")
    assert fdbqueue.move(db, "src", "rest", limit=1) == 1
    assert all(h["n"] == "1" for h in (m.headers for m in Queue("odd").browse(db)))
    src.ack(db, held)  # its lease is still valid where it was
    assert fdbqueue.queue_stats(db, "src").delayed == 1


def test_in_a_transaction_it_commits_or_aborts_with_it(db: Database) -> None:
    src = Queue("src")
    src.enqueue_many(db, [b"1", b"2"])
    tr = db.create_transaction()
    assert fdbqueue.move(tr, "src", "dst") == 2
    tr.cancel()
    assert src.size(db) == 2 and Queue("dst").size(db) == 0


def test_batches_and_the_journal_on_both_queues(monkeypatch: pytest.MonkeyPatch) -> None:
    import fdbqueue.api.transfer as moving

    monkeypatch.setattr(moving, "BATCH", 3)
    db = fdbqueue.open("memory://")
    fdbqueue.create_queue(db, "src", journal=True)
    fdbqueue.create_queue(db, "dst", journal=True)
    ids = Queue("src").enqueue_many(db, [b"%d" % i for i in range(8)])
    assert fdbqueue.move(db, "src", "dst") == 8
    assert [m.id for m in Queue("dst").browse(db)] == ids
    for mid in ids:
        life = [(e.op, e.queue, e.details) for e in fdbqueue.history(db, mid)]
        assert life == [
            ("enqueue", "src", {}),
            ("move_out", "src", {"to": "dst"}),
            ("move_in", "dst", {"origin": "src"}),
        ]
    commits = {e.version[:10] for e in fdbqueue.journal(db, "src") if e.op == "move_out"}
    assert len(commits) == 3  # 3 + 3 + 2


def test_a_commit_unknown_result_that_landed_moves_once() -> None:
    db = fdbqueue.open("sim://?seed=4&faults=0")
    Queue("src").enqueue_many(db, [b"1", b"2"])
    script = FaultScript(db)
    script.arm([("1021", True)])
    assert fdbqueue.move(db, "src", "dst") == 2
    assert Queue("dst").size(db) == 2 and Queue("src").size(db) == 0


def test_rights_and_bad_arguments(tmp_path: Any) -> None:
    url = f"sqlite:///{tmp_path / 'q.db'}"
    owner = fdbqueue.open(url, principal="ops")
    other = fdbqueue.open(url, principal="svc")
    fdbqueue.create_queue(owner, "src", owner="ops")
    Queue("src").enqueue(owner, b"x")
    with pytest.raises(AccessDeniedError, match="'admin'"):
        fdbqueue.move(other, "src", "dst")
    fdbqueue.create_queue(owner, "dst", owner="ops")
    fdbqueue.grant(owner, "src", "svc", ["admin"])
    with pytest.raises(AccessDeniedError, match="'enqueue' on queue 'dst'"):
        fdbqueue.move(other, "src", "dst")
    fdbqueue.grant(owner, "dst", "svc", ["enqueue"])
    assert fdbqueue.move(other, "src", "dst") == 1
    with pytest.raises(QueueError, match="two queues"):
        fdbqueue.move(owner, "src", "src")
    with pytest.raises(QueueError, match="limit"):
        fdbqueue.move(owner, "src", "dst", limit=-1)
    with pytest.raises(QueueNotFoundError):
        fdbqueue.move(owner, "nope", "dst")


def test_expired_messages_are_not_moved(db: Database) -> None:
    with fake_clock() as clock:
        Queue("src").enqueue(db, b"short", ttl=1.0)
        Queue("src").enqueue(db, b"long")
        clock.advance(2.0)
        assert fdbqueue.move(db, "src", "dst") == 1
        got = Queue("dst").dequeue(db)
        assert got is not None and got.payload == b"long"


def test_the_command_line(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert main(["--url", url, "enqueue", "a", "x", "y", "--header", "k=v"]) == 0
    assert main(["--url", url, "enqueue", "a", "z"]) == 0
    capsys.readouterr()
    assert main(["--url", url, "move", "a", "b", "--where", "k=v", "--limit", "1"]) == 0
    assert capsys.readouterr().out.strip() == "moved 1 message from a to b"
    assert main(["--url", url, "move", "a", "b"]) == 0
    assert capsys.readouterr().out.strip() == "moved 2 messages from a to b"
    assert main(["--url", url, "move", "a", "a"]) == 2
    assert "two queues" in capsys.readouterr().err


def test_move_and_redrive_keep_every_field(db: Database) -> None:
    """Field by field: what a move or a redrive keeps, exactly (issue 29: enqueued_at too)."""
    fdbqueue.create_queue(db, "jobs", max_deliveries=2)
    q, err = Queue("jobs"), Queue("jobs.error")
    ids = [
        q.enqueue(db, b"plain"),
        q.enqueue(db, {"json": 1}, priority=5, headers={"k": "v", "n": 2}, ttl=3600.0),
        q.enqueue(db, "text", priority=-2, headers={"a": "b"}),
        q.enqueue(db, b"x" * 25_000, ttl=600.0),  # chunked
    ]
    m = q.lease(db)
    assert m is not None
    q.nack(db, m, delay=0.0)  # one delivery counted: kept by a move
    before = {i: q.get(db, i) for i in ids}

    def same(a: fdbqueue.Message | None, b: fdbqueue.Message | None, deliveries: int) -> None:
        assert a is not None and b is not None
        assert (a.id, a.payload, a.headers, a.priority, a.content_type) == (
            b.id,
            b.payload,
            b.headers,
            b.priority,
            b.content_type,
        )
        assert a.enqueued_at == b.enqueued_at  # exactly
        assert a.deliveries == deliveries
        if b.expires_at is None:
            assert a.expires_at is None
        else:  # the same expiry in database time, shown by the wall clock
            assert a.expires_at == pytest.approx(b.expires_at, abs=0.01)

    assert fdbqueue.move(db, "jobs", "other") == 4
    for i in ids:
        same(Queue("other").get(db, i), before[i], before[i].deliveries)  # type: ignore[union-attr]
    assert fdbqueue.move(db, "other", "jobs") == 4
    while err.size(db) < 4:  # each fails its deliveries: a dead letter
        got = q.lease(db)
        assert got is not None
        q.nack(db, got, delay=0.0)
    assert fdbqueue.redrive(db, "jobs.error") == 4
    for i in ids:
        b = before[i]
        assert b is not None
        a = q.get(db, i)
        assert a is not None and a.expires_at is None  # a dead letter keeps no TTL (documented)
        same(a, dataclasses.replace(b, expires_at=None), 0)
