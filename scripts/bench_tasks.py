"""A no-op task through ``defer`` and the app's worker against a raw ``enqueue`` of the same
arguments and a lease-mode Worker with a no-op handler (target: tasks >= 0.90 of raw), on
fresh embedded stores, alternating which goes first. Both enqueue one message a transaction
and drain with one handler thread; the ratio is of the end-to-end rates (enqueue + drain),
by the wall clock and by the CPU time of this process (all its threads): on a shared machine
the wall clock also measures the neighbours, the CPU time much less so.

    python scripts/bench_tasks.py [--messages 5000] [--runs 3] [--sync normal] [--markdown]
    python scripts/bench_tasks.py --smoke      # a few hundred messages, one run (CI)
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from benchlib import filesystem_of, machine, show_table

import fdbqueue

Rates = tuple[float, float, float]  # enqueues/s, handled/s (wall clock), messages per CPU second


def raw(n: int, sync: str) -> Rates:
    """Raw enqueues and a lease-mode Worker."""
    folder = tempfile.mkdtemp(prefix="bench-tasks-")
    try:
        db = fdbqueue.open(f"sqlite://{folder}/q.db?sync={sync}")
        q = fdbqueue.Queue("raw")
        cpu = time.process_time()
        start = time.perf_counter()
        for i in range(n):
            q.enqueue(db, {"to": "a@b.org", "n": i})
        put = time.perf_counter() - start
        start = time.perf_counter()
        stats = fdbqueue.Worker(db, "raw", lambda m: m.json()).run(until_empty=True)
        drained = time.perf_counter() - start
        assert stats.processed == n, stats
        used = time.process_time() - cpu
        db.close()
        return n / put, n / drained, n / used
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def tasks(n: int, sync: str) -> Rates:
    """A no-op task's defers and the app's worker."""
    folder = tempfile.mkdtemp(prefix="bench-tasks-")
    try:
        db = fdbqueue.open(f"sqlite://{folder}/q.db?sync={sync}")
        app = fdbqueue.Tasks(db)

        @app.task(queue="tasks")
        def noop(to: str, n: int) -> None:
            return None

        cpu = time.process_time()
        start = time.perf_counter()
        for i in range(n):
            noop.defer(db, to="a@b.org", n=i)
        put = time.perf_counter() - start
        start = time.perf_counter()
        stats = app.worker(concurrency=1).run(until_empty=True)
        drained = time.perf_counter() - start
        assert stats.processed == n, stats
        used = time.process_time() - cpu
        db.close()
        return n / put, n / drained, n / used
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sync", choices=("full", "normal"), default="normal")
    ap.add_argument("--smoke", action="store_true", help="300 messages, one run: that it works (CI)")
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    n, runs = (300, 1) if args.smoke else (args.messages, args.runs)
    print(machine(messages=n, sync=args.sync, fs=filesystem_of(tempfile.gettempdir())))
    rows = []
    ratios = []
    cpu_ratios = []
    for run in range(runs):
        order = ("raw", "tasks") if run % 2 == 0 else ("tasks", "raw")
        got = {kind: (raw if kind == "raw" else tasks)(n, args.sync) for kind in order}
        (rp, rd, rc), (tp, td, tc) = got["raw"], got["tasks"]
        r_total = 1 / (1 / rp + 1 / rd)  # messages/s end to end: enqueue then drain
        t_total = 1 / (1 / tp + 1 / td)
        ratios.append(t_total / r_total)
        cpu_ratios.append(tc / rc)
        rows.append(
            [
                str(run + 1),
                f"{rp:,.0f}",
                f"{tp:,.0f}",
                f"{rd:,.0f}",
                f"{td:,.0f}",
                f"{t_total / r_total:.2f}",
                f"{rc:,.0f}",
                f"{tc:,.0f}",
                f"{tc / rc:.2f}",
            ]
        )
    show_table(
        f"no-op task vs raw enqueue + lease-mode Worker, {n} messages (sqlite, sync={args.sync})",
        [
            "run",
            "enqueue/s",
            "defer/s",
            "raw drain/s",
            "task drain/s",
            "wall ratio",
            "raw msg/cpu-s",
            "task msg/cpu-s",
            "cpu ratio",
        ],
        rows,
        markdown=args.markdown,
    )
    ratios.sort()
    cpu_ratios.sort()
    print(
        f"tasks / raw, end to end: median {ratios[len(ratios) // 2]:.2f} by the wall clock, "
        f"{cpu_ratios[len(cpu_ratios) // 2]:.2f} by CPU time (target >= 0.90)"
    )


if __name__ == "__main__":
    main()
