"""The end-to-end demo: producer and worker processes sharing one store.

Producers enqueue orders - most plain, some high priority, some delayed, some that fail
once (retried), some poison (always fail: dead-lettered after max_deliveries) and some that
expire before they are due. Workers process each order exactly once: the dequeue and the
handler's writes are one transaction. Sweeps run in the workers. When every order is
accounted for, the demo stops the workers with SIGTERM (a graceful shutdown) and checks
exactly-once from the store's own records.

The demo never touches a user's queues. By default it makes a fresh embedded store in a
temporary directory (``sync=full``, the durable setting) and removes it afterwards. Given a
URL, it works in queues and keys named uniquely for the run (``demo-<run>.orders``, under
the root ``("fdbqueue-demo", <run>)``) and removes them at the end, so that runs never see
each other's orders.
"""

from __future__ import annotations

import contextlib
import logging
import multiprocessing as mp
import os
import shutil
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import fdb.tuple

import fdbqueue
from fdbqueue.cli.spark_step import SparkStep, spark_step
from fdbqueue.runtime.worker import Worker
from fdbqueue.store.layout import DEFAULT_ROOT


@dataclass(frozen=True)
class _Names:
    """Where one run keeps its orders: its queues and its own records, unique to the run."""

    run: str
    own_root: bool = False  # in a user's store: queues under a root of the run's own

    @property
    def root(self) -> tuple[str, ...]:
        # In a user's store a subspace of the run's own: removing it leaves the store as it
        # was, the default root's own keys (its work index's bell) untouched. In the demo's
        # temporary store the default root, where `fdbqueue list` looks.
        return ("fdbqueue-demo", self.run) if self.own_root else DEFAULT_ROOT

    @property
    def queue(self) -> str:
        return f"demo-{self.run}.orders"

    @property
    def errors(self) -> str:
        return f"{self.queue}.error"

    @property
    def prefix(self) -> bytes:
        return b"demo/%s/" % self.run.encode()

    def done(self, order: int) -> bytes:
        return self.prefix + b"done/%08d" % order

    def latency(self, order: int) -> bytes:
        return self.prefix + b"latency/%08d" % order


def _kind(i: int) -> str:
    """A fixed mix, so every run shows every case."""
    r = i % 40
    return {0: "poison", 1: "expiring", 2: "flaky", 3: "flaky"}.get(
        r, "delayed" if r < 8 else "priority" if r < 12 else "plain"
    )


def _producer(url: str, names: _Names, start: int, count: int) -> None:
    db = fdbqueue.open(url)
    q = fdbqueue.Queue(names.queue, root=names.root)
    for i in range(start, start + count):
        kind = _kind(i)
        body = {"order": i, "kind": kind, "sent": time.time(), "delay": 0.0}
        if kind == "delayed":
            body["delay"] = 0.5
            q.enqueue(db, body, delay=0.5)
        elif kind == "expiring":
            q.enqueue(db, body, delay=1.0, ttl=0.2)  # expires before it is due
        elif kind == "priority":
            q.enqueue(db, body, priority=5)
        else:
            q.enqueue(db, body)
    db.close()


class OrderFailed(Exception):
    """The demo's deliberate failure: a poison order, or a flaky order's first delivery."""


@dataclass
class _Handler:
    """The workers' handler: records each order once, in the dequeue's transaction."""

    names: _Names

    def __call__(self, tr: Any, m: fdbqueue.Message) -> None:
        body = m.json()
        if body["kind"] == "poison":
            raise OrderFailed(f"order {body['order']} is poison: it fails every delivery")
        if body["kind"] == "flaky" and m.deliveries == 1:
            raise OrderFailed(f"order {body['order']} is flaky: it fails its first delivery")
        key = self.names.done(body["order"])
        tr.set(key, b"%d" % (int(tr.get(key) or b"0") + 1))  # must end at exactly 1
        latency = time.time() - body["sent"] - body["delay"]
        tr.set(self.names.latency(body["order"]), struct.pack("<dB", latency, m.deliveries))


LOG_FORMAT = "%(levelname)s %(name)s: %(message)s"


def _deliberate(record: logging.LogRecord) -> bool:
    return record.exc_info is not None and isinstance(record.exc_info[1], OrderFailed)


class _OneLine(logging.Formatter):
    """The record's line without the traceback: a failure the demo causes on purpose."""

    def format(self, record: logging.LogRecord) -> str:
        return self._fmt % {**record.__dict__, "message": record.getMessage()} if self._fmt else ""


