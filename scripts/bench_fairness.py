#!/usr/bin/env python3
"""Fair consumption over many queues (the work index), on the embedded engine, in one run:

1. fairness: 1 queue with 10,000 messages and 50 queues with 10, one worker given the
   pattern: by which message every small queue has been served, and when all are drained;
2. a worker idle on 1,000 queues: threads, watches and CPU seconds over ``--idle`` seconds,
   given the pattern (the index: one watch) against given the 1,000 names (a watch each);
3. what keeping the index costs: single enqueues into queues that keep entering and leaving
   the index, and into a busy queue, against the same with the index maintainer switched
   off (alternating rounds, one store);
4. draining: a worker given the pattern against one given the queue names, same messages.

Usage: .venv/bin/python scripts/bench_fairness.py [--idle 10] [--rounds 4] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib

import fdbqueue
from fdbqueue import Queue, Worker
from fdbqueue.ops import workindex
from fdbqueue.ops.txn import run_once

PAYLOAD = b"p" * 200


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def fairness(db: Any) -> list[str]:
    for _ in range(20):
        Queue("f.big").enqueue_many(db, [PAYLOAD] * 500)
    for k in range(50):
        Queue(f"f.s{k:02d}").enqueue_many(db, [PAYLOAD] * 10)
    order: list[str] = []
    t = time.perf_counter()
    done_small: list[float] = []

    def handle(m: fdbqueue.Message) -> None:
        order.append(m.queue)
        if m.queue != "f.big" and sum(1 for q in order if q != "f.big") == 500:
            done_small.append(time.perf_counter() - t)

    stats = Worker(db, "f.*", handle).run(until_empty=True)
    first: dict[str, int] = {}
    for i, name in enumerate(order):
        first.setdefault(name, i)
    small_first = max(v for k, v in first.items() if k != "f.big")
    small_last = max(i for i, name in enumerate(order) if name != "f.big")
    return [
        f"{stats.processed:,}",
        f"{small_first + 1}",
        f"{small_last + 1}",
        f"{done_small[0]:.2f} s" if done_small else "-",
    ]


def idle(db: Any, seconds: float) -> list[list[str]]:
    names = [f"i.q{k:04d}" for k in range(1000)]
    for name in names:
        fdbqueue.create_queue(db, name)
    rows = []
    for label, spec in (("pattern i.*", "i.*"), ("1,000 names", names)):
        worker = Worker(db, spec, lambda m: None, idle_timeout=seconds * 2)
        before = threading.active_count()
        runner = threading.Thread(target=worker.run)
        runner.start()
        time.sleep(1.0)  # settled into its idle wait
        c0 = _cpu()
        time.sleep(seconds)
        cpu = _cpu() - c0
        threads = threading.active_count() - before
        ws = worker.workset
        watches = ws.watches if ws is not None else sum(w.armed for w in worker._watchers)
        worker.stop()
        runner.join()
        rows.append([label, str(threads), str(watches), f"{cpu:.3f} s", f"{100 * cpu / seconds:.2f} %"])
    return rows


def index_cost(db: Any, rounds: int, n: int) -> list[list[str]]:
    mark = workindex.mark
    off = lambda tr, keys, seen=None, conflicts=True: None  # noqa: E731 - the maintainer switched off
    results: dict[tuple[str, bool], float] = {}
    for _ in range(rounds):
        for on in (True, False):
            workindex.mark = mark if on else off  # type: ignore[assignment]
            try:
                # Churning: each enqueue finds its queue out of the index (as after a worker
                # retired it); only the enqueues are timed.
                churn = 0.0
                for i in range(n):
                    q = Queue(f"c.q{i % 50}")
                    run_once(db, lambda tr, _, q=q: tr.clear(workindex.work_keys().entry(q.name)))
                    t = time.perf_counter()
                    q.enqueue(db, PAYLOAD)
                    churn += time.perf_counter() - t
                t = time.perf_counter()
                for _ in range(n):
                    Queue("c.busy").enqueue(db, PAYLOAD)
                busy = time.perf_counter() - t
            finally:
                workindex.mark = mark  # type: ignore[assignment]
            results[("churn", on)] = results.get(("churn", on), 0.0) + churn
            results[("busy", on)] = results.get(("busy", on), 0.0) + busy
    rows = []
    for case, label in (("busy", "a busy queue (entry there)"), ("churn", "entering the index each time")):
        with_index = rounds * n / results[(case, True)]
        without = rounds * n / results[(case, False)]
        rows.append([label, f"{with_index:,.0f}", f"{without:,.0f}", f"{with_index / without:.2f}"])
    return rows


def drain(db: Any) -> list[str]:
    names = [f"d.q{k:02d}" for k in range(20)]
    rates = []
    for spec in ("d.*", names):
        for name in names:
            for _ in range(2):
                Queue(name).enqueue_many(db, [PAYLOAD] * 250)
        t = time.perf_counter()
        stats = Worker(db, spec, lambda m: None).run(until_empty=True)
        rates.append(stats.processed / (time.perf_counter() - t))
    return [f"{rates[0]:,.0f}", f"{rates[1]:,.0f}", f"{rates[0] / rates[1]:.2f}"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=float, default=10.0, help="seconds idle (default 10)")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--n", type=int, default=500, help="enqueues a round (default 500)")
    ap.add_argument("--markdown", action="store_true")
    args = benchlib.parse_args(ap, argv, idle=0.5, rounds=1, n=50)
    print(benchlib.machine(idle=args.idle, rounds=args.rounds, n=args.n, sync="normal"))
    with tempfile.TemporaryDirectory() as tmp:
        db = fdbqueue.open(f"sqlite:///{tmp}/q.db?sync=normal")
        benchlib.show_table(
            "fairness: 1 queue x 10,000 + 50 queues x 10, one worker (lease mode) given the pattern",
            ["messages", "every small queue served by message", "last small message at", "small done after"],
            [fairness(db)],
            markdown=args.markdown,
        )
        benchlib.show_table(
            f"a worker idle on 1,000 queues for {args.idle:.0f} s",
            ["given", "threads", "watches armed", "CPU", "CPU share"],
            idle(db, args.idle),
            markdown=args.markdown,
        )
        benchlib.show_table(
            "what the index costs a single enqueue (msg/s)",
            ["queue", "with the index", "without", "ratio"],
            index_cost(db, args.rounds, args.n),
            markdown=args.markdown,
        )
        benchlib.show_table(
            "draining 20 queues x 500: a worker given the pattern against one given the names (msg/s)",
            ["pattern", "names", "ratio"],
            [drain(db)],
            markdown=args.markdown,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
