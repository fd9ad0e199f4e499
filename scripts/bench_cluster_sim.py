#!/usr/bin/env python3
"""What the layer asks of a cluster, measured on the sim with ``fdbqueue.testing.traffic``.

Two workloads of issue 28, each in one run on one ``sim://`` database:

1. **busy**: 40 queues (``tenant.00`` ... ``tenant.39``), 4 producer threads enqueueing into
   random queues, 16 ``fdbqueue.Worker(db, "tenant.*", handler)`` in their own threads until
   every message is handled. Reported per message: the most written key's share of committed
   transactions (one key lives on one storage team; FoundationDB's developer guide, "Avoid
   hot keys"), conflicts (1020), committed write transactions, transactions in all.
2. **idle**: 200 empty queues (``idle.000`` ...), 32 idle pattern workers, then messages
   arriving one at a time at a slow rate: transactions per message (the herd: idle
   consumers woken for work they will not get).

Targets (issue 28): busy: hottest key <= 5 % of commits, <= 0.1 conflicts, <= 4 committed
write transactions and <= 6 transactions per message; idle: <= 8 transactions per message.

Each workload runs ``--runs`` times (seeds ``--seed`` on): the mean, and the range in
brackets (thread scheduling makes runs differ).

Usage: .venv/bin/python scripts/bench_cluster_sim.py [--messages 2000] [--idle-messages 60]
       [--rate 20] [--seed 1] [--runs 3] [--delay 0] [--only busy|idle] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib
import fdb.tuple

import fdbqueue
import fdbqueue.store.codec
from fdbqueue import Queue, Worker, testing
from fdbqueue.engines.sim.traffic import TrafficCounter

PAYLOAD = b"p" * 100


class Handled:
    """Counts handled messages; stops the workers once ``goal`` are."""

    def __init__(self, goal: int) -> None:
        self.goal = goal
        self.n = 0
        self.lock = threading.Lock()
        self.done = threading.Event()

    def __call__(self, m: fdbqueue.Message) -> None:
        with self.lock:
            self.n += 1
            if self.n >= self.goal:
                self.done.set()


def run_workers(
    db: Any, pattern: str, n: int, handled: Handled
) -> tuple[list[Worker], list[threading.Thread]]:
    workers = [Worker(db, pattern, handled, idle_timeout=1.0) for _ in range(n)]
    threads = [threading.Thread(target=w.run, daemon=True) for w in workers]
    for t in threads:
        t.start()
    return workers, threads


def stop(workers: list[Worker], threads: list[threading.Thread]) -> None:
    for w in workers:
        w.stop()
    for t in threads:
        t.join(timeout=30)


def key_name(key: bytes) -> str:
    try:
        return repr(fdb.tuple.unpack(key))
    except Exception:
        return repr(key)


def busy(messages: int, seed: int, delay: float) -> dict[str, Any]:
    db = fdbqueue.open(f"sim://?seed={seed}&delay={delay}")
    names = [f"tenant.{i:02d}" for i in range(40)]
    for name in names:
        fdbqueue.create_queue(db, name)
    handled = Handled(messages)
    rng = random.Random(seed)
    plan = [names[rng.randrange(len(names))] for _ in range(messages)]
    with testing.traffic(db) as t:
        workers, threads = run_workers(db, "tenant.*", 16, handled)
        start = time.perf_counter()

        def produce(part: list[str]) -> None:
            for name in part:
                Queue(name).enqueue(db, PAYLOAD)

        producers = [threading.Thread(target=produce, args=(plan[i::4],)) for i in range(4)]
        for p in producers:
            p.start()
        for p in producers:
            p.join()
        handled.done.wait(600)
        elapsed = time.perf_counter() - start
        stop(workers, threads)
    return summarise(t, handled.n, elapsed)


def idle(messages: int, rate: float, seed: int, delay: float) -> dict[str, Any]:
    db = fdbqueue.open(f"sim://?seed={seed}&delay={delay}")
    names = [f"idle.{i:03d}" for i in range(200)]
    for name in names:
        fdbqueue.create_queue(db, name)
    handled = Handled(messages)
    workers, threads = run_workers(db, "idle.*", 32, handled)
    time.sleep(2.0)  # every worker has found nothing and waits
    rng = random.Random(seed)
    with testing.traffic(db) as t:
        start = time.perf_counter()
        for _ in range(messages):
            Queue(names[rng.randrange(len(names))]).enqueue(db, PAYLOAD)
            time.sleep(1.0 / rate)
        handled.done.wait(600)
        elapsed = time.perf_counter() - start
        stop(workers, threads)
    return summarise(t, handled.n, elapsed)


def summarise(t: TrafficCounter, handled: int, elapsed: float) -> dict[str, Any]:
    hot = t.hottest(3)
    n = max(1, handled)
    return {
        "handled": handled,
        "seconds": elapsed,
        "hottest": [(key_name(k), w) for k, w in hot],
        "hottest_share": hot[0][1] / t.commits if hot and t.commits else 0.0,
        "conflicts": t.conflicts / n,
        "commits": t.commits / n,
        "transactions": t.transactions / n,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=2000, help="busy: messages (default 2000)")
    ap.add_argument("--idle-messages", type=int, default=60, help="idle: messages (default 60)")
    ap.add_argument("--rate", type=float, default=20.0, help="idle: messages a second (default 20)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--delay", type=float, default=0.0, help="sim commit latency, seconds (default 0)")
    ap.add_argument(
        "--runs", type=int, default=3, help="runs of each, seeds seed.. (default 3): mean (min-max)"
    )
    ap.add_argument("--only", choices=["busy", "idle"], default=None)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--smoke", action="store_true", help="300 busy and 20 idle messages, one run (CI)")
    args = ap.parse_args()
    if args.smoke:
        args.messages, args.idle_messages, args.runs = 300, 20, 1
    settings = benchlib.machine(
        messages=args.messages,
        idle_messages=args.idle_messages,
        rate=args.rate,
        seed=args.seed,
        delay=args.delay,
        runs=args.runs,
    )
    print(", ".join(f"{k}={v}" for k, v in settings.items()))
    rows = []
    hottest: list[tuple[str, int]] = []
    seeds = range(args.seed, args.seed + args.runs)

    def cell(runs: list[dict[str, Any]], name: str, fmt: str, scale: float = 1.0) -> str:
        vals = [scale * r[name] for r in runs]
        mean = sum(vals) / len(vals)
        if len(vals) == 1:
            return fmt.format(mean)
        return f"{fmt.format(mean)} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"

    if args.only in (None, "busy"):
        bs = [busy(args.messages, seed, args.delay) for seed in seeds]
        rows += [
            ["busy", "hottest key's share of commits, %", cell(bs, "hottest_share", "{:.1f}", 100.0), "<= 5"],
            ["busy", "conflicts (1020) per message", cell(bs, "conflicts", "{:.3f}"), "<= 0.1"],
            ["busy", "committed write transactions per message", cell(bs, "commits", "{:.2f}"), "<= 4"],
            ["busy", "transactions per message", cell(bs, "transactions", "{:.2f}"), "<= 6"],
            ["busy", "seconds a run", cell(bs, "seconds", "{:.1f}"), ""],
        ]
        hottest = bs[0]["hottest"]
    if args.only in (None, "idle"):
        ids = [idle(args.idle_messages, args.rate, seed, args.delay) for seed in seeds]
        rows += [
            ["idle", "transactions per message", cell(ids, "transactions", "{:.2f}"), "<= 8"],
            ["idle", "committed write transactions per message", cell(ids, "commits", "{:.2f}"), ""],
            ["idle", "hottest key's share of commits, %", cell(ids, "hottest_share", "{:.1f}", 100.0), ""],
        ]
    benchlib.show_table(
        "hot keys and the herd on the sim (testing.traffic)",
        ["workload", "measure", "measured", "target"],
        rows,
        markdown=args.markdown,
    )
    if hottest:
        print("busy (first run): most written keys:", "; ".join(f"{k} x{w}" for k, w in hottest))


if __name__ == "__main__":
    main()
