#!/usr/bin/env python3
"""What the queue would cost on FoundationDB, measured on the sim engine. One run prints both parts.

1. Per operation (enqueue, dequeue, lease, lease_many(64), ack, staged dequeue, sweep), in
   steady state on ``sim://`` through ``scripts/txncost.py``'s LoggingDatabase (a
   CountingDatabase that also logs keys): transactions, sequential round trips (read
   version + reads + commit; a ``get_many`` is one), read round trips, bytes as
   FoundationDB counts them at commit (mutations + read and write conflict ranges), keys
   read and written, and of those the queue's metadata keys (settings, state, counters:
   the hot keys every operation touches, on one storage team of a cluster).
2. Single-queue throughput of plain dequeue (``q.dequeue(tr)`` in ``run_transaction``:
   FoundationDB's basic recipe, conflicts retried), the public ``q.dequeue(db)`` (switches
   to the staged set under contention) and ``staged_dequeue`` (always staged), at 1, 8 and
   32 dequeuer threads, with FoundationDB's published latencies modelled per round trip:
   a read version 0.3-1 ms, each read 0.1-1 ms, each commit that writes 1.5-2.5 ms (uniform,
   slept by the wrapper, GIL released: clients waiting on a cluster). The sim engine's own
   ``delay`` parameter (uniform 0..delay before a commit is resolved) cannot model read
   latency, so the wrapper does all three and the sim runs with ``delay=0``.

Before/after: run this same file from a checkout of the other revision (it imports
``fdbqueue`` from the checkout it lives in; copy ``scripts/txncost.py`` along)::

    git worktree add --detach /tmp/base main
    cp scripts/bench_fdb_model.py scripts/txncost.py /tmp/base/scripts/
    .venv/bin/python /tmp/base/scripts/bench_fdb_model.py --markdown
    .venv/bin/python scripts/bench_fdb_model.py --markdown

Usage: .venv/bin/python scripts/bench_fdb_model.py [--seconds 2] [--threads 1,8,32] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import benchlib
from txncost import (
    CountingDatabase,
    CountingTransaction,
    KeyTraffic,
    LoggingDatabase,
    TxnCost,
    _CountingReads,
)

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.ops.contention import staged_dequeue

PAYLOAD = b"p" * 200

# FoundationDB's published latencies (seconds): low and high of a uniform draw.
GRV = (0.0003, 0.001)
READ = (0.0001, 0.001)
COMMIT = (0.0015, 0.0025)


# -- part 1: round trips, bytes and keys per operation ------------------------------------------


def _sum(pairs: list[tuple[TxnCost, KeyTraffic]], meta: bytes) -> dict[str, int]:
    done = [(c, t) for c, t in pairs if c.committed or c.error is None]
    return {
        "txns": len(done),
        "attempts": len(pairs),
        "round_trips": sum(c.round_trips for c, _ in done),
        "reads": sum(c.reads for c, _ in done),
        "max_reads": max((c.reads for c, _ in done), default=0),
        "bytes": sum(c.size for c, _ in done),
        "keys_read": sum(len(t.keys_read) for _, t in done),
        "bytes_read": sum(t.bytes_read for _, t in done),
        "keys_written": sum(len(t.keys_written) for _, t in done),
        "meta_read": sum(sum(k.startswith(meta) for k in t.keys_read) for _, t in done),
        "meta_bytes_read": sum(
            sum(n for k, n in zip(t.keys_read, t.sizes_read, strict=True) if k.startswith(meta))
            for _, t in done
        ),
        "meta_written": sum(sum(k.startswith(meta) for k in t.keys_written) for _, t in done),
    }


def per_operation() -> dict[str, dict[str, int]]:
    sim = fdbqueue.open("sim://?seed=1&faults=0")
    db = LoggingDatabase(sim)
    q = Queue("bench")
    meta = q.keys.meta_range()[0]
    for _ in range(4):
        q.enqueue_many(db, [PAYLOAD] * 500)
    q.enqueue(db, PAYLOAD)  # the settings cache (where there is one) is warm from here on
    out: dict[str, dict[str, int]] = {}

    def measure(name: str, op: Callable[[], Any], repeat: int = 5) -> Any:
        op()  # warm
        totals: dict[str, int] = {}
        result = None
        for _ in range(repeat):
            db.take_all()
            result = op()
            for k, v in _sum(db.take_all(), meta).items():
                totals[k] = totals.get(k, 0) + v
        out[name] = {k: round(v / repeat) for k, v in totals.items()}
        return result

    measure("enqueue", lambda: q.enqueue(db, PAYLOAD))
    measure("dequeue", lambda: q.dequeue(db))
    leased = []
    measure("lease", lambda: leased.append(q.lease(db)))
    measure("lease_many(64)", lambda: leased.extend(q.lease_many(db, 64)))
    measure("ack", lambda: q.ack(db, leased.pop()))
    measure("staged dequeue", lambda: staged_dequeue(db, q.keys))

    # sweep: 16 expired leases to move back each time
    def sweep_16() -> Any:
        for m in q.lease_many(db, 16, 0.001):
            assert m is not None
        time.sleep(0.01)
        db.take_all()
        return q.sweep(db)

    def measured_sweep() -> None:
        sweep_16()  # warm
        totals: dict[str, int] = {}
        for _ in range(3):
            for m in q.lease_many(db, 16, 0.001):
                assert m is not None
            time.sleep(0.01)
            db.take_all()
            q.sweep(db)
            for k, v in _sum(db.take_all(), meta).items():
                totals[k] = totals.get(k, 0) + v
        out["sweep (16 expired leases)"] = {k: round(v / 3) for k, v in totals.items()}

    measured_sweep()
    sim.close()
    return out


# -- part 2: throughput with FoundationDB's latencies -------------------------------------------


class _SlowReads(_CountingReads):
    def _read(self, ranges: list[tuple[bytes, bytes]], trips: int = 1) -> None:
        first = not self._owner.cost.grv
        super()._read(ranges, trips)
        time.sleep(
            (random.uniform(*GRV) if first else 0.0) + sum(random.uniform(*READ) for _ in range(trips))
        )


class LatencyTransaction(_SlowReads, CountingTransaction):
    """Sleeps FoundationDB's latency for each read version, read round trip and commit."""

    def __init__(self, db: CountingDatabase, inner: Any) -> None:
        CountingTransaction.__init__(self, db, inner)
        self.snapshot = _SlowReads(self, inner.snapshot, True)

    def get_read_version(self) -> int:
        if not self.cost.grv:
            time.sleep(random.uniform(*GRV))
        return super().get_read_version()

    def commit(self) -> None:
        if self.cost.mutations or self.cost.write_ranges:
            time.sleep(random.uniform(*COMMIT))
        super().commit()


