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
    pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")

from fdbqueue.spark import local_session
from tests.support.processes import real_clock  # noqa: F401 - a fixture, used by every test here

# Spark's Python workers are other processes sharing the store: this process runs on the real
# clock too (a fake clock earlier in the run leaves it ahead).
pytestmark = pytest.mark.usefixtures("real_clock")


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
        ({"url": url, "journal": "jobs"}, "no journal for queue 'jobs'"),
        ({"url": url, "journal": "*", "since": "xyz"}, "since must be a journal version"),
    ):
        with pytest.raises(Exception, match=text.replace("(", r"\(")):
            spark.read.format("fdbqueue").options(**options).load().collect()
    stream = spark.readStream.format("fdbqueue").options(url=url, queue="jobs").load()
    with pytest.raises(Exception, match="a stream reads the journal"):
        stream.writeStream.format("memory").queryName("wrong").start().awaitTermination(60)


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


# -- write = bulk enqueue ------------------------------------------------------------------------


def test_a_round_trip_of_ten_thousand_rows_with_every_column(spark: Any, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    url, db = _store(tmp_path)
    n = 10_000
    df = (
        spark.range(n)
        .select(
            F.col("id").cast("string").alias("key"),
            F.concat(F.lit("payload-"), F.col("id").cast("string")).cast("binary").alias("payload"),
            (F.col("id") % 3).cast("int").alias("priority"),
            F.create_map(F.lit("n"), F.col("id").cast("string")).alias("headers"),
            F.when(F.col("id") % 10 == 0, F.lit(3600.0)).alias("delay"),
            F.when(F.col("id") % 7 == 0, F.lit(86400)).alias("ttl"),
        )
        .repartition(4)
    )
    df.write.format("fdbqueue").options(url=url, queue="loaded", dedupColumn="key", batch="300").mode(
        "append"
    ).save()
    back = spark.read.format("fdbqueue").options(url=url, queue="loaded").load().collect()
    assert len(back) == n
    by_n = {int(r["headers"]["n"]): r for r in back}
    assert sorted(by_n) == list(range(n))
    for i, r in by_n.items():
        assert r["payload"] == b"payload-%d" % i and r["priority"] == i % 3
        assert r["state"] == ("delayed" if i % 10 == 0 else "ready")
        assert (r["expires_at"] is not None) == (i % 7 == 0), i
        assert r["content_type"] == "bytes"
    assert Queue("loaded").deduplicated(db, "17") == by_n[17]["id"]  # the key is dedupColumn's
    # The same write again (a job run twice) enqueues nothing: the dedup keys are there.
    df.write.format("fdbqueue").options(url=url, queue="loaded", dedupColumn="key").mode("append").save()
    assert fdbqueue.queue_stats(db, "loaded").made_ready == n - n // 10  # delayed ones not yet made ready
    assert Queue("loaded").size(db) == n - n // 10


def test_rows_without_a_payload_column_are_json_and_keyed_by_their_content(
    spark: Any, tmp_path: Path
) -> None:
    import datetime

    url, db = _store(tmp_path)
    when = datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=datetime.timezone.utc)
    df = spark.createDataFrame(
        [("a", 1, when, 9), ("b", 2, when, 0), ("a", 1, when, 9)],
        "name string, n long, at timestamp, priority int",
    )
    df.write.format("fdbqueue").options(url=url, queue="rows").mode("append").save()
    q = Queue("rows")
    got = []
    while (m := q.dequeue(db)) is not None:
        got.append((m.json(), m.priority))
    # Two identical rows are one message; priority is an option, not part of the JSON.
    assert got == [
        ({"name": "a", "n": 1, "at": "2026-01-02T03:04:05"}, 9),
        ({"name": "b", "n": 2, "at": "2026-01-02T03:04:05"}, 0),
    ]


