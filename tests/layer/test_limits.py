"""Limits fit what FoundationDB accepts: a user's call is refused only where the engine would
refuse it, and the layer moves large messages one per transaction.

FoundationDB refuses a transaction over 10,000,000 bytes (2101) and a value over 100,000
(2103); every engine here enforces both (``fdbqueue/engines/contract.py``). Payloads are chunked,
so ``max_payload`` goes up to what one transaction can move; ``enqueue_many`` is one
transaction up to the engine's limit less the layer's margin. Sizes are measured as
FoundationDB counts them (``scripts/txncost.py``). The figures are written out, not imported.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database
from scripts.txncost import CountingDatabase, TxnCost
from tests.support.engines import engine_url

MiB = 1024 * 1024
ENGINE_LIMIT = 10_000_000  # FoundationDB's transaction_too_large (2101)
BIG = 4 * MiB  # the size users asked for: accepted, and moved one per transaction


@pytest.fixture(params=["sim", "sqlite"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    database = fdbqueue.open(engine_url(str(request.param), tmp_path))
    try:
        yield database
    finally:
        database.close()


def blob(i: int, size: int = BIG) -> bytes:
    return bytes([65 + i]) * size


def within_engine(name: str, costs: list[TxnCost]) -> None:
    assert costs, f"{name}: nothing measured"
    for c in costs:
        assert c.error not in (2101, 2103), f"{name}: an attempt failed with {c.error}"
        assert c.size < ENGINE_LIMIT, f"{name}: an attempt of {c.size:,} bytes"


def test_max_payload_goes_up_to_the_engines_limit_and_defaults_to_1_mib(db: Database) -> None:
    assert fdbqueue.QueueConfig().max_payload == MiB
    fdbqueue.create_queue(db, "blobs", max_payload=4 * MiB)
    assert fdbqueue.queue_config(db, "blobs").max_payload == 4 * MiB
    q = Queue("blobs")
    q.enqueue(db, blob(0))
    m = q.dequeue(db)
    assert m is not None and m.payload == blob(0)
    with pytest.raises(fdbqueue.PayloadTooLargeError, match="max_payload"):
        q.enqueue(db, b"x" * (4 * MiB + 1))
    jobs = Queue("jobs")  # the default: 1 MiB, the earlier default and SQS's and Kafka's
    jobs.enqueue(db, b"x" * 500_000)
    with pytest.raises(fdbqueue.PayloadTooLargeError, match="max_payload"):
        jobs.enqueue(db, b"x" * (MiB + 1))
    with pytest.raises(fdbqueue.QueueError, match="max_payload must be an int from 1 to 6291456"):
        fdbqueue.create_queue(db, "huge", max_payload=6 * MiB + 1)


def test_enqueue_many_is_refused_only_past_the_engines_transaction_limit(db: Database) -> None:
    q = Queue("jobs")
    payloads = [b"p" * 330] * 2_000  # 656,890 bytes: refused before as past a 500,000 budget
    cdb = CountingDatabase(db)
    assert len(q.enqueue_many(cdb, payloads)) == 2_000
    within_engine("enqueue_many(2,000)", cdb.take())
    assert q.size(db) == 2_000
    big = [b"p" * 99_000] * 85  # about 8.7 MB: what FoundationDB accepts, with headroom
    cdb = CountingDatabase(db)
    assert len(q.enqueue_many(cdb, big)) == 85
    within_engine("enqueue_many(8.7 MB)", cdb.take())
    with pytest.raises(fdbqueue.BudgetExceededError, match=r"past what FoundationDB accepts \(10,000,000"):
        q.enqueue_many(db, [b"p" * 99_000] * 101)  # 10 MB of payload alone
    assert q.size(db) == 2_085  # nothing of it written


def test_a_journaled_batch_near_the_limit_counts_its_journal_entries(db: Database) -> None:
    fdbqueue.create_queue(db, "audited", journal=True)
    q = Queue("audited")
    small = [b"p" * 100] * 6_000  # about 2.3 MB of messages, 5.7 MB with their journal entries
    cdb = CountingDatabase(db)
    assert len(q.enqueue_many(cdb, small)) == 6_000
    within_engine("journaled enqueue_many", cdb.take())
    with pytest.raises(fdbqueue.BudgetExceededError, match="split it"):
        # About 4.5 MB without a journal, 11.5 MB with it: FoundationDB would refuse it (2101).
        q.enqueue_many(db, [b"p" * 100] * 12_000)
    assert q.size(db) == 6_000
    Queue("plain").enqueue_many(db, [b"p" * 100] * 12_000)  # the same batch, unjournaled: fits


def fill_big(db: Database, name: str, n: int, *, ttl: float | None = None) -> Queue:
    fdbqueue.create_queue(db, name, max_payload=4 * MiB, expiry_action="error")
    q = Queue(name)
    for i in range(n):
        q.enqueue(db, blob(i), ttl=ttl)
    q.enqueue(db, b"small")
    return q


def drained(db: Database, name: str) -> list[bytes]:
    q, out = Queue(name), []
    while (m := q.dequeue(db)) is not None:
        out.append(m.payload)
    return out


def test_move_and_redrive_move_large_messages_one_per_transaction(db: Database) -> None:
    fill_big(db, "src", 3)
    cdb = CountingDatabase(db)
    assert fdbqueue.move(cdb, "src", "dst") == 4
    costs = cdb.take()
    within_engine("move", costs)
    assert len([c for c in costs if c.committed]) >= 3  # one large message a transaction
    fdbqueue.create_queue(db, "dst", max_deliveries=1, max_payload=4 * MiB)
    q = Queue("dst")
    while (m := q.lease(db)) is not None:
        q.nack(db, m)  # to dst.error, its chunks copied: one message a transaction
    assert fdbqueue.queue_stats(db, "dst").errors == 4
    cdb = CountingDatabase(db)
    assert fdbqueue.redrive(cdb, "dst.error") == 4
    within_engine("redrive", cdb.take())
    assert sorted(drained(db, "dst")) == sorted([blob(0), blob(1), blob(2), b"small"])


def test_sweeps_and_dequeues_expire_large_messages_one_per_transaction(db: Database) -> None:
    q = fill_big(db, "jobs", 3, ttl=0.2)
    time.sleep(0.3)
    cdb = CountingDatabase(db)
    q.sweep(cdb)
    within_engine("sweep", cdb.take())
    assert fdbqueue.queue_stats(db, "jobs").expired == 3
    fill_big(db, "again", 3, ttl=0.2)  # and b"small" behind them, no TTL
    time.sleep(0.3)
    cdb = CountingDatabase(db)
    m = Queue("again").dequeue(cdb)  # past them: each moved in a transaction of its own
    assert m is not None and m.payload == b"small"
    within_engine("dequeue past expired", cdb.take())
    assert sorted(drained(db, "jobs.error")) == [blob(0), blob(1), blob(2)]
    assert drained(db, "jobs") == [b"small"]
    Queue("again").sweep(db)  # those the dequeue passed over, left for a sweep
    assert sorted(drained(db, "again.error")) == [blob(0), blob(1), blob(2)]


@pytest.mark.parametrize("exclusive", [False, True])
def test_forward_splits_its_batch_so_large_messages_go_one_per_transaction(
    db: Database, exclusive: bool
) -> None:
    other = fdbqueue.open("sim://?seed=2&faults=0")
    try:
        fill_big(db, "out", 3)
        fdbqueue.create_queue(other, "in", max_payload=4 * MiB)
        counted_src, counted_dst = CountingDatabase(db), CountingDatabase(other)
        st = fdbqueue.forward(counted_src, "out", counted_dst, "in", batch=100, exclusive=exclusive)
        assert st.forwarded == 4
        within_engine("forward, source", counted_src.take())
        within_engine("forward, destination", counted_dst.take())
        assert sorted(drained(other, "in")) == sorted([blob(0), blob(1), blob(2), b"small"])
        assert Queue("out").empty(db)
    finally:
        other.close()


def test_lease_many_hands_out_large_messages_one_at_a_time(db: Database) -> None:
    q = fill_big(db, "jobs", 3)
    got = q.lease_many(db, 10)
    assert [m.payload for m in got] == [blob(0)]
    rest = q.lease_many(db, 10)
    assert [m.payload for m in rest] == [blob(1)]


def test_the_largest_payload_with_the_longest_keys_moves_within_the_engines_limit(db: Database) -> None:
    root = ("r" * 700,)  # a queue prefix of about 900 bytes, with the longest name
    name = "q" * 190
    fdbqueue.create_queue(db, name, max_payload=6 * MiB, max_deliveries=1, root=root)
    q = Queue(name, root=root)
    q.enqueue(db, blob(0, 6 * MiB), headers={"h": "x" * 59_000})
    m = q.lease(db)
    assert m is not None
    cdb = CountingDatabase(db)
    q.nack(cdb, m, reason="r" * 3_990)  # dead-lettered: its 630 chunks copied in this transaction
    within_engine("dead letter of 6 MiB", cdb.take())
    dead = Queue(name + ".error", root=root).dequeue(db)
    assert dead is not None and dead.payload == blob(0, 6 * MiB)
