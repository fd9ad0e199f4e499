"""Lease + ack through a Worker with batched settlement, against an ack per message and against
fdbqueue's own exactly-once ``dequeue(tr)`` (a Worker in that mode), on the embedded engine
(``sync=full``), in 1 and 4 processes sharing one store. Target (issue: throughput): batched
lease + ack >= 0.8 of ``dequeue(tr)``.

    python scripts/bench_settle.py [--messages 20000] [--procs 1,4] [--runs 3] [--markdown]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))

from benchlib import filesystem_of, machine, parse_args, show_table

import fdbqueue

KINDS = {
    "lease, batched acks": {"mode": "lease"},
    "lease, an ack each": {"mode": "lease", "settle_linger": 0.0},
    "exactly-once dequeue(tr)": {"mode": "exactly_once"},
}


def _handle_lease(m: fdbqueue.Message) -> None:
    pass


def _handle_tr(tr: fdbqueue.Transaction, m: fdbqueue.Message) -> None:
    pass


def _work(url: str, kind: str, start: float) -> None:
    db = fdbqueue.open(url)
    opts = dict(KINDS[kind])
    handler = _handle_tr if opts["mode"] == "exactly_once" else _handle_lease
    while time.time() < start:
        time.sleep(0.001)
    fdbqueue.Worker(db, "jobs", handler, **opts).run(until_empty=True)  # type: ignore[arg-type]
    db.close()


def drain(n: int, kind: str, procs: int) -> float:
    folder = tempfile.mkdtemp(prefix="bench-settle-")
    try:
        url = f"sqlite://{folder}/q.db?sync=full"
        db = fdbqueue.open(url)
        q = fdbqueue.Queue("jobs")
        for lo in range(0, n, 1000):
            q.enqueue_many(db, [b"x" * 100] * min(1000, n - lo))
        ctx = multiprocessing.get_context("spawn")
        begin = time.time() + 1.5  # every process opened and waiting
        ps = [ctx.Process(target=_work, args=(url, kind, begin)) for _ in range(procs)]
        for p in ps:
            p.start()
        for p in ps:
            p.join()
        secs = time.time() - begin
        st = fdbqueue.queue_stats(db, "jobs")
        assert st.done == n and st.ready == 0, st
        db.close()
        return n / secs
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--procs", default="1,4")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--markdown", action="store_true")
    args = parse_args(ap, None, messages=300, procs="1", runs=1)
    print(machine(messages=args.messages, runs=args.runs, fs=filesystem_of(tempfile.gettempdir())))
    rows = []
    for procs in [int(p) for p in args.procs.split(",")]:
        rates: dict[str, list[float]] = {k: [] for k in KINDS}
        for run in range(args.runs):
            kinds = list(KINDS) if run % 2 == 0 else list(reversed(KINDS))
            for kind in kinds:
                rates[kind].append(drain(args.messages, kind, procs))
        med = {k: statistics.median(v) for k, v in rates.items()}
        base = med["exactly-once dequeue(tr)"]
        for kind in KINDS:
            rows.append(
                [
                    str(procs),
                    kind,
                    f"{med[kind]:,.0f}",
                    f"{med[kind] / base:.2f}",
                    ", ".join(f"{r:,.0f}" for r in rates[kind]),
                ]
            )
    show_table(
        "drain through Workers, no-op handlers: messages/s (median of runs)",
        ["processes", "what", "msg/s", "/ dequeue(tr)", "runs"],
        rows,
        markdown=args.markdown,
    )


if __name__ == "__main__":
    main()