def test_a_task_that_fails_and_is_retried_enqueues_each_row_once(spark: Any, tmp_path: Path) -> None:
    """local[2,2]: a task may fail once. Each task's first attempt fails after it has
    enqueued rows (batches of 50 commit as it goes); the retry writes all its rows again."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType

    url, db = _store(tmp_path)
    marks = tmp_path / "attempts"
    marks.mkdir()
    pad = "-" + "x" * 1000  # a Python worker flushes its output every 64 KiB: rows that fill it

    def fail_first_attempt(value: str) -> str:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        assert ctx is not None
        if ctx.attemptNumber() == 0 and int(value) % 1000 == 900:
            import hashlib
            import json
            import time

            # Fail only once the writer, downstream of this function, has committed this
            # attempt's first row: its dedup key is the row's (no dedupColumn).
            first = {"payload": str(ctx.partitionId() * 1000) + pad}
            key = "row:" + hashlib.sha256(json.dumps(first, separators=(",", ":")).encode()).hexdigest()
            store, deadline, seen = fdbqueue.open(url), time.monotonic() + 30, None
            while seen is None and time.monotonic() < deadline:
                seen = Queue("retried").deduplicated(store, key)
                time.sleep(0.05)
            (marks / f"p{ctx.partitionId()}-{value}").write_text("1" if seen else "0")
            raise RuntimeError("the first attempt of this task fails")
        return value + pad

    udf = F.udf(fail_first_attempt, StringType())
    df = spark.range(0, 2000, numPartitions=2).select(udf(F.col("id").cast("string")).alias("payload"))
    spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", "100")  # the writer's input batches
    try:
        df.write.format("fdbqueue").options(url=url, queue="retried", batch="50").mode("append").save()
    finally:
        spark.conf.unset("spark.sql.execution.arrow.maxRecordsPerBatch")
    failures = {p.name: int(p.read_text()) for p in marks.iterdir()}
    assert len(failures) == 2  # each task failed once
    assert sorted(failures.values()) == [1, 1]  # after rows of the failed attempt were enqueued
    q = Queue("retried")
    got = []
    while (m := q.dequeue(db)) is not None:
        got.append(int(m.payload.split(b"-")[0]))
    assert sorted(got) == list(range(2000))


def test_bad_writes_say_what_is_wrong(spark: Any, tmp_path: Path) -> None:
    url, _ = _store(tmp_path)
    df = spark.createDataFrame([("a", "x")], "payload string, k string")
    for options, mode, text in (
        ({"url": url}, "append", "one queue"),
        ({"url": url, "queue": "a.*"}, "append", "one queue"),
        ({"url": url, "queue": "q", "dedupColumn": "nope"}, "append", "dedupColumn 'nope' is not a column"),
        ({"url": url, "queue": "q", "batch": "0"}, "append", "batch must be an int"),
        ({"url": url, "queue": "q"}, "overwrite", "appends"),
    ):
        with pytest.raises(Exception, match=text):
            df.write.format("fdbqueue").options(**options).mode(mode).save()
    bad = spark.createDataFrame([(1.5,)], "priority double")
    with pytest.raises(Exception, match="column 'priority' must be an integer"):
        bad.write.format("fdbqueue").options(url=url, queue="q").mode("append").save()


# -- the journal as a stream ---------------------------------------------------------------------


def test_the_journal_stream_resumes_from_its_checkpoint_with_every_entry_once(
    spark: Any, tmp_path: Path
) -> None:
    url, db = _store(tmp_path)
    fdbqueue.create_queue(db, "jobs", journal=True)
    fdbqueue.create_queue(db, "other", journal=True)
    q = Queue("jobs")
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def run_until_caught_up() -> None:
        stream = spark.readStream.format("fdbqueue").options(url=url, journal="*", split="7").load()
        query = (
            stream.writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination(120)
        assert query.exception() is None

    q.enqueue_many(db, [b"%d" % i for i in range(40)])
    run_until_caught_up()
    for _ in range(5):
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)
    Queue("other").enqueue_many(db, [b"o"] * 12)
    run_until_caught_up()  # a new query on the same checkpoint: it goes on where the first stopped
    run_until_caught_up()  # nothing new: nothing read twice
    expected = [(e.version, e.op, e.queue, e.message_id) for e in fdbqueue.journal(db, None)]
    got = spark.read.parquet(str(out)).orderBy("version").collect()
    assert [(bytes(r["version"]), r["op"], r["queue"], r["message_id"]) for r in got] == expected
    assert len(expected) == 2 + 40 + 10 + 12  # two creates, enqueues, leases and acks, enqueues


def test_the_journal_stream_follows_a_live_queue_in_micro_batches(spark: Any, tmp_path: Path) -> None:
    import time

    url, db = _store(tmp_path)
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    stream = spark.readStream.format("fdbqueue").options(url=url, journal="jobs").load()
    query = (
        stream.writeStream.format("memory")
        .queryName("journal_live")
        .option("checkpointLocation", str(tmp_path / "cp"))
        .trigger(processingTime="200 milliseconds")
        .start()
    )
    try:
        sent = []
        for _ in range(6):
            sent += q.enqueue_many(db, [b"x"] * 5)
            time.sleep(0.3)
        expected = len(list(fdbqueue.journal(db, "jobs")))
        deadline = time.monotonic() + 60
        while spark.sql("select count(*) from journal_live").first()[0] < expected:
            assert time.monotonic() < deadline, "the stream did not catch up"
            time.sleep(0.2)
        rows = spark.sql("select op, message_id from journal_live where op = 'enqueue'").collect()
        assert sorted(r["message_id"] for r in rows) == sorted(sent)
        assert query.lastProgress is not None
    finally:
        query.stop()
    assert spark.sql("select count(distinct version) from journal_live").first()[0] == expected


# -- the audit -----------------------------------------------------------------------------------


def _audited_store(tmp_path: Path) -> tuple[str, fdbqueue.Database, dict[str, list[str]]]:
    """A journaled queue with messages of every fate."""
    import time

    url, db = _store(tmp_path)
    fdbqueue.create_queue(db, "jobs", journal=True, max_deliveries=1, retry_delay=0, expiry_action="discard")
    fdbqueue.create_queue(db, "mail", journal=True)  # expired: to its error queue (no journal)
    fdbqueue.create_queue(db, "jobs.error", journal=True)
    fdbqueue.create_queue(db, "later", journal=True)
    q = Queue("jobs")
    ids = q.enqueue_many(db, [b"%d" % i for i in range(30)])
    fates: dict[str, list[str]] = {"acked": [], "dead-lettered": [], "in flight": []}
    for _ in range(10):
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)
        fates["acked"].append(m.id)
    for _ in range(3):
        m = q.lease(db)
        assert m is not None
        q.nack(db, m, reason="bad input")
        fates["dead-lettered"].append(m.id)
    for _ in range(2):
        m = q.dequeue(db)  # exactly-once: consumed
        assert m is not None
        fates["acked"].append(m.id)
    m = q.lease(db, lease_seconds=600)
    assert m is not None
    fates["in flight"].append(m.id)
    fdbqueue.move(db, "jobs", "later", limit=4)
    fates["moved out"] = [m.id for m in Queue("later").browse(db)]
    assert len(fates["moved out"]) == 4
    short = q.enqueue_many(db, [b"short"] * 2, ttl=0.2)
    mail = Queue("mail").enqueue(db, b"late", ttl=0.2)
    time.sleep(0.5)
    q.sweep(db)
    Queue("mail").sweep(db)
    fates["expired"] = short
    fates["dead-lettered"].append(mail)
    deleted = q.enqueue(db, b"deleted")
    redriven = q.enqueue(db, b"redriven", priority=9, headers={"redo": "yes"})
    assert q.delete(db, deleted)
    m = q.lease(db)
    assert m is not None and m.id == redriven
    q.nack(db, m, reason="once")
    assert fdbqueue.redrive(db, "jobs.error", where={"redo": "yes"}) == 1
    fates["deleted"] = [deleted]
    fates["queued"] = [i for i in ids if not any(i in v for v in fates.values())] + [redriven]
    return url, db, fates


def test_a_clean_audit_accounts_for_every_message(spark: Any, tmp_path: Path) -> None:
    from fdbqueue.spark.audit import run_audit, summary_lines

    url, _, fates = _audited_store(tmp_path)
    report = run_audit(spark, url, tmp_path / "audit", queues="jobs,mail")
    text = "\n".join(summary_lines(report))
    assert report.unaccounted == 0 and report.examples == [], text
    table = {r["message_id"]: r for r in spark.read.parquet(str(report.parquet)).collect()}
    assert len(table) == report.messages == 35
    for fate, ids in fates.items():
        assert {table[i]["fate"] for i in ids} == {fate}, fate
    assert [(table[i]["reason"], table[i]["where"]) for i in fates["dead-lettered"]] == [
        ("bad input", "jobs.error")
    ] * 3 + [("expired", "mail.error")]
    assert all(table[i]["latency_s"] >= 0 for i in fates["acked"])
    assert {table[i]["where"] for i in fates["queued"]} == {"jobs"}  # and "later" is not audited
    jobs = next(s for s in report.queues if s.queue == "jobs")
    assert jobs.fates["acked"] == 12 and jobs.latency is not None
    assert report.plot.stat().st_size > 10_000
    assert "jobs" in text and "0 unaccounted" in text


def test_the_audit_finds_a_message_cleared_behind_its_back_and_one_without_a_journal_entry(
    spark: Any, tmp_path: Path
) -> None:
    from fdbqueue.cli import main
    from fdbqueue.store.layout import JournalKeys, QueueKeys

    url, db, fates = _audited_store(tmp_path)
    q = Queue("jobs")
    gone = fates["queued"][0]
    keys = QueueKeys.make("jobs")
    unjournaled = q.enqueue(db, b"sneaked in")
    entries = fdbqueue.history(db, unjournaled)
    assert [e.op for e in entries] == ["enqueue"]
    jk = JournalKeys.make()

    @fdbqueue.transactional
    def behind_its_back(tr: fdbqueue.Transaction) -> None:
        home = keys.home_key(gone)
        assert home is not None and tr.get(home) is not None
        tr.clear(home)  # a raw clear: no journal entry, no counter
        for e in entries:
            for shard in jk.shards(True):  # whichever shard (or the queue's own range) the engine put it in
                tr.clear(jk.entry_key("jobs", shard, e.version))
            tr.clear(jk.history_key(unjournaled, e.version))

    behind_its_back(db)
    assert fdbqueue.history(db, unjournaled) == []
    out = tmp_path / "audit"
    code = main(["audit", "--url", url, "--queue", "jobs", "--out", str(out)])
    assert code == 1
    table = spark.read.parquet(str(out / "messages.parquet"))
    lost = {r["message_id"]: r["problem"] for r in table.where("problem is not null").collect()}
    assert set(lost) == {gone, unjournaled}
    assert lost[gone].startswith("missing: the journal says queued in jobs")
    assert lost[unjournaled] == "no journal entry, yet it is in jobs"
    assert (out / "audit.png").exists()
    # Bad input: a clear error, exit 2, nothing written.
    assert main(["audit", "--url", url, "--queue", "nope", "--out", str(tmp_path / "x")]) == 2
    assert not (tmp_path / "x").exists()


# -- the demo's Spark step -----------------------------------------------------------------------


def test_the_demo_runs_its_spark_step_and_leaves_a_users_store_as_it_was(tmp_path: Path) -> None:
    import subprocess
    import sys

    url, db = _store(tmp_path)
    Queue("mine").enqueue(db, b"the user's message")
    before = db.get_range(b"", b"\xff")  # type: ignore[attr-defined]
    args = ["--url", url, "demo", "--messages", "40", "--producers", "1", "--workers", "1", "--spark"]
    r = subprocess.run([sys.executable, "-m", "fdbqueue", *args], capture_output=True, timeout=400)
    out = r.stdout.decode()
    assert r.returncode == 0, (out, r.stderr.decode()[-3000:])
    import re

    assert re.search(r"spark: bulk load \(df.write\) +5000 rows", out), out
    assert re.search(r"spark: the same load again +0 added", out), out
    assert re.search(r"spark: drained by a worker +5000\n", out), out
    assert re.search(r"spark: fdbqueue audit +5000 messages, 0 unaccounted", out), out
    assert "OK: every message processed exactly once" in out
    assert fdbqueue.list_queues(db) == ["mine"]
    assert db.get_range(b"", b"\xff") == before  # type: ignore[attr-defined]
