#!/usr/bin/env python3
"""What issue 14's features cost, each against the same operations without it, in one store
and one run: enqueue, exactly-once dequeue and lease + ack on

1. a journaled queue against an unjournaled one (target: >= 0.85);
2. a queue with an owner and an ACL of 100 principals, used by a granted principal, against a
   queue with no owner (target: >= 0.95);
3. a volatile queue against a durable one (sync=full; no target: what skipping the fsync buys).

Both sides live in one embedded store, twice: in one store the side with the feature is the
queue whose name sorts second, in the other the one that sorts first (a queue's place beside
its neighbour moves its rates by itself: :func:`measure`). They run in alternating rounds of
``--n`` operations in each store, so that drift in the machine's speed falls on both. Each
operation is its own transaction, as a user's call given the database is.

With ``--pages``, instead: the WAL pages (frames) an operation writes on either side of the
first table, in the same sequence of rounds (``sync=normal``: the same frames, not synced), read
from the WAL index operation by operation. At ``sync=full`` they, not the instructions, set the
first table's ratios (issue 30's sixth and seventh passes); unlike its times they do not depend
on the machine's load.

Usage: .venv/bin/python scripts/bench_journal.py [--n 300] [--rounds 6] [--markdown] [--pages]
       [--owned]  (the owner table alone: the owned queue against an open one)
"""

from __future__ import annotations

import argparse
import os
import struct
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


def measure(
    urls: tuple[str, str],
    n: int,
    rounds: int,
    other: dict[str, Any],
    target: float | None,
    principal: str = "anonymous",
) -> list[list[str]]:
    """``other``: the settings (and ``owner``/``grants``) of the second queue.

    The two queues trade places between two stores (``urls``): in the first the queue with
    ``other``'s settings is the name that sorts second, in the second the one that sorts
    first, and each round runs in both. Which of two queues sorts first in one store moves
    its rates by itself, up to 10-15 % at ``sync=normal`` (the two queues' counters and
    heads share leaves, and one queue's neighbour is the other): with two queues of the same
    settings the second name's enqueue ran at 1.09 of the first's and its ``dequeue(tr)`` at
    0.86-0.88 (issue 30's ninth pass). Without the swap, each table measured that as well."""
    sides = []
    # (other names in each store: this process's per-queue caches keep both stores' queues)
    for url, (plain_name, special_name) in zip(urls, (("a1", "a2"), ("b2", "b1")), strict=True):
        db = fdbqueue.open(url, principal=principal)
        fdbqueue.create_queue(db, plain_name)
        wanted = dict(other)
        grants = wanted.pop("grants", 0)
        fdbqueue.create_queue(db, special_name, **wanted)
        admin = fdbqueue.open(url, principal=wanted.get("owner") or "anonymous")
        for i in range(grants):
            fdbqueue.grant(admin, special_name, f"svc-{i:03d}", ["enqueue", "dequeue", "browse"])
        admin.close()
        sides.append((db, Queue(plain_name), Queue(special_name)))
    rows = []
    ops: list[tuple[str, Callable[[Any, Queue, int], None]]] = [
        ("enqueue", _enqueue),
        ("dequeue", _dequeue),
        ("lease + ack", _lease_ack),
    ]
    for name, op in ops:
        spent = {"plain": 0.0, "special": 0.0}
        for r in range(rounds):
            for db, plain, special in sides:
                order = [("plain", plain), ("special", special)]
                if r % 2:
                    order.reverse()
                for role, q in order:
                    if op is not _enqueue:  # fill first, outside the clock
                        q.enqueue_many(db, [PAYLOAD] * n)
                    t0 = time.perf_counter()
                    op(db, q, n)
                    spent[role] += time.perf_counter() - t0
        done = rounds * len(sides) * n
        a, b = done / spent["plain"], done / spent["special"]
        ratio = b / a
        mark = "-" if target is None else ("ok" if ratio >= target else "below target")
        rows.append([name, f"{a:,.0f}", f"{b:,.0f}", f"{ratio:.2f}", mark])
    for db, _, _ in sides:
        db.close()
    return rows


