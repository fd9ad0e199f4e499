"""Worker throughput in lease mode with short handlers, heartbeat on against off (target:
on >= 0.95 of off), alternating runs on fresh embedded stores (``sync=full``).

    python scripts/bench_workers.py [--messages 20000] [--runs 3] [--markdown]
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


def drain(n: int, heartbeat: bool) -> float:
    folder = tempfile.mkdtemp(prefix="bench-workers-")
    try:
        db = fdbqueue.open(f"sqlite://{folder}/q.db?sync=full")
        q = fdbqueue.Queue("jobs")
        for lo in range(0, n, 1000):
            q.enqueue_many(db, [b"x" * 100] * min(1000, n - lo))
        w = fdbqueue.Worker(db, "jobs", lambda m: None, heartbeat=heartbeat)
        start = time.perf_counter()
        stats = w.run(until_empty=True)
        secs = time.perf_counter() - start
        assert stats.processed == n
        db.close()
        return n / secs
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = parse_args(ap, None, messages=300, runs=1)
    print(machine(messages=args.messages, fs=filesystem_of(tempfile.gettempdir())))
    rows = []
    for run in range(args.runs):
        order = (True, False) if run % 2 == 0 else (False, True)
        rate = {hb: drain(args.messages, hb) for hb in order}
        ratio = rate[True] / rate[False]
        rows.append([str(run + 1), f"{rate[False]:,.0f}", f"{rate[True]:,.0f}", f"{ratio:.2f}"])
    show_table(
        "lease-mode worker, no-op handler: messages/s",
        ["run", "heartbeat off", "heartbeat on", "on / off"],
        rows,
        markdown=args.markdown,
    )


if __name__ == "__main__":
    main()
