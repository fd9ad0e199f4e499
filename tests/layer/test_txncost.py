"""The measuring wrapper the budget and round-trip tests rely on (scripts/txncost.py)."""

from __future__ import annotations

import fdbqueue
from fdbqueue.engines.transactional import run_transaction
from scripts.txncost import CountingDatabase


def test_size_counts_mutations_and_conflict_ranges_as_foundationdb_does() -> None:
    db = CountingDatabase(fdbqueue.open("memory://"))

    def body(tr: object) -> None:
        tr.set(b"k1", b"v" * 10)  # type: ignore[attr-defined]
        tr.get(b"a")  # type: ignore[attr-defined]

    run_transaction(db, body)  # type: ignore[arg-type]
    (cost,) = db.take()
    # mutation 56 + 2 + 10; write conflict [k1, k1\0): 32 + 2 + 3; read conflict [a, a\0): 32 + 1 + 2
    assert cost.size == 68 + 37 + 35
    assert (cost.grv, cost.reads, cost.commit) == (1, 1, 1)
    assert cost.committed


def test_range_reads_conflict_only_over_what_was_read_and_snapshot_reads_not_at_all() -> None:
    db = CountingDatabase(fdbqueue.open("memory://"))
    run_transaction(db, lambda tr: [tr.set(bytes([65 + i]), b"") for i in range(5)])  # type: ignore[arg-type]
    db.take()

    def body(tr: object) -> None:
        assert len(tr.get_range(b"A", b"Z", limit=2)) == 2  # type: ignore[attr-defined]
        tr.snapshot.get_range(b"A", b"Z")  # type: ignore[attr-defined]

    run_transaction(db, body)  # type: ignore[arg-type]
    (cost,) = db.take()
    assert cost.read_ranges == [(b"A", b"B\x00")]
    assert cost.reads == 2 and cost.commit == 0  # read-only: the commit is local


def test_a_queue_operation_is_measured_attempt_by_attempt() -> None:
    db = CountingDatabase(fdbqueue.open("memory://"))
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"x" * 25_000)  # chunked: three chunk keys
    costs = db.take()
    assert costs and costs[-1].committed
    assert costs[-1].size > 25_000
    assert q.dequeue(db) is not None
    assert any(c.reads >= 2 for c in db.take())
