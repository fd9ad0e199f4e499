"""AsyncWorker throughput with I/O-bound handlers: ``concurrency`` handlers in flight on one
event loop, each awaiting ``--io-ms`` (an HTTP call or a database write, say), on the embedded
engine (``sync=full``). Target (issue: throughput and asyncio): 100 handlers awaiting 10 ms
>= 5,000 msg/s in one process (the physical limit is 10,000/s per 100 in flight). Beside it,
the thread-based Worker with the same handler made blocking (``time.sleep``) and 100 threads.

    python scripts/bench_aio.py [--messages 20000] [--concurrency 100] [--io-ms 10] [--runs 3]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(__file__))

from benchlib import filesystem_of, machine, parse_args, show_table

import fdbqueue
from fdbqueue import aio


def _store(n: int) -> tuple[str, fdbqueue.Database]:
    folder = tempfile.mkdtemp(prefix="bench-aio-")
    db = fdbqueue.open(f"sqlite://{folder}/q.db?sync=full")
    q = fdbqueue.Queue("jobs")
    for lo in range(0, n, 1000):
        q.enqueue_many(db, [b"x" * 100] * min(1000, n - lo))
    return folder, db


def _rate(n: int, drain: Callable[[fdbqueue.Database], fdbqueue.WorkerStats]) -> float:
    """Messages a second for ``drain`` to take ``n`` from a fresh store (checked: all of them)."""
    folder, db = _store(n)
    try:
        start = time.perf_counter()
        stats = drain(db)
        secs = time.perf_counter() - start
        assert stats.processed == n, stats
        return n / secs
    finally:
        db.close()
        shutil.rmtree(folder, ignore_errors=True)


def run_async(n: int, concurrency: int, io: float) -> float:
    async def handle(m: fdbqueue.Message) -> None:
        await asyncio.sleep(io)

    return _rate(
        n,
        lambda db: asyncio.run(
            aio.AsyncWorker(db, "jobs", handle, concurrency=concurrency).run(until_empty=True)
        ),
    )


def run_threads(n: int, concurrency: int, io: float) -> float:
    return _rate(
        n,
        lambda db: fdbqueue.Worker(db, "jobs", lambda m: time.sleep(io), concurrency=concurrency).run(
            until_empty=True
        ),
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=100)
    ap.add_argument("--io-ms", type=float, default=10.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = parse_args(ap, None, messages=400, concurrency=20, io_ms=1.0, runs=1)
    io = args.io_ms / 1000
    print(
        machine(
            messages=args.messages,
            concurrency=args.concurrency,
            io_ms=args.io_ms,
            fs=filesystem_of(tempfile.gettempdir()),
        )
    )
    limit = args.concurrency / io
    rows = []
    for name, fn in (("AsyncWorker", run_async), ("Worker (threads)", run_threads)):
        rates = [fn(args.messages, args.concurrency, io) for _ in range(args.runs)]
        med = statistics.median(rates)
        rows.append([name, f"{med:,.0f}", f"{med / limit:.2f}", ", ".join(f"{r:,.0f}" for r in rates)])
    show_table(
        f"{args.concurrency} handlers each awaiting {args.io_ms:g} ms: messages/s (limit {limit:,.0f})",
        ["what", "msg/s (median)", "/ limit", "runs"],
        rows,
        markdown=args.markdown,
    )


if __name__ == "__main__":
    main()
