"""The Prometheus endpoint's scrape time with many queues (embedded engine, ``sync=full``):
each scrape lists the queues and reads each one's counters (one short transaction a queue).

    python scripts/bench_metrics.py [--queues 1000] [--scrapes 5]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--queues", type=int, default=1000)
    ap.add_argument("--scrapes", type=int, default=5)
    args = parse_args(ap, None, queues=20, scrapes=1)
    folder = tempfile.mkdtemp(prefix="bench-metrics-")
    try:
        db = fdbqueue.open(f"sqlite://{folder}/q.db")
        for i in range(args.queues):
            fdbqueue.Queue(f"tenant.q{i:05d}").enqueue(db, b"x")
        exporter = serve(db, 0, "127.0.0.1")
        times = []
        for _ in range(args.scrapes):
            start = time.perf_counter()
            with urllib.request.urlopen(f"http://127.0.0.1:{exporter.port}/metrics", timeout=120) as r:
                body = r.read()
            times.append(time.perf_counter() - start)
        exporter.close()
        print(machine(queues=args.queues, scrapes=args.scrapes))
        print(
            f"scrape of {args.queues} queues: median {statistics.median(times) * 1000:.0f} ms, "
            f"min {min(times) * 1000:.0f} ms, max {max(times) * 1000:.0f} ms, {len(body):,} bytes"
        )
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
