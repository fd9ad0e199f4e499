"""Commits per second of one-key transactions: the embedded engine against raw sqlite3.

Each transaction sets one 8-byte key to a 100-byte value. The floor is sqlite3 doing the
same writes (WAL, the same ``synchronous``, BEGIN IMMEDIATE / INSERT OR REPLACE / COMMIT
on a WITHOUT ROWID table); the ratio fdbqueue/raw is measured in the same run, at
matched durability. The memory engine's rate is printed for reference.

    .venv/bin/python scripts/bench_engine.py [--n 5000] [--repeat 5] [--json]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import benchlib

import fdbqueue
from fdbqueue.engines.contract import Transaction
from fdbqueue.engines.transactional import run_transaction

VALUE = b"v" * 100


def key(i: int) -> bytes:
    return i.to_bytes(8, "big")


def raw_sqlite(path: str, sync: str, n: int) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute(f"PRAGMA synchronous={sync.upper()}")
    conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
    start = time.perf_counter()
    for i in range(n):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)", (key(i), VALUE))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - start
    conn.close()
    return n / elapsed


def engine(url: str, n: int) -> float:
    db = fdbqueue.open(url)
    try:
        start = time.perf_counter()
        for i in range(n):
            k = key(i)

            def body(tr: Transaction, k: bytes = k) -> None:
                tr.set(k, VALUE)

            run_transaction(db, body)
        elapsed = time.perf_counter() - start
    finally:
        db.close()
    return n / elapsed


def fresh(run: Callable[[str], float]) -> float:
    with tempfile.TemporaryDirectory(dir=os.environ.get("BENCH_DIR")) as tmp:
        return run(os.path.join(tmp, "bench.db"))


def compare(sync: str, n: int, repeat: int) -> dict[str, Any]:
    """Raw and fdbqueue runs interleaved, each on a fresh file; medians of rates and of ratios.

    Interleaving keeps a noisy neighbour from favouring one side: each ratio compares
    two runs made back to back.
    """
    raws, ours, ratios = [], [], []
    for i in range(repeat):
        pair = [
            lambda: fresh(functools.partial(raw_sqlite, sync=sync, n=n)),
            lambda: fresh(lambda p: engine(f"sqlite://{p}?sync={sync}", n)),
        ]
        if i % 2:
            r = pair[0]()
            o = pair[1]()
        else:
            o = pair[1]()
            r = pair[0]()
        raws.append(r)
        ours.append(o)
        ratios.append(o / r)
    return {
        "engine": "sqlite",
        "sync": sync,
        "fdbqueue": statistics.median(ours),
        "raw": statistics.median(raws),
        "ratio": statistics.median(ratios),
    }


def machine() -> dict[str, Any]:
    m = benchlib.machine()
    m["cpus"] = m.pop("nproc")
    return m


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--n", type=int, default=5000, help="transactions per run (default 5000)")
    parser.add_argument("--repeat", type=int, default=5, help="runs per figure; the median is kept")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = benchlib.parse_args(parser, argv, n=100, repeat=1)

    rows = [compare(sync, args.n, args.repeat) for sync in ("full", "normal")]
    try:
        memory: float | None = statistics.median(engine("memory://", args.n) for _ in range(args.repeat))
    except Exception as exc:  # the memory engine may be missing from a partial checkout
        print(f"memory engine unavailable: {exc}", file=sys.stderr)
        memory = None
    report = {"machine": machine(), "n": args.n, "repeat": args.repeat, "rows": rows, "memory": memory}

    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    headers = ["sync", "fdbqueue commits/s", "raw sqlite3 commits/s", "ratio"]
    cells = [[str(r["sync"]), f"{r['fdbqueue']:,.0f}", f"{r['raw']:,.0f}", f"{r['ratio']:.2f}"] for r in rows]
    benchlib.show_table(
        f"one-key transactions, n={args.n}, median of {args.repeat}", headers, cells, markdown=False
    )
    print(f"memory engine: {memory:,.0f} commits/s" if memory else "memory engine: n/a")
    m = report["machine"]
    print(f"machine: {m['cpus']} CPUs, {m['cpu']}, Python {m['python']}, SQLite {m['sqlite']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
