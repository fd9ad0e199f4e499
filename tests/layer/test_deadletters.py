"""Dead-letter tools: ``redrive`` back to the origin (or ``to``), by filter and limit, journaled;
``Queue.delete`` in any state; the CLI's ``redrive`` and ``delete ... ID``. On every engine."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Database, LeaseError, Queue, QueueError


def _dead(db: Database, n: int, *, priority: int = 0, headers: dict[str, str] | None = None) -> list[str]:
    """``n`` messages of queue jobs (max_deliveries=1) dead-lettered by a nack."""
    q = Queue("jobs")
    ids = [q.enqueue(db, f"m{i}", priority=priority, headers=headers) for i in range(n)]
    for _ in range(n):
        m = q.lease(db)
        assert m is not None
        q.nack(db, m, reason="boom")
    return ids


def test_redrive_sends_dead_letters_back_to_their_origin_with_deliveries_reset(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1, journal=True)
    fdbqueue.create_queue(db, "jobs.error", journal=True)
    high = _dead(db, 2, priority=5)
    low = _dead(db, 1)
    assert fdbqueue.queue_stats(db, "jobs.error").ready == 3
    assert fdbqueue.redrive(db, "jobs.error") == 3
    assert fdbqueue.queue_stats(db, "jobs.error").ready == 0
    q = Queue("jobs")
    got = [q.dequeue(db) for _ in range(3)]
    assert [m.id for m in got if m] == high + low  # the priorities they had, then FIFO
    # Deliveries were reset: this dequeue is the first.
    assert [(m.priority, m.deliveries) for m in got if m] == [(5, 1), (5, 1), (0, 1)]
    ops = [e.op for e in fdbqueue.history(db, low[0])]
    assert ops == ["enqueue", "lease", "dead", "dead", "redrive", "redrive", "dequeue"]
    assert fdbqueue.redrive(db, "jobs.error") == 0


def test_redrive_by_filter_and_limit_and_to_another_queue(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    a = _dead(db, 3, headers={"tenant": "a"})
    b = _dead(db, 2, headers={"tenant": "b"})
    assert fdbqueue.redrive(db, "jobs.error", where={"tenant": "b"}, limit=1) == 1
    assert fdbqueue.redrive(db, "jobs.error", where={"tenant": "a"}, to="triage") == 3
    assert [m.id for m in Queue("triage").browse(db)] == a
    assert [m.id for m in Queue("jobs").browse(db)] == b[:1]
    assert [m.id for m in Queue("jobs.error").browse(db)] == b[1:]
    m = Queue("triage").dequeue(db)
    assert m is not None and m.reason is None and m.deliveries == 1


def test_redrive_by_id_in_batches(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    ids = _dead(db, 5)
    live = Queue("jobs").enqueue(db, b"live")  # in jobs, not a dead letter: passed
    # Two ids a transaction: the batches continue where the last stopped.
    monkeypatch.setattr(sys.modules["fdbqueue.api.redrive"], "BATCH", 2)
    asked = [ids[3], ids[0], live, "no-such-id", ids[0], ids[4]]
    assert fdbqueue.redrive(db, "jobs.error", ids=asked) == 3
    assert [m.id for m in Queue("jobs.error").browse(db)] == [ids[1], ids[2]]
    assert {m.id for m in Queue("jobs").browse(db)} == {live, ids[0], ids[3], ids[4]}
    assert fdbqueue.redrive(db, "jobs.error", ids=ids, limit=1, where={"x": "y"}) == 0  # no match
    assert fdbqueue.redrive(db, "jobs.error", ids=[ids[2], ids[1]], limit=1) == 1
    assert [m.id for m in Queue("jobs.error").browse(db)] == [ids[1]]
    for bad, text in (("abc", "list of message ids"), ([""], "non-empty"), ([3], "non-empty")):
        with pytest.raises(QueueError, match=text):
            fdbqueue.redrive(db, "jobs.error", ids=bad)  # type: ignore[arg-type]


def test_redrive_in_a_callers_transaction_composes(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    _dead(db, 2)

    @fdbqueue.transactional
    def undo(tr: fdbqueue.Transaction) -> None:
        assert fdbqueue.redrive(tr, "jobs.error") == 2
        raise RuntimeError("the caller aborts")

    with pytest.raises(RuntimeError):
        undo(db)
    assert fdbqueue.queue_stats(db, "jobs.error").ready == 2 and Queue("jobs").size(db) == 0


def test_redrive_refuses_bad_input(db: Database) -> None:
    with pytest.raises(fdbqueue.QueueNotFoundError):
        fdbqueue.redrive(db, "nope.error")
    fdbqueue.create_queue(db, "jobs")
    for kwargs, text in (
        ({"to": "jobs"}, "that is the queue it reads"),
        ({"limit": -1}, "limit must be an int"),
        ({"where": "tenant=a"}, "where"),
    ):
        with pytest.raises(QueueError, match=text):
            fdbqueue.redrive(db, "jobs", **kwargs)  # type: ignore[arg-type]


def test_delete_in_every_state(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    ready = q.enqueue(db, "ready", ttl=600)
    big = q.enqueue(db, b"x" * 50_000)  # in chunks
    delayed = q.enqueue(db, "delayed", delay=600)
    q.enqueue(db, "leased")
    leased = q.lease(db)
    assert leased is not None and leased.payload == b"ready"
    assert q.delete(db, ready)  # the one in flight
    assert q.delete(db, big) and q.delete(db, delayed)
    assert not q.delete(db, delayed) and not q.delete(db, "r00nothere")
    with pytest.raises(LeaseError):
        q.ack(db, leased)
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.ready, st.inflight, st.delayed) == (1, 0, 0)
    assert [m.payload for m in q.browse(db)] == [b"leased"]
    assert [e.op for e in fdbqueue.history(db, delayed)] == ["enqueue", "delete"]
    with pytest.raises(QueueError, match="message id"):
        q.delete(db, "")


def test_cli_redrive_and_delete_messages(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    _dead(db, 2, headers={"tenant": "a"})
    assert main(["--url", url, "redrive", "jobs.error", "--where", "tenant=a", "--limit", "1"]) == 0
    assert "redrove 1 message from jobs.error to their origin queues" in capsys.readouterr().out
    assert main(["--url", url, "redrive", "jobs.error", "--to", "triage"]) == 0
    assert "redrove 1 message from jobs.error to triage" in capsys.readouterr().out
    (m,) = list(Queue("jobs").browse(db))
    assert main(["--url", url, "delete", "jobs", m.id]) == 0
    assert "deleted 1 message from jobs" in capsys.readouterr().out
    assert main(["--url", url, "delete", "jobs", m.id]) == 1
    assert "no message" in capsys.readouterr().err
    assert main(["--url", url, "delete", "nosuch", m.id]) == 1  # an unknown queue says so, alone
    out, err = capsys.readouterr()
    assert (out, err.strip()) == ("", "fdbqueue: error: no queue named 'nosuch'")
    assert Queue("jobs").size(db) == 0 and Queue("triage").size(db) == 1
