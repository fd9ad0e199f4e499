#!/usr/bin/env python3
"""Forwarding rate between two embedded stores (batch 100) against enqueue_many of batches of
100 into the destination, in the same run (target: >= 0.5): the leased forwarder (any source
queue) and the exclusive one (the source queue's only consumer: an outbox, no leases).

Usage: .venv/bin/python scripts/bench_forward.py [--n 5000] [--sync full|normal] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib

import fdbqueue
from fdbqueue import Queue

TARGET = 0.5
PAYLOAD = b"p" * 200


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=5000, help="messages (default 5000)")
    ap.add_argument("--sync", choices=("full", "normal"), default="full")
    ap.add_argument("--markdown", action="store_true")
    args = benchlib.parse_args(ap, argv, n=200)
    print(benchlib.machine(n=args.n, sync=args.sync))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        src = fdbqueue.open(f"sqlite:///{tmp}/src.db?sync={args.sync}")
        dst = fdbqueue.open(f"sqlite:///{tmp}/dst.db?sync={args.sync}")
        for name in ("leased", "exclusive"):
            for start in range(0, args.n, 100):
                Queue(name).enqueue_many(src, [PAYLOAD] * min(100, args.n - start))
        t = time.perf_counter()
        for start in range(0, args.n, 100):
            Queue("direct").enqueue_many(dst, [PAYLOAD] * min(100, args.n - start))
        direct = args.n / (time.perf_counter() - t)
        for name in ("leased", "exclusive"):
            t = time.perf_counter()
            stats = fdbqueue.forward(src, name, dst, name, batch=100, exclusive=name == "exclusive")
            forwarded = stats.forwarded / (time.perf_counter() - t)
            assert stats.forwarded == args.n
            ratio = forwarded / direct
            met = "ok" if ratio >= TARGET else "below"
            rows.append([name, f"{forwarded:,.0f}", f"{direct:,.0f}", f"{ratio:.2f}", met])
    benchlib.show_table(
        f"forward (batch 100) against enqueue_many(100) into the destination, sync={args.sync} (msg/s)",
        ["forwarder", "forward", "enqueue_many", "ratio", f"target >= {TARGET}"],
        rows,
        markdown=args.markdown,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