class LatencyDatabase(CountingDatabase):
    def create_transaction(self) -> LatencyTransaction:
        return LatencyTransaction(self, self.inner.create_transaction())


def throughput(mode: str, threads: int, seconds: float) -> dict[str, float]:
    sim = fdbqueue.open("sim://?seed=2&faults=0")
    q = Queue("bench")
    expected = int(seconds * 3000) + 2000  # more than any run drains
    for _ in range(expected // 500 + 1):  # 500 a transaction: within its byte budget
        q.enqueue_many(sim, [PAYLOAD] * 500)
    db = LatencyDatabase(sim)
    ops: dict[str, Callable[[], Any]] = {
        "plain": lambda: run_transaction(db, lambda tr: q.dequeue(tr)),  # type: ignore[arg-type]
        "dequeue": lambda: q.dequeue(db),
        "staged": lambda: staged_dequeue(db, q.keys),
    }
    op = ops[mode]
    stop = threading.Event()
    counts = [0] * threads

    def run(i: int) -> None:
        while not stop.is_set():
            if op() is None:
                return
            counts[i] += 1

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    started = time.monotonic()
    for w in workers:
        w.start()
    time.sleep(seconds)
    stop.set()
    for w in workers:
        w.join()
    elapsed = time.monotonic() - started
    costs = db.take()
    failed = sum(1 for c in costs if c.error is not None)
    sim.close()
    return {"per_s": sum(counts) / elapsed, "taken": sum(counts), "conflicts": failed}


def revision() -> str:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        out = subprocess.run(
            ["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True
        )
        return out.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=2.0, help="each throughput run (default 2)")
    ap.add_argument("--threads", default="1,8,32", help="dequeuer threads (default 1,8,32)")
    ap.add_argument("--modes", default="plain,dequeue,staged")
    ap.add_argument("--skip-throughput", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--markdown", action="store_true")
    args = benchlib.parse_args(ap, None, seconds=0.3, threads="1,2", modes="plain,staged")
    info = benchlib.machine(revision=revision(), loadavg=benchlib.loadavg())
    ops = per_operation()
    runs: dict[str, dict[int, dict[str, float]]] = {}
    if not args.skip_throughput:
        for mode in args.modes.split(","):
            runs[mode] = {}
            for n in (int(x) for x in args.threads.split(",")):
                runs[mode][n] = throughput(mode, n, args.seconds)
    if args.json:
        print(json.dumps({"machine": info, "operations": ops, "throughput": runs}, indent=1))
        return
    print("machine:", json.dumps(info))
    columns = {
        "txns": "txns",
        "round_trips": "round trips",
        "reads": "read RTs",
        "max_reads": "max reads/txn",
        "bytes": "commit bytes",
        "keys_read": "keys read",
        "bytes_read": "bytes read",
        "keys_written": "keys written",
        "meta_read": "meta keys read",
        "meta_bytes_read": "meta bytes read",
        "meta_written": "meta keys written",
    }
    headers = ["operation", *columns.values()]
    cells = [[name, *(str(r[k]) for k in columns)] for name, r in ops.items()]
    benchlib.show_table(
        "per operation, sim engine, steady state (mean of 5)", headers, cells, markdown=args.markdown
    )
    if runs:
        threads = sorted({n for r in runs.values() for n in r})
        cells = []
        for mode, r in runs.items():
            base = r[threads[0]]["per_s"] or 1.0
            cells.append(
                [
                    mode,
                    *(f"{r[n]['per_s']:,.0f} ({r[n]['per_s'] / base:.0%})" for n in threads),
                    str(sum(int(r[n]["conflicts"]) for n in threads)),
                ]
            )
        benchlib.show_table(
            f"dequeues/s on one queue, FoundationDB latencies modelled, {args.seconds:g} s each "
            f"(share of 1 thread)",
            ["mode", *(f"{n} threads" for n in threads), "failed attempts"],
            cells,
            markdown=args.markdown,
        )


if __name__ == "__main__":
    main()
