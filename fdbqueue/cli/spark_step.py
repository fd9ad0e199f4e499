"""The demo's Spark step, run when pyspark (the ``spark`` extra) and Java are installed: a
bulk load of rows into a journaled queue with ``df.write`` (twice: the second load adds
nothing), a drain by a worker, and ``fdbqueue audit`` of the queue."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import IO, Any

import fdbqueue


@dataclass
class SparkStep:
    """What the Spark step did (``skipped``: why it did not run)."""

    rows: int = 0
    loaded: int = 0
    loaded_again: int = 0
    drained: int = 0
    load_seconds: float = 0.0
    audited: int = 0
    unaccounted: int = -1
    p50_ms: float | None = None
    skipped: str | None = None
    lines: list[tuple[str, str]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.skipped is not None or (
            self.loaded == self.rows == self.drained and self.loaded_again == 0 and self.unaccounted == 0
        )


def spark_available() -> str | None:
    """None when the Spark step can run, else why not."""
    if importlib.util.find_spec("pyspark") is None:
        return "pyspark is not installed: pip install '.[spark]' in a checkout (and Java 17) runs it"
    if shutil.which("java") is None:
        return "no Java on PATH: Spark needs Java 17"
    return None


# What Spark's JVM says on every start, to stderr, before its log level can be set: nothing
# the demo's user can act on. Any other line it writes is shown (jvm_output).
START_NOTES = (
    "WARNING: Using incubator modules",
    "Using Spark's default log4j profile",
    "WARN Utils: Your hostname",
    "WARN Utils: Set SPARK_LOCAL_IP",
    'Setting default log level to "WARN"',
    "To adjust logging level use sc.setLogLevel",
    "WARN NativeCodeLoader: Unable to load native-hadoop library",
)


@contextlib.contextmanager
def jvm_output() -> Iterator[IO[bytes]]:
    """While open, this process's stderr (file descriptor 2) goes to a file: a JVM started
    meanwhile (Spark's) keeps writing there. Use it around the start only; the caller calls
    :func:`show_jvm_output` on the file when it is done, which prints all but START_NOTES."""
    sink = tempfile.TemporaryFile()  # noqa: SIM115 - outlives the block: show_jvm_output closes it
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(sink.fileno(), 2)
    restored = False

    def restore() -> None:
        nonlocal restored
        if not restored:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            restored = True

    try:
        yield sink
    except BaseException:
        restore()
        show_jvm_output(sink)  # why the JVM did not start, say
        raise
    finally:
        restore()


def show_jvm_output(sink: IO[bytes]) -> None:
    """What the JVM wrote to ``sink`` but its start-up notes, on stderr; closes ``sink``."""
    sink.seek(0)
    text = sink.read().decode("utf-8", "replace")
    sink.close()
    kept = [line for line in text.splitlines() if line.strip() and not any(n in line for n in START_NOTES)]
    if kept:
        print("\n".join(kept), file=sys.stderr)


def spark_step(url: str, queue: str, root: tuple[Any, ...], rows: int = 5000) -> SparkStep:
    """Load ``rows`` rows into journaled ``queue`` (under ``root``) with Spark, drain it with
    a worker, and audit it; the caller removes the queue afterwards."""
    step = SparkStep(rows=rows)
    why = spark_available()
    if why is not None:
        step.skipped = why
        step.lines = [("spark step", f"skipped: {why}")]
        return step
    from pyspark.sql import functions as F

    from fdbqueue.spark import local_session
    from fdbqueue.spark.audit import run_audit

    with jvm_output() as jvm:
        spark = local_session("fdbqueue-demo")
    db = fdbqueue.open(url)
    out = tempfile.mkdtemp(prefix="fdbqueue-demo-audit-")
    try:
        fdbqueue.create_queue(db, queue, journal=True, root=root)
        options = {"url": url, "queue": queue, "root": json.dumps(list(root)), "dedupColumn": "order"}
        df = spark.range(rows).select(
            F.format_string("bulk-%06d", "id").alias("order"),
            (F.col("id") % 100).alias("amount"),
            (F.col("id") % 3 == 0).cast("int").alias("priority"),
        )
        q = fdbqueue.Queue(queue, root=root)
        start = time.perf_counter()
        df.write.format("fdbqueue").options(**options).mode("append").save()
        step.load_seconds = time.perf_counter() - start
        step.loaded = q.size(db)
        df.write.format("fdbqueue").options(**options).mode("append").save()  # a re-run
        step.loaded_again = q.size(db) - step.loaded
        worker = fdbqueue.Worker(db, q, lambda m: None)
        worker.run(until_empty=True)
        step.drained = worker.stats.processed
        report = run_audit(spark, url, out, queues=queue, root=root)
        step.audited, step.unaccounted = report.messages, report.unaccounted
        lat = report.queues[0].latency if report.queues else None
        step.p50_ms = lat[0] * 1000 if lat else None
    finally:
        db.close()
        shutil.rmtree(out, ignore_errors=True)
        show_jvm_output(jvm)  # what Spark wrote during the step, but its start-up notes
    rate = rows / step.load_seconds if step.load_seconds else 0.0
    step.lines = [
        (
            "spark: bulk load (df.write)",
            f"{step.loaded} rows in {step.load_seconds:.1f} s ({rate:,.0f} rows/s)",
        ),
        ("spark: the same load again", f"{step.loaded_again} added (each row once: dedupColumn)"),
        ("spark: drained by a worker", f"{step.drained}"),
        ("spark: fdbqueue audit", f"{step.audited} messages, {step.unaccounted} unaccounted"),
    ]
    return step
