"""A CPU-bound handler (about 10 ms of pure Python per message) on one worker: ``processes=2``
against ``processes=0`` (one handler thread, the GIL's ceiling) and ``processes=1`` (the
pool's own cost), alternating runs on fresh
embedded stores. Target on 2 cores: processes=2 at >= 1.7x the messages per second.

    python scripts/bench_pool.py [--messages 400] [--runs 3] [--ms 10] [--markdown]
    python scripts/bench_pool.py --smoke      # a few messages each way: it runs, for CI

Each run's time includes starting the children (``Worker.run`` starts them before it leases);
the load average is printed before and after, since other work on the machine takes cores
from the children.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from benchlib import loadavg, machine, show_table

import fdbqueue


def spin(n: int) -> int:
    """Pure Python work: ``n`` rounds of integer arithmetic (holds the GIL throughout)."""
    x = 0
    for i in range(n):
        x = (x * 31 + i) % 1_000_003
    return x


def burn(m: fdbqueue.Message) -> None:
    """The handler: the payload says how many rounds make the wanted milliseconds."""
    spin(int(m.payload))


def calibrate(ms: float) -> int:
    """Rounds of :func:`spin` that take ``ms`` milliseconds here (best of a few tries)."""
    n = 20_000
    best = min(_timed(n) for _ in range(5))
    return max(1, int(n * (ms / 1000) / best))


def _timed(n: int) -> float:
    start = time.perf_counter()
    spin(n)
    return time.perf_counter() - start


def drain(messages: int, rounds: int, processes: int) -> tuple[float, float]:
    """Messages per second through one worker with ``processes`` children (0: a thread),
    and this process's CPU milliseconds per message (with children: the parent's share,
    leasing and settling; without: the handler's too)."""
    folder = tempfile.mkdtemp(prefix="bench-pool-")
    try:
        db = fdbqueue.open(f"sqlite://{folder}/q.db?sync=normal")
        fdbqueue.Queue("jobs").enqueue_many(db, [str(rounds)] * messages)
        w = fdbqueue.Worker(db, "jobs", burn, processes=processes)
        start, cpu = time.perf_counter(), time.process_time()
        stats = w.run(until_empty=True)
        secs, cpu = time.perf_counter() - start, time.process_time() - cpu
        assert stats.processed == messages, stats
        db.close()
        return messages / secs, cpu * 1000 / messages
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=400)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--ms", type=float, default=10.0, help="CPU milliseconds per message")
    ap.add_argument("--smoke", action="store_true", help="20 messages, 1 run: that it works")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    if args.smoke:
        args.messages, args.runs = 20, 1
    rounds = calibrate(args.ms)
    load_before = loadavg()
    rates: dict[int, list[float]] = {0: [], 1: [], 2: []}
    cpu: dict[int, list[float]] = {0: [], 1: [], 2: []}
    for _ in range(args.runs):
        for processes in rates:  # alternating: a change in the machine's load hits each
            rate, ms = drain(args.messages, rounds, processes)
            rates[processes].append(rate)
            cpu[processes].append(ms)
    load_after = loadavg()
    one, two = statistics.median(rates[0]), statistics.median(rates[2])
    print(machine(messages=args.messages, runs=args.runs, ms=args.ms, rounds=rounds))
    print(f"load average before {load_before}, after {load_after}")
    cells = [
        [
            f"processes={p}",
            f"{statistics.median(r):.1f}",
            ", ".join(f"{x:.1f}" for x in r),
            f"{statistics.median(cpu[p]):.2f}",
        ]
        for p, r in rates.items()
    ]
    show_table(
        f"a {args.ms:g} ms CPU-bound handler, {args.messages} messages",
        ["worker", "msg/s (median)", "runs", "worker process CPU ms/msg"],
        cells,
        markdown=args.markdown,
    )
    print(f"ratio processes=2 / processes=0: {two / one:.2f}x (target >= 1.7x on 2 idle cores)")
    print(f"ratio processes=1 / processes=0: {statistics.median(rates[1]) / one:.2f}x (the pool's overhead)")


if __name__ == "__main__":
    main()
