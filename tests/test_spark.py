"""The Spark data source ``fdbqueue`` on a real local Spark (local[2]): batch reads of queue
contents. Skipped only where pyspark is not installed and FDBQUEUE_REQUIRE_SPARK is unset
(scripts/test.sh installs it and sets it: there a missing Spark fails)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import PartitionedQueue, Queue

if not os.environ.get("FDBQUEUE_REQUIRE_SPARK"):
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install 'fdbqueue[spark]')")

from fdbqueue.spark import local_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    session = local_session("fdbqueue-tests", cores=2, retries=2)
    yield session
    session.stop()


def _store(tmp_path: Path) -> tuple[str, fdbqueue.Database]:
    url = f"sqlite://{tmp_path / 'q.db'}"
    return url, fdbqueue.open(url)


def test_every_message_in_every_state_with_every_column(spark: Any, tmp_path: Path) -> None:
    url, db = _store(tmp_path)
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    q = Queue("jobs")
    big = bytes(range(256)) * 100  # 25,600 bytes: kept in chunks
    q.enqueue(db, b"leased", priority=5)
    q.enqueue(db, b"dead")
    ready = q.enqueue(db, big, headers={"kind": "big", "n": 2}, ttl=3600)
    q.enqueue(db, "text")
    delayed = q.enqueue(db, {"a": 1}, delay=600, priority=2)
    leased = q.lease(db)
    assert leased is not None and leased.payload == b"leased"
    q.nack(db, q.lease(db), reason="boom")  # type: ignore[arg-type]
    df = spark.read.format("fdbqueue").option("url", url).option("queue", "jobs").load()
    assert df.columns == [
        "queue", "id", "state", "priority", "enqueued_at", "deliveries", "headers", "payload",
        "content_type", "reason", "origin", "expires_at",
    ]  # fmt: skip
    rows = {r["id"]: r for r in df.collect()}
    assert len(rows) == 5
    by_state = {r["state"]: r for r in rows.values() if r["state"] != "ready"}
    assert by_state["leased"]["id"] == leased.id and by_state["leased"]["priority"] == 5
    assert by_state["leased"]["deliveries"] == 1
    dead = by_state["dead"]
    assert (dead["queue"], dead["payload"]) == ("jobs.error", b"dead")
    assert (dead["reason"], dead["origin"]) == ("boom", "jobs")
    assert dead["deliveries"] == 1
    assert by_state["delayed"]["id"] == delayed and by_state["delayed"]["priority"] == 2
    assert by_state["delayed"]["content_type"] == "json" and by_state["delayed"]["payload"] == b'{"a":1}'
    r = rows[ready]
    assert r["payload"] == big and r["headers"] == {"kind": "big", "n": "2"} and r["state"] == "ready"
    assert r["expires_at"] is not None and r["enqueued_at"] is not None
    assert r["expires_at"].timestamp() - r["enqueued_at"].timestamp() == pytest.approx(3600, abs=60)
    texts = [x for x in rows.values() if x["content_type"] == "text"]
    assert [x["payload"] for x in texts] == [b"text"]


def test_a_large_queue_reads_in_parallel_partitions_and_patterns_and_partitioned_queues(
    spark: Any, tmp_path: Path
) -> None:
    url, db = _store(tmp_path)
    for start in range(0, 2000, 500):
        Queue("tenant.a").enqueue_many(db, [b"%d" % i for i in range(start, start + 500)])
    Queue("tenant.b").enqueue_many(db, [b"b"] * 7)
    Queue("other").enqueue(db, b"o")
    reader = spark.read.format("fdbqueue").option("url", url)
    df = reader.option("queue", "tenant.a").option("split", "300").load()
    assert df.rdd.getNumPartitions() >= 7  # 2,000 ready messages cut every 300, and the other states
    payloads = [r["payload"] for r in df.orderBy("id").collect()]
    assert sorted(int(p) for p in payloads) == list(range(2000))
    assert reader.option("queue", "tenant.*").load().count() == 2007
    assert reader.option("queue", "tenant.b, other").load().count() == 8
    orders = PartitionedQueue("orders", partitions=3, key="c")
    for i in range(30):
        orders.enqueue(db, b"x", headers={"c": f"c-{i}"})
    got = reader.option("queue", "orders").load().groupBy("queue").count().collect()
    assert sum(r["count"] for r in got) == 30 and {r["queue"] for r in got} <= {q.name for q in orders.queues}


def test_bad_options_say_what_is_wrong(spark: Any, tmp_path: Path) -> None:
    url, db = _store(tmp_path)
    Queue("jobs").enqueue(db, b"x")
    for options, text in (
        ({"queue": "jobs"}, 'needs .option("url"'),
        ({"url": url}, 'needs .option("queue"'),
        ({"url": url, "queue": "nope"}, "no queue named 'nope'"),
        ({"url": url, "queue": "jobs", "split": "many"}, "split must be an int"),
    ):
        with pytest.raises(Exception, match=text.replace("(", r"\(")):
            spark.read.format("fdbqueue").options(**options).load().collect()


def test_reading_while_a_worker_drains(spark: Any, tmp_path: Path) -> None:
    url, db = _store(tmp_path)
    sent = set()
    for start in range(0, 3000, 500):
        sent |= set(Queue("jobs").enqueue_many(db, [b"%d" % i for i in range(start, start + 500)]))
    worker = fdbqueue.Worker(fdbqueue.open(url), "jobs", lambda m: None)
    runner = threading.Thread(target=worker.run, kwargs={"until_empty": True})
    runner.start()
    try:
        rows = (
            spark.read.format("fdbqueue")
            .option("url", url)
            .option("queue", "jobs")
            .option("split", "200")
            .load()
        )
        seen = [r["id"] for r in rows.collect()]
    finally:
        runner.join(60)
    assert not runner.is_alive() and worker.stats.processed == 3000
    assert set(seen) <= sent  # what it saw was there: ready or in flight at its transaction


def test_the_journal_reads_as_a_batch_with_since_and_until(spark: Any, tmp_path: Path) -> None:
    url, db = _store(tmp_path)
    fdbqueue.create_queue(db, "jobs", journal=True)
    fdbqueue.create_queue(db, "other", journal=True)
    q = Queue("jobs")
    ids = q.enqueue_many(db, [b"a", b"b", b"c"])
    m = q.lease(db)
    assert m is not None
    q.ack(db, m)
    Queue("other").enqueue(db, b"o")
    expected = list(fdbqueue.journal(db, "jobs"))
    reader = spark.read.format("fdbqueue").option("url", url).option("split", "2")
    df = reader.option("journal", "jobs").load()
    assert df.columns == [
        "version", "at", "op", "queue", "message_id", "principal", "deliveries", "reason", "details",
    ]  # fmt: skip
    rows = df.orderBy("version").collect()
    assert [(bytes(r["version"]), r["op"], r["message_id"]) for r in rows] == [
        (e.version, e.op, e.message_id) for e in expected
    ]
    assert [r["op"] for r in rows if r["message_id"] == ids[0]] == ["enqueue", "lease", "ack"]
    assert reader.option("journal", "*").load().count() == len(list(fdbqueue.journal(db, None)))
    middle = expected[2].version.hex()
    fresh = lambda: spark.read.format("fdbqueue").options(url=url, journal="jobs")  # noqa: E731 - option() mutates a reader
    after = fresh().option("since", middle).load().count()
    before = fresh().option("until", middle).load().count()
    assert (after, before) == (len(expected) - 3, 2)