# The WAL index header at the start of ``-shm`` (https://www.sqlite.org/walformat.html, 2.1,
# native byte order): mxFrame at 16, the salts at 32 (they change when the WAL starts again).
_WAL_INDEX = struct.Struct("=16xI12x8s")


def _wal(path: str) -> tuple[int, bytes]:
    with open(path + "-shm", "rb") as f:
        frames, salts = _WAL_INDEX.unpack(f.read(_WAL_INDEX.size))
    return int(frames), bytes(salts)


def pages(path: str, n: int, rounds: int) -> list[list[str]]:
    """WAL frames an operation writes, plain and journaled, in :func:`measure`'s sequence of
    rounds on one embedded store at ``path`` (an operation during which the WAL started
    again is not counted)."""
    db = fdbqueue.open(f"sqlite:///{path}?sync=normal")
    plain, special = Queue("plain"), Queue("special")
    fdbqueue.create_queue(db, "plain")
    fdbqueue.create_queue(db, "special", journal=True)
    rows = []
    for name, op in [("enqueue", _enqueue), ("dequeue", _dequeue), ("lease + ack", _lease_ack)]:
        frames = {"plain": 0, "special": 0}
        counted = {"plain": 0, "special": 0}
        for r in range(rounds):
            for q in [plain, special] if r % 2 == 0 else [special, plain]:
                if op is not _enqueue:
                    q.enqueue_many(db, [PAYLOAD] * n)
                for _ in range(n):
                    before = _wal(path)
                    op(db, q, 1)
                    after = _wal(path)
                    if after[1] == before[1] and after[0] >= before[0]:
                        frames[q.name] += after[0] - before[0]
                        counted[q.name] += 1
        a, b = (frames[k] / max(counted[k], 1) for k in ("plain", "special"))
        rows.append([name, f"{a:.2f}", f"{b:.2f}", f"+{b - a:.2f}"])
    db.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="operations per round (default 300)")
    ap.add_argument("--rounds", type=int, default=6, help="alternating rounds per side (default 6)")
    ap.add_argument("--markdown", action="store_true", help="print Markdown tables")
    ap.add_argument("--pages", action="store_true", help="WAL pages an operation, not times")
    ap.add_argument("--owned", action="store_true", help="the owner table alone (sync=normal)")
    args = benchlib.parse_args(ap, argv, n=30, rounds=2)
    print(benchlib.machine(n=args.n, rounds=args.rounds))
    if args.pages:
        with tempfile.TemporaryDirectory() as tmp:
            rows = pages(os.path.join(tmp, "p.db"), args.n, args.rounds)
        title = "WAL pages an operation, journal=True against journal=False (the first table's sequence)"
        benchlib.show_table(title, ["operation", "without", "with", "added"], rows, markdown=args.markdown)
        return 0
    header = ["operation", "without", "with", "ratio", "target"]
    with tempfile.TemporaryDirectory() as tmp:
        runs: list[tuple[str, str, dict[str, Any], float | None, str]] = []
        for sync in ("full", "normal"):
            runs.append(
                (
                    f"journal=True against journal=False, sync={sync}",
                    sync,
                    {"journal": True},
                    TARGET,
                    "anonymous",
                )
            )
        owned = {"owner": "svc-owner", "grants": 100}
        runs.append(
            (
                "an owner and 100 principals' grants against no owner, sync=normal",
                "normal",
                owned,
                0.95,
                "svc-050",
            )
        )
        runs.append(
            (
                "volatile=True against a durable queue, sync=full",
                "full",
                {"volatile": True},
                None,
                "anonymous",
            )
        )
        if args.owned:  # (the owned queue's run: the one used by a granted principal)
            runs = [run for run in runs if run[4] != "anonymous"]
        for i, (title, sync, other, target, who) in enumerate(runs):
            urls = (
                f"sqlite:///{os.path.join(tmp, f'{i}a.db')}?sync={sync}",
                f"sqlite:///{os.path.join(tmp, f'{i}b.db')}?sync={sync}",
            )
            rows = measure(urls, args.n, args.rounds, dict(other), target, who)
            benchlib.show_table(f"{title} (ops/s)", header, rows, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
