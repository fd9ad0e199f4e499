"""The export's reads (what the Spark data source runs on each executor: fdbqueue/spark/).

A page of chunked messages reads all their chunks with one ``get_many`` (every read issued
before any is waited on: one round trip on FoundationDB), not a range read per message, and
stops where the chunks it read reach a transaction's share of bytes.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import fdbqueue
from fdbqueue.api.export import plan, read_piece
from fdbqueue.engines.contract import Database
from fdbqueue.store.budget import SCAN_READ_BYTES
from scripts.txncost import CountingDatabase

LARGE = 30_000  # three chunks of about 10 kB each


@pytest.fixture
def db() -> Iterator[Database]:
    database = fdbqueue.open("sim://?seed=3&faults=0")
    yield database
    database.close()


def test_a_page_of_chunked_messages_reads_their_chunks_in_one_round_trip(db: Database) -> None:
    jobs = fdbqueue.Queue("jobs")
    payloads = [bytes([65 + i]) * LARGE for i in range(20)]
    jobs.enqueue_many(db, payloads)
    (piece,) = [p for p in plan(db, ["jobs"]) if p.state == "ready"]
    cdb = CountingDatabase(db)
    rows = list(read_piece(cdb, piece))  # type: ignore[arg-type]
    assert sorted(r[7] for r in rows) == sorted(payloads)
    costs = cdb.take()
    # read version, the guard, the page, its chunks (and the TTL index of each row's expiry
    # at most once a page): not one more per message
    assert sum(c.round_trips for c in costs) <= 6 * len(costs), [c.round_trips for c in costs]
    assert len(costs) <= 2


def test_a_page_stops_at_a_transactions_share_of_chunk_bytes(db: Database) -> None:
    jobs = fdbqueue.Queue("jobs")
    big = 200_000  # 20 chunks each
    n = 12
    for i in range(n):
        jobs.enqueue(db, bytes([65 + i]) * big)
    (piece,) = [p for p in plan(db, ["jobs"]) if p.state == "ready"]
    cdb = CountingDatabase(db)
    rows = list(read_piece(cdb, piece))  # type: ignore[arg-type]
    assert len(rows) == n and all(len(r[7]) == big for r in rows)
    costs = cdb.take()
    assert len(costs) >= 2  # n * big is past one transaction's share
    assert n * big > 2 * SCAN_READ_BYTES
