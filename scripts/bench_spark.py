"""The Spark pipeline on the embedded engine, local[2]: bulk enqueue of N rows (200-byte
payloads) with ``df.write``, against a plain Python loop of ``enqueue_many`` in the same run;
the read of the N messages back; ``fdbqueue audit`` of the N journaled messages.

    python scripts/bench_spark.py [--rows 1000000] [--markdown]

Each stage runs once on a fresh store (a bulk load is not repeated for a best-of): the
ratios compare the stages measured in this run. Target (docs/performance.md): the load of
10^6 rows within 60 s.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from benchlib import filesystem_of, machine, parse_args, show_table

import fdbqueue


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--cores", type=int, default=2, help="local[N] (default 2)")
    ap.add_argument("--batch", type=int, default=500, help="rows per transaction, both ways (default 500)")
    ap.add_argument("--markdown", action="store_true")
    args = parse_args(ap, None, rows=1000, cores=1, batch=500)
    from pyspark.sql import functions as F

    from fdbqueue.spark import local_session
    from fdbqueue.spark.audit import run_audit

    n = args.rows
    folder = tempfile.mkdtemp(prefix="bench-spark-")
    try:
        spark = local_session("bench-spark", cores=args.cores)
        spark.range(1000).count()  # the JVM and a Python worker up before any clock starts
        print(machine(spark=spark.version, cores=args.cores, rows=n, fs=filesystem_of(folder)))

        # A plain Python loop: what a user writes without Spark, one process.
        url = f"sqlite://{folder}/loop.db"
        db = fdbqueue.open(url)
        fdbqueue.create_queue(db, "bulk", journal=True)
        q = fdbqueue.Queue("bulk")
        payload = b"x" * 200
        start = time.perf_counter()
        for lo in range(0, n, args.batch):
            q.enqueue_many(db, [payload] * min(args.batch, n - lo))
        loop_s = time.perf_counter() - start
        assert q.size(db) == n
        db.close()

        # df.write with a dedup key per row (exactly once across retried tasks).
        url = f"sqlite://{folder}/spark.db"
        db = fdbqueue.open(url)
        fdbqueue.create_queue(db, "bulk", journal=True)
        rows = spark.range(n).select(
            F.col("id").cast("string").alias("key"),
            F.concat(F.lpad(F.col("id").cast("string"), 12, "0"), F.lit("x" * 188))
            .cast("binary")
            .alias("payload"),
        )
        options = {"url": url, "queue": "bulk", "dedupColumn": "key", "batch": str(args.batch)}
        start = time.perf_counter()
        rows.write.format("fdbqueue").options(**options).mode("append").save()
        write_s = time.perf_counter() - start
        assert fdbqueue.Queue("bulk").size(db) == n

        start = time.perf_counter()
        got = spark.read.format("fdbqueue").options(url=url, queue="bulk").load().count()
        read_s = time.perf_counter() - start
        assert got == n

        start = time.perf_counter()
        report = run_audit(spark, url, os.path.join(folder, "audit"), queues="bulk")
        audit_s = time.perf_counter() - start
        assert report.messages == n and report.unaccounted == 0
        db.close()
        spark.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    def rate(s: float) -> str:
        return f"{n / s:,.0f}"

    show_table(
        f"Spark pipeline, {n:,} messages of 200 bytes, embedded engine, local[{args.cores}]",
        ["stage", "seconds", "messages/s", "ratio"],
        [
            ["enqueue_many loop (one process, journaled)", f"{loop_s:.1f}", rate(loop_s), "1.00"],
            ["df.write (dedupColumn, journaled)", f"{write_s:.1f}", rate(write_s), f"{loop_s / write_s:.2f}"],
            ["spark.read ... .count()", f"{read_s:.1f}", rate(read_s), f"{loop_s / read_s:.2f}"],
            ["fdbqueue audit", f"{audit_s:.1f}", rate(audit_s), f"{loop_s / audit_s:.2f}"],
        ],
        markdown=args.markdown,
    )
    print(f"target: df.write of 10^6 rows <= 60 s: {'met' if write_s <= 60 * n / 1e6 else 'NOT met'}")


if __name__ == "__main__":
    main()
