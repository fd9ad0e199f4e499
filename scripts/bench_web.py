"""The dashboard's server time with many queues (embedded engine, ``sync=full``).

The sampler reads every queue in the background (``all_queue_stats``: a transaction per hundred
queues); a page's request then serializes the latest sample. Measured in one run: the sample,
the server's own time for each endpoint the pages call (its ``Server-Timing`` header) and the
whole request from a client, beside the Prometheus scrape of the same queues (what one reading
of every queue costs the exporter) and one ``queue_stats`` a queue (what a page reading each
queue itself would cost).

    python scripts/bench_web.py [--queues 1000] [--requests 20]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request

sys.path.insert(0, os.path.dirname(__file__))

from benchlib import machine, parse_args

import fdbqueue
from fdbqueue.runtime.metrics import serve
from fdbqueue.web import Dashboard


def timed(url: str, n: int) -> tuple[float, float, int]:
    """Median server time (ms, from Server-Timing), median client time (ms), response bytes."""
    server, client = [], []
    size = 0
    for _ in range(n):
        start = time.perf_counter()
        with urllib.request.urlopen(url, timeout=120) as r:
            body = r.read()
            header = r.headers.get("server-timing", "app;dur=nan")
        client.append((time.perf_counter() - start) * 1000)
        server.append(float(header.split("dur=")[1]))
        size = len(body)
    return statistics.median(server), statistics.median(client), size


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=20)
    args = parse_args(ap, None, queues=20, requests=2)
    folder = tempfile.mkdtemp(prefix="bench-web-")
    try:
        db = fdbqueue.open(f"sqlite://{folder}/q.db")
        for i in range(args.queues):
            fdbqueue.Queue(f"tenant.q{i:05d}").enqueue_many(db, [b"x"] * (1 + i % 5))
        dash = Dashboard(db, interval=3600, window=7200)  # samples only when asked, to time them apart
        samples = []
        for _ in range(5):
            start = time.perf_counter()
            dash.sampler.sample()
            samples.append((time.perf_counter() - start) * 1000)
        per_queue = []
        for _ in range(3):
            start = time.perf_counter()
            for name in fdbqueue.list_queues(db):
                fdbqueue.queue_stats(db, name)
            per_queue.append((time.perf_counter() - start) * 1000)
        exporter = serve(db, 0, "127.0.0.1")
        scrapes = []
        for _ in range(5):
            start = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=120) as r:
                r.read()
            scrapes.append((time.perf_counter() - start) * 1000)
        exporter.close()
        with dash.start(port=0) as run:
            rows = [
                ("GET / (the page)", timed(run.url + "/", args.requests)),
                ("GET /api/overview (every queue)", timed(run.url + "/api/overview", args.requests)),
                (
                    "GET /api/queue?name=... (one queue)",
                    timed(run.url + "/api/queue?name=tenant.q00007", args.requests),
                ),
                (
                    "GET /api/messages?queue=...",
                    timed(run.url + "/api/messages?queue=tenant.q00004", args.requests),
                ),
            ]
        sample = statistics.median(samples)
        print(machine(queues=args.queues, requests=args.requests))
        print(f"| what ({args.queues} queues) | server ms (median) | client ms (median) | bytes |")
        print("|---|---:|---:|---:|")
        for what, (server, client, size) in rows:
            print(f"| {what} | {server:.1f} | {client:.1f} | {size:,} |")
        print(f"| sampler: every queue read (all_queue_stats) | {sample:.0f} | | |")
        scrape, each = statistics.median(scrapes), statistics.median(per_queue)
        print(f"| beside: Prometheus scrape of the same queues | {scrape:.0f} | | |")
        print(f"| beside: queue_stats a queue, one transaction each | {each:.0f} | | |")
        overview = rows[1][1][0]
        print(
            f"ratios: a page's overview costs {overview / sample:.2f} of one sample; a sample "
            f"costs {sample / each:.2f} of reading each queue in its own transaction"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
