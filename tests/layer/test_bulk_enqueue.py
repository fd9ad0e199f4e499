"""``enqueue_many`` with ``NewMessage`` items: options per message and a dedup key per message,
what a bulk load (the Spark writer) needs to enqueue each row exactly once."""

from __future__ import annotations

import pytest

import fdbqueue
from fdbqueue import Database, NewMessage, Queue, QueueError, Transaction
from fdbqueue.errors import DedupKeyTooLargeError


def drain(q: Queue, db: Database) -> list[tuple[bytes, int, dict[str, object]]]:
    out = []
    while (m := q.dequeue(db)) is not None:
        out.append((m.payload, m.priority, dict(m.headers)))
    return out


def test_each_item_keeps_its_own_options(db: Database) -> None:
    q = Queue("bulk")
    ids = q.enqueue_many(
        db,
        [
            NewMessage("low"),
            NewMessage("high", priority=7, headers={"tenant": "a"}),
            "plain",
            NewMessage("later", delay=3600),
            NewMessage("short", ttl=600),
        ],
        headers={"batch": "1"},
    )
    assert len(set(ids)) == 5
    assert drain(q, db) == [
        (b"high", 7, {"tenant": "a"}),
        (b"low", 0, {"batch": "1"}),
        (b"plain", 0, {"batch": "1"}),
        (b"short", 0, {"batch": "1"}),
    ]
    assert fdbqueue.queue_stats(db, "bulk").delayed == 1


def test_dedup_keys_per_item_within_the_batch_and_across_calls(db: Database) -> None:
    q = Queue("bulk")
    first = q.enqueue_many(db, [NewMessage("a", dedup_key="k1"), NewMessage("b", dedup_key="k2"), "c"])
    again = q.enqueue_many(
        db,
        [NewMessage("a2", dedup_key="k1"), NewMessage("d", dedup_key="k3"), NewMessage("d2", dedup_key="k3")],
    )
    assert again[0] == first[0]
    assert again[1] == again[2] and again[1] not in first
    assert q.enqueue(db, "single", dedup_key="k2") == first[1]
    assert q.enqueue_many(db, [NewMessage("x", dedup_key="k1"), NewMessage("y", dedup_key="k2")]) == first[:2]
    assert [p for p, _, _ in drain(q, db)] == [b"a", b"b", b"c", b"d"]
    assert fdbqueue.queue_stats(db, "bulk").made_ready == 4


def test_dedup_inside_a_callers_transaction_composes(db: Database) -> None:
    q = Queue("bulk")

    @fdbqueue.transactional
    def body(tr: Transaction) -> list[str]:
        return q.enqueue_many(tr, [NewMessage("a", dedup_key="k"), NewMessage("b", dedup_key="k")])

    ids = body(db)
    assert ids[0] == ids[1]
    assert fdbqueue.queue_stats(db, "bulk").ready == 1


def test_bad_items_are_refused_and_nothing_is_written(db: Database) -> None:
    q = Queue("bulk")
    with pytest.raises(QueueError, match="priority must be an int"):
        q.enqueue_many(db, [NewMessage("a"), NewMessage("b", priority="high")])  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="dedup_key must be a non-empty str"):
        q.enqueue_many(db, [NewMessage("a", dedup_key="")])
    with pytest.raises(DedupKeyTooLargeError):
        q.enqueue_many(db, [NewMessage("a", dedup_key="k" * 100_000)])
    assert q.size(db) == 0 and "bulk" not in fdbqueue.list_queues(db)
