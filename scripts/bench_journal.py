#!/usr/bin/env python3
"""What the journal costs: enqueue, exactly-once dequeue and lease + ack on a journaled queue
against the same on an unjournaled one, in one store, in one run (target: >= 0.85).

Both queues live in one embedded store (sync=full, then sync=normal); the two sides run in
alternating rounds of ``--n`` operations, so that drift in the machine's speed falls on both.
Each operation is its own transaction, as a user's call given the database is.

Usage: .venv/bin/python scripts/bench_journal.py [--n 300] [--rounds 6] [--markdown]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib

import fdbqueue
from fdbqueue import Queue

TARGET = 0.85
PAYLOAD = b"p" * 200


def _enqueue(db: Any, q: Queue, n: int) -> None:
    for _ in range(n):
        q.enqueue(db, PAYLOAD)


def _dequeue(db: Any, q: Queue, n: int) -> None:
    @fdbqueue.transactional
    def one(tr: Any) -> None:
        assert q.dequeue(tr) is not None

    for _ in range(n):
        one(db)


def _lease_ack(db: Any, q: Queue, n: int) -> None:
    for _ in range(n):
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)


def measure(url: str, n: int, rounds: int) -> list[list[str]]:
    db = fdbqueue.open(url)
    plain, journaled = Queue("plain"), Queue("journaled")
    fdbqueue.create_queue(db, "plain")
    fdbqueue.create_queue(db, "journaled", journal=True)
    rows = []
    ops: list[tuple[str, Callable[[Any, Queue, int], None]]] = [
        ("enqueue", _enqueue),
        ("dequeue", _dequeue),
        ("lease + ack", _lease_ack),
    ]
    for name, op in ops:
        spent = {"plain": 0.0, "journaled": 0.0}
        for r in range(rounds):
            order = [plain, journaled] if r % 2 == 0 else [journaled, plain]
            for q in order:
                if op is not _enqueue:  # fill first, outside the clock
                    q.enqueue_many(db, [PAYLOAD] * n)
                t0 = time.perf_counter()
                op(db, q, n)
                spent[q.name] += time.perf_counter() - t0
        a, b = rounds * n / spent["plain"], rounds * n / spent["journaled"]
        ratio = b / a
        mark = "ok" if ratio >= TARGET else "below target"
        rows.append([name, f"{a:,.0f}", f"{b:,.0f}", f"{ratio:.2f}", mark])
    db.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="operations per round (default 300)")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per side (default 6)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = ap.parse_args(argv)
    print(benchlib.machine(n=args.n, rounds=args.rounds))
    with tempfile.TemporaryDirectory() as tmp:
        for sync in ("full", "normal"):
            url = f"sqlite:///{os.path.join(tmp, sync + '.db')}?sync={sync}"
            rows = measure(url, args.n, args.rounds)
            benchlib.show_table(
                f"journal=True against journal=False, embedded engine, sync={sync} (ops/s)",
                ["operation", "journal off", "journal on", "ratio", f"target >= {TARGET}"],
                rows,
                markdown=args.markdown,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