def worker_logging(sink: Path, logger: logging.Logger | None = None) -> None:
    """A demo worker's logging (``logger``: ``fdbqueue``'s): the deliberate failures
    (:class:`OrderFailed`) one line each, appended to ``sink``, which the demo counts and
    samples after its summary; every other record on stderr as it happens, traceback and all,
    so that an unexpected error is never hidden among the expected ones."""
    logger = logger or logging.getLogger("fdbqueue")
    planned = logging.FileHandler(sink, encoding="utf-8")
    planned.addFilter(_deliberate)
    planned.setFormatter(_OneLine(LOG_FORMAT))
    other = logging.StreamHandler(sys.stderr)
    other.addFilter(lambda record: not _deliberate(record))
    other.setFormatter(logging.Formatter(LOG_FORMAT))
    logger.handlers[:] = [planned, other]
    logger.setLevel(logging.WARNING)
    logger.propagate = False


def _worker(url: str, names: _Names, sink: str) -> None:
    worker_logging(Path(sink))
    db = fdbqueue.open(url)
    q = fdbqueue.Queue(names.queue, root=names.root)
    worker = Worker(db, q, _Handler(names), mode="exactly_once", sweep_interval=0.2, idle_timeout=0.2)
    worker.run(install_signals=True)
    db.close()


@dataclass
class DemoResult:
    """What the demo measured; ``ok`` when every order was processed once or accounted for."""

    url: str
    messages: int
    processed: int
    processed_once: int
    duplicates: int
    retried: int
    dead: int
    expired: int
    lost: int
    seconds: float
    p50_ms: float
    p99_ms: float
    producers: int
    workers: int
    kept: str | None = None  # the temporary store's folder, when asked to keep it
    failures: list[str] = field(default_factory=list)  # the workers' lines for deliberate failures
    failure_log: str | None = None  # where they are kept (``keep``), else None
    removed: list[str] = field(default_factory=list)  # what the demo cleaned up at the end
    spark: SparkStep | None = None  # the Spark step (cli/spark_step.py), when asked for

    @property
    def missing(self) -> int:
        return self.lost

    @property
    def throughput(self) -> float:
        return self.processed / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> bool:
        spark_ok = self.spark is None or self.spark.ok
        return not self.duplicates and not self.lost and self.processed == self.processed_once and spark_ok

    def rows(self) -> list[tuple[str, str]]:
        """The summary table: (what, value)."""
        return [
            ("engine", self.url),
            ("processes", f"{self.producers} producers, {self.workers} workers (exactly-once mode)"),
            ("enqueued", f"{self.messages}"),
            ("processed (exactly once)", f"{self.processed_once}"),
            ("  of which retried after a failure", f"{self.retried}"),
            ("dead-lettered (poison)", f"{self.dead}"),
            ("expired before due", f"{self.expired}"),
            ("processed twice", f"{self.duplicates}"),
            ("lost", f"{self.lost}"),
            ("wall time", f"{self.seconds:.2f} s"),
            ("throughput", f"{self.throughput:,.0f} msg/s"),
            ("time in queue p50 / p99", f"{self.p50_ms:.1f} / {self.p99_ms:.1f} ms (enqueue to processed)"),
            *(self.spark.lines if self.spark is not None else []),
            *[("removed", what) for what in self.removed],
            *([("kept", self.kept)] if self.kept else []),
        ]

    def notes(self, sample: int = 3) -> list[str]:
        """Lines after the summary: the deliberate failures, counted, and a few as logged."""
        if not self.failures:
            return []
        n = len(self.failures)
        where = f" (every one: {self.failure_log})" if self.failure_log else " (--keep keeps every one)"
        lines = [
            f"deliberate failures: {n} handler calls failed on purpose (poison orders fail every "
            f"delivery, flaky ones their first), each logged in one line{where}; the first {min(n, sample)}:"
        ]
        lines += [f"  {line}" for line in self.failures[:sample]]
        return lines


