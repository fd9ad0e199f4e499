"""The end-to-end demo: producer and worker processes sharing one embedded store.

Producers enqueue orders; workers dequeue each one inside a transaction that also
records the order as processed, so each is processed exactly once. At the end the
demo checks that from the store's own records and prints a summary.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import fdbqueue
from fdbqueue.engines.base import Transaction, transactional

QUEUE = "demo.orders"


def _producer(url: str, start: int, count: int) -> None:
    db = fdbqueue.open(url)
    q = fdbqueue.Queue(QUEUE)
    for i in range(start, start + count):
        q.enqueue(db, {"order": i, "sent": time.time()}, priority=1 if i % 10 == 0 else 0)
    db.close()


def _worker(url: str, expected: int, out: Any) -> None:
    db = fdbqueue.open(url)
    q = fdbqueue.Queue(QUEUE)
    latencies: list[float] = []

    @transactional
    def process(tr: Transaction) -> float | None:
        m = q.dequeue(tr)
        if m is None:
            return None
        body = m.json()
        key = b"demo/processed/%08d" % body["order"]
        seen = tr.get(key)
        tr.set(key, b"%d" % (int(seen or b"0") + 1))  # counts deliveries: must end at 1
        tr.add(b"demo/total", (1).to_bytes(8, "little"))
        return time.time() - float(body["sent"])

    idle_since = time.monotonic()
    while True:
        lat = process(db)
        if lat is not None:
            latencies.append(lat)
            idle_since = time.monotonic()
            continue
        total = int.from_bytes(db.get(b"demo/total") or b"\0", "little")  # type: ignore[attr-defined]
        if total >= expected or time.monotonic() - idle_since > 10:
            break
        q.wait(db, timeout=0.5)  # a watch: wakes on the next enqueue, no polling
    out.put(latencies)
    db.close()


@dataclass
class DemoResult:
    messages: int
    processed_once: int
    duplicates: int
    missing: int
    seconds: float
    p50_ms: float
    p99_ms: float

    @property
    def ok(self) -> bool:
        return self.processed_once == self.messages and not self.duplicates and not self.missing


def run_demo(url: str | None = None, *, messages: int = 2000, producers: int = 2, workers: int = 3) -> DemoResult:
    """Run the demo on ``url`` (default: a fresh embedded store in a temporary directory)."""
    tmp = None
    if url is None:
        tmp = tempfile.mkdtemp(prefix="fdbqueue-demo-")
        url = f"sqlite://{os.path.join(tmp, 'demo.db')}?sync=normal"
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    per = messages // producers
    total = per * producers
    start = time.perf_counter()
    procs = [ctx.Process(target=_producer, args=(url, i * per, per)) for i in range(producers)]
    procs += [ctx.Process(target=_worker, args=(url, total, out)) for _ in range(workers)]
    for p in procs:
        p.start()
    latencies: list[float] = []
    for _ in range(workers):
        latencies.extend(out.get(timeout=300))
    for p in procs:
        p.join()
    seconds = time.perf_counter() - start
    db = fdbqueue.open(url)
    counts = [int(kv.value) for kv in db.get_range_startswith(b"demo/processed/")]  # type: ignore[attr-defined]
    db.close()
    latencies.sort()

    def pct(p: float) -> float:
        return latencies[min(len(latencies) - 1, int(p * len(latencies)))] * 1000 if latencies else 0.0

    return DemoResult(
        messages=total,
        processed_once=sum(1 for c in counts if c == 1),
        duplicates=sum(1 for c in counts if c > 1),
        missing=total - len(counts),
        seconds=seconds,
        p50_ms=pct(0.50),
        p99_ms=pct(0.99),
    )
