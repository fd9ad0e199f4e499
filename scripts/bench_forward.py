#!/usr/bin/env python3
"""Forwarding rate between two embedded stores (batch 100) against enqueue_many of batches of
100 into the destination, in the same run (target: >= 0.5): the leased forwarder (any source
queue) and the exclusive one (the source queue's only consumer: an outbox, no leases).

Each round runs on two fresh stores, the three in an order alternating with the round; the
medians are printed (the machine's drift falls on every side).

Usage: .venv/bin/python scripts/bench_forward.py [--n 5000] [--rounds 3] [--sync full|normal] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib

import fdbqueue
from fdbqueue import Queue

TARGET = 0.5
PAYLOAD = b"p" * 200


def _round(tmp: str, r: int, n: int, sync: str) -> dict[str, float]:
    """One round on two fresh stores: msg/s of enqueue_many into the destination and of each
    forwarder, in an order that alternates with the round (drift falls on every side)."""
    src = fdbqueue.open(f"sqlite:///{tmp}/src{r}.db?sync={sync}")
    dst = fdbqueue.open(f"sqlite:///{tmp}/dst{r}.db?sync={sync}")
    for name in ("leased", "exclusive"):
        for start in range(0, n, 100):
            Queue(name).enqueue_many(src, [PAYLOAD] * min(100, n - start))
    rates: dict[str, float] = {}
    order = ["direct", "leased", "exclusive"]
    for what in order if r % 2 == 0 else order[::-1]:
        t = time.perf_counter()
        if what == "direct":
            for start in range(0, n, 100):
                Queue("direct").enqueue_many(dst, [PAYLOAD] * min(100, n - start))
            rates[what] = n / (time.perf_counter() - t)
            continue
        stats = fdbqueue.forward(src, what, dst, what, batch=100, exclusive=what == "exclusive")
        rates[what] = stats.forwarded / (time.perf_counter() - t)
        assert stats.forwarded == n
    src.close()
    dst.close()
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="messages (default 5000)")
    ap.add_argument("--sync", choices=("full", "normal"), default="full")
    ap.add_argument("--rounds", type=int, default=3, help="rounds, each on fresh stores; medians (default 3)")
    ap.add_argument("--markdown", action="store_true")
    args = benchlib.parse_args(ap, argv, n=200, rounds=1)
    print(benchlib.machine(n=args.n, sync=args.sync, rounds=args.rounds))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        rounds = [_round(tmp, r, args.n, args.sync) for r in range(args.rounds)]
    for name in ("leased", "exclusive"):
        # The median of the rounds' ratios (each measured side by side) and of the rates.
        ratio = statistics.median(r[name] / r["direct"] for r in rounds)
        forwarded = statistics.median(r[name] for r in rounds)
        direct = statistics.median(r["direct"] for r in rounds)
        met = "ok" if ratio >= TARGET else "below"
        rows.append([name, f"{forwarded:,.0f}", f"{direct:,.0f}", f"{ratio:.2f}", met])
    benchlib.show_table(
        f"forward (batch 100) against enqueue_many(100) into the destination, sync={args.sync} "
        f"(msg/s, medians of {args.rounds} rounds)",
        ["forwarder", "forward", "enqueue_many", "ratio", f"target >= {TARGET}"],
        rows,
        markdown=args.markdown,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