def run_demo(
    url: str | None = None,
    *,
    messages: int = 2000,
    producers: int = 2,
    workers: int = 3,
    timeout: float = 120.0,
    keep: bool = False,
    spark: bool | None = None,
) -> DemoResult:
    """Run the demo; ``url`` None (the default): a new embedded store in a temporary directory.
    ``spark``: then the Spark step (bulk load, drain, audit: ``cli/spark_step.py``); None runs it
    when pyspark and Java are installed, and says why not otherwise.

    The temporary store is durable (``sync=full``) and removed at the end unless ``keep``.
    Given ``url``, the demo's queues and records are named for this run and removed at the end
    (``keep`` leaves them); nothing else in that store is read or written.
    """
    folder = None
    if url is None:
        folder = tempfile.mkdtemp(prefix="fdbqueue-demo-")
        url = f"sqlite://{os.path.join(folder, 'demo.db')}?sync=full"
    names = _Names(os.urandom(4).hex(), own_root=folder is None)
    bulk = f"demo-{names.run}.bulk"  # the Spark step's queue
    if folder:
        sink = os.path.join(folder, "failures.log")
    else:
        fd, sink = tempfile.mkstemp(prefix="fdbqueue-demo-failures-", suffix=".log")
        os.close(fd)
    try:
        result = _run(url, names, messages, producers, workers, timeout, sink)
        result.failure_log = sink if keep else None
        if spark is not False:  # None and True alike: it runs where pyspark and Java are, else says why not
            result.spark = spark_step(url, bulk, names.root)
        if not keep:
            result.removed.append(
                f"temporary store {folder}"
                if folder
                else f"queues {names.queue}, {names.errors}" + (f", {bulk}" if result.spark else "")
            )
        elif folder:
            result.kept = f"{folder} (look inside: fdbqueue --url '{url}' list)"
        else:
            result.kept = f"queues {names.queue}, {names.errors} under root {names.root!r}"
        return result
    finally:
        if not keep:
            if folder:
                shutil.rmtree(folder, ignore_errors=True)
            else:
                _clean(url, names)
                with contextlib.suppress(OSError):
                    os.remove(sink)


def _clean(url: str, names: _Names) -> None:
    """Remove this run's queues and records from a store given by URL."""
    db = fdbqueue.open(url)
    try:
        for name in (names.queue, names.errors, f"demo-{names.run}.bulk"):
            with contextlib.suppress(fdbqueue.QueueNotFoundError):
                fdbqueue.destroy_queue(db, name, root=names.root)

        @fdbqueue.transactional
        def clear(tr: Any) -> None:
            tr.clear_range_startswith(names.prefix)
            tr.clear_range_startswith(fdb.tuple.pack(names.root))  # what else the run's root holds

        clear(db)
    finally:
        db.close()


def _run(
    url: str, names: _Names, messages: int, producers: int, workers: int, timeout: float, sink: str
) -> DemoResult:
    db = fdbqueue.open(url)
    # Five deliveries: a flaky order that several workers saw fail at once still gets through.
    fdbqueue.create_queue(
        db, names.queue, max_deliveries=5, retry_delay=0.05, lease_seconds=5.0, root=names.root
    )
    ctx = mp.get_context("spawn")
    per = max(1, messages // producers)
    total = per * producers
    start = time.perf_counter()
    worker_procs = [ctx.Process(target=_worker, args=(url, names, sink)) for _ in range(workers)]
    producer_procs = [
        ctx.Process(target=_producer, args=(url, names, i * per, per)) for i in range(producers)
    ]
    for p in worker_procs + producer_procs:
        p.start()
    try:
        for p in producer_procs:
            p.join(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = fdbqueue.queue_stats(db, names.queue, root=names.root)
            if not (st.ready or st.delayed or st.inflight or st.lease_ended):  # producers done
                break
            time.sleep(0.05)
        seconds = time.perf_counter() - start
    finally:
        for p in worker_procs:
            if p.is_alive():
                os.kill(p.pid or 0, signal.SIGTERM)  # graceful: finish the message in hand
        for p in worker_procs + producer_procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    # What is due and not yet swept (an order past its TTL, which the views already count as
    # expired) goes where a sweep puts it before the count: the workers' last sweep may have
    # run before it came due.
    fdbqueue.Queue(names.queue, root=names.root).sweep(db)
    counts = [int(kv.value) for kv in db.get_range_startswith(names.prefix + b"done/")]  # type: ignore[attr-defined]
    stats = [struct.unpack("<dB", kv.value) for kv in db.get_range_startswith(names.prefix + b"latency/")]  # type: ignore[attr-defined]
    dead = expired = 0
    for m in fdbqueue.Queue(names.errors, root=names.root).browse(db, limit=None):
        dead += m.reason != "expired"
        expired += m.reason == "expired"
    db.close()
    latencies = sorted(lat for lat, _ in stats)

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    processed = len(counts)
    return DemoResult(
        url=url,
        messages=total,
        processed=processed,
        processed_once=sum(1 for c in counts if c == 1),
        duplicates=sum(1 for c in counts if c > 1),
        retried=sum(1 for _, deliveries in stats if deliveries > 1),
        dead=dead,
        expired=expired,
        lost=total - processed - dead - expired,
        seconds=seconds,
        p50_ms=pct(0.50),
        p99_ms=pct(0.99),
        producers=producers,
        workers=workers,
        failures=Path(sink).read_text(encoding="utf-8").splitlines() if os.path.exists(sink) else [],
    )
