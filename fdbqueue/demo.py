"""The end-to-end demo: producer and worker processes sharing one embedded store.

Producers enqueue orders - most plain, some high priority, some delayed, some that fail
once (retried), some poison (always fail: dead-lettered after max_deliveries) and some that
expire before they are due. Workers process each order exactly once: the dequeue and the
handler's writes are one transaction. Sweeps run in the workers. When every order is
accounted for, the demo stops the workers with SIGTERM (a graceful shutdown) and checks
exactly-once from the store's own records.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import signal
import struct
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import fdbqueue
from fdbqueue.worker import Worker

QUEUE = "demo.orders"
ERRORS = "demo.orders.error"


def _kind(i: int) -> str:
    """A fixed mix, so every run shows every case."""
    r = i % 40
    return {0: "poison", 1: "expiring", 2: "flaky", 3: "flaky"}.get(
        r, "delayed" if r < 8 else "priority" if r < 12 else "plain"
    )


def _producer(url: str, start: int, count: int) -> None:
    db = fdbqueue.open(url)
    q = fdbqueue.Queue(QUEUE)
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


def _handle(tr: Any, m: fdbqueue.Message) -> None:
    body = m.json()
    if body["kind"] == "poison" or (body["kind"] == "flaky" and m.deliveries == 1):
        raise ValueError(f"order {body['order']} cannot be processed")
    key = b"demo/done/%08d" % body["order"]
    tr.set(key, b"%d" % (int(tr.get(key) or b"0") + 1))  # must end at exactly 1
    latency = time.time() - body["sent"] - body["delay"]
    tr.set(b"demo/latency/%08d" % body["order"], struct.pack("<dB", latency, m.deliveries))


def _worker(url: str) -> None:
    db = fdbqueue.open(url)
    worker = Worker(db, QUEUE, _handle, mode="exactly_once", sweep_interval=0.2, idle_timeout=0.2)
    import logging

    logging.getLogger("fdbqueue").setLevel(logging.ERROR)  # the poison messages fail on purpose
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

    @property
    def missing(self) -> int:
        return self.lost

    @property
    def throughput(self) -> float:
        return self.processed / self.seconds if self.seconds else 0.0

    @property
    def ok(self) -> bool:
        return not self.duplicates and not self.lost and self.processed == self.processed_once

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
        ]


def run_demo(
    url: str | None = None,
    *,
    messages: int = 2000,
    producers: int = 2,
    workers: int = 3,
    timeout: float = 120.0,
) -> DemoResult:
    """Run the demo on ``url`` (default: a new embedded store in a temporary directory)."""
    if url is None:
        url = f"sqlite://{os.path.join(tempfile.mkdtemp(prefix='fdbqueue-demo-'), 'demo.db')}?sync=normal"
    db = fdbqueue.open(url)
    # Five deliveries: a flaky order that several workers saw fail at once still gets through.
    fdbqueue.create_queue(db, QUEUE, max_deliveries=5, retry_delay=0.05, lease_seconds=5.0)
    ctx = mp.get_context("spawn")
    per = max(1, messages // producers)
    total = per * producers
    start = time.perf_counter()
    worker_procs = [ctx.Process(target=_worker, args=(url,)) for _ in range(workers)]
    producer_procs = [ctx.Process(target=_producer, args=(url, i * per, per)) for i in range(producers)]
    for p in worker_procs + producer_procs:
        p.start()
    try:
        for p in producer_procs:
            p.join(timeout)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            st = fdbqueue.queue_stats(db, QUEUE)
            if not (st.ready or st.delayed or st.inflight):  # the producers are done: all enqueued
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
    counts = [int(kv.value) for kv in db.get_range_startswith(b"demo/done/")]  # type: ignore[attr-defined]
    stats = [struct.unpack("<dB", kv.value) for kv in db.get_range_startswith(b"demo/latency/")]  # type: ignore[attr-defined]
    dead = expired = 0
    for m in fdbqueue.Queue(ERRORS).browse(db):
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
    )
