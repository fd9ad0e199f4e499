#!/usr/bin/env python3
"""Instructions a journaled operation and a forwarded message cost, counted by valgrind's
callgrind as ``scripts/count_instructions.py`` counts them: (I(2n) - I(n)) / n of one process
on ``sqlite://...?sync=normal`` (the fsync is not an instruction), ``PYTHONHASHSEED=0``.

- **journal**: enqueue, ``dequeue(tr)`` and lease + ack on a journaled queue beside the same on
  a plain queue (issue 30: journal on >= 0.85 of off). Both runs of an operation (n and 2n)
  start from the same store: ``enqueue_many`` of 2n + 10 messages, so that the difference is
  the operations' alone (until issue 30's sixth pass each run filled n + 10, and the journaled
  figures carried a journaled ``enqueue_many``'s message, about 100k instructions more than a
  plain one's); then the WAL frames (pages) a commit writes, read from the WAL index;
- **forward**: a message forwarded between two embedded stores (batch 100) by the leased and
  by the exclusive forwarder, beside ``enqueue_many`` of batches of 100 into the destination
  (issue 30: the leased forwarder >= 0.5 of ``enqueue_many``); and the share of a leased
  forward that is the source's lease and ack alone (``lease_many`` of 100, then the next
  ``lease_many`` and ``ack_many`` of the last in one transaction, as the forwarder's removal
  does),
  and the destination's: the same leased forward with the destination's steps (install and
  publication) run in a thread of their own, counted apart (callgrind ``--separate-threads``);
  beside them, a lease-mode Worker's whole message (a no-op handler, prefetch 64) on the same
  stock, counted the same way: each run leases its n messages and none past them.

Usage: .venv/bin/python scripts/count_journal_forward.py [--n 200] [--what journal,forward]
       (needs valgrind: apt install valgrind)
       --smoke: every operation at n=10 and timed in this process instead of counted (so that
       CI runs every path of the script without valgrind; its figures mean nothing)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import fdbqueue
from fdbqueue import Message, Queue
from fdbqueue.runtime.leased import Leased

PAYLOAD = b"x" * 200
JOURNAL_OPS = ("enqueue", "dequeue", "lease_ack")
FORWARDS = ("enqueue_many", "leased", "exclusive", "source", "destination", "worker")


@fdbqueue.transactional
def _take(tr: fdbqueue.Transaction, q: Queue) -> Message | None:
    return q.dequeue(tr)


def _one(kind: str, q: Queue, db: fdbqueue.Database) -> None:
    """One of the journal's operations: an enqueue, a ``dequeue(tr)``, or a lease + ack."""
    if kind == "enqueue":
        q.enqueue(db, PAYLOAD)
    elif kind == "dequeue":
        _take(db, q)
    else:
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)


def _apart(pool: ThreadPoolExecutor, step: Callable[..., Any]) -> Callable[..., Any]:
    """``step`` (a method of the leased forwarder) as a method run in ``pool``'s one thread."""

    def apart(*args: Any) -> Any:
        return pool.submit(step, *args).result()

    return apart


def child(what: str, op: str, n: int, fill: int = 0) -> None:
    """Run ``n`` of ``op`` (valgrind counts the whole process; the parent subtracts) on a
    journal store of ``fill`` messages (at least ``n + 10``)."""
    with tempfile.TemporaryDirectory() as tmp:
        if what == "forward":
            src = fdbqueue.open(f"sqlite:///{tmp}/src.db?sync=normal")
            dst = fdbqueue.open(f"sqlite:///{tmp}/dst.db?sync=normal")
            into = dst if op == "enqueue_many" else src
            for lo in range(0, n, 100):
                Queue("a").enqueue_many(into, [PAYLOAD] * min(100, n - lo))
            if op == "source":  # the source's share of a leased forward: its lease and ack
                q = Queue("a")

                @fdbqueue.transactional
                def settle(tr: fdbqueue.Transaction, done: list[Message]) -> list[Message]:
                    got = q.lease_many(tr, 100, 60)  # the next batch leased, the last acked:
                    q.ack_many(tr, done)  # in the removal's order (runtime/leased.py _remove)
                    return got

                batch = q.lease_many(src, 100, 60)
                while batch:
                    batch = settle(src, batch)
            elif op == "worker":  # a lease-mode Worker's message on the same stock, to compare
                # Prefetch 64, as count_instructions.py's worker64; a stock of exactly n, so
                # that no message is leased past n and released at the end; a settle linger
                # longer than the run, so that each batch's acks commit with the next batch's
                # lease (the Worker's steady state), not when a wall-clock linger (slower under
                # callgrind) runs out, as count_instructions.py's worker64 now counts it
                # (docs/performance.md, "Issue 30, ninth pass: a Worker's message counted
                # honestly").
                def noop(m: Message) -> None:
                    pass

                stats = fdbqueue.Worker(
                    src, "a", noop, mode="lease", prefetch=(64, 64), settle_linger=3600.0
                ).run(max_messages=n)
                assert stats.processed == n and not stats.released, stats
            elif op == "destination":  # the destination's steps in a thread of their own
                steps = {step: getattr(Leased, step) for step in ("_publish", "_install")}
                with ThreadPoolExecutor(1) as pool:
                    pool.submit(int).result()  # (the thread started before the forward)
                    try:
                        for step, inner in steps.items():
                            setattr(Leased, step, _apart(pool, inner))
                        fdbqueue.forward(src, "a", dst, "a", batch=100)
                    finally:
                        for step, inner in steps.items():
                            setattr(Leased, step, inner)
            elif op != "enqueue_many":
                fdbqueue.forward(src, "a", dst, "a", batch=100, exclusive=op == "exclusive")
            return
        kind, _, journaled = op.partition(":")
        db = fdbqueue.open(f"sqlite:///{tmp}/q.db?sync=normal")
        fdbqueue.create_queue(db, "jobs", journal=journaled == "1")
        q = Queue("jobs")
        fill = max(fill, n + 10)
        for lo in range(0, fill, 500):
            q.enqueue_many(db, [PAYLOAD] * min(500, fill - lo))
        for _ in range(3):  # settings cached, pages warm
            q.enqueue(db, PAYLOAD)
            q.dequeue(db)
        for _ in range(n):
            _one(kind, q, db)


# The WAL index header at the start of ``-shm`` (https://www.sqlite.org/walformat.html, 2.1,
# native byte order): mxFrame, the frames the WAL holds, at 16; the salts at 32, which change
# when a checkpoint lets the next writer start the WAL again.
_WAL_INDEX = struct.Struct("=16xI12x8s")


def _wal(path: str) -> tuple[int, bytes]:
    with open(path + "-shm", "rb") as f:
        frames, salts = _WAL_INDEX.unpack(f.read(_WAL_INDEX.size))
    return int(frames), bytes(salts)


def pages(op: str, n: int) -> float:
    """WAL frames (pages written: 4 KiB each, and a 24-byte header) ``op`` appends an operation,
    on the embedded engine after :func:`child`'s fill, counted op by op from the WAL index
    (an operation during which the WAL started again is not counted). Not instructions: at
    ``sync=full`` each is written and made durable by the commit's fsync."""
    kind, _, journaled = op.partition(":")
    with tempfile.TemporaryDirectory() as tmp:
        path = f"{tmp}/q.db"
        db = fdbqueue.open(f"sqlite:///{path}?sync=normal")
        fdbqueue.create_queue(db, "jobs", journal=journaled == "1")
        q = Queue("jobs")
        for lo in range(0, 2 * n + 10, 500):
            q.enqueue_many(db, [PAYLOAD] * min(500, 2 * n + 10 - lo))

        written = counted = 0
        for i in range(n + 3):
            before = _wal(path)
            _one(kind, q, db)
            after = _wal(path)
            if i >= 3 and after[1] == before[1] and after[0] >= before[0]:  # the first 3 warm up
                written += after[0] - before[0]
                counted += 1
        db.close()
    return written / max(counted, 1)


def instructions(what: str, op: str, n: int) -> float:
    counts = []
    for k in (n, 2 * n):
        with tempfile.TemporaryDirectory() as tmp:
            # "destination": every thread counted apart, the main thread's left out
            out_file = ["--separate-threads=yes", f"--callgrind-out-file={tmp}/cg"]
            out = subprocess.run(
                ["valgrind", "--tool=callgrind", *(out_file if op == "destination" else
                 ["--callgrind-out-file=/dev/null"]), sys.executable,
                 os.path.abspath(__file__), "--child", what, op, str(k), str(2 * n + 10)],
                capture_output=True, text=True, check=True, env={**os.environ, "PYTHONHASHSEED": "0"},
            )  # fmt: skip
            if op == "destination":
                counts.append(_threads_but_first(tmp))
                continue
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-500:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / n


def _threads_but_first(folder: str) -> int:
    """The instructions of every thread but the first (``cg-01``) in callgrind's files there."""
    total = 0
    for name in os.listdir(folder):
        if re.fullmatch(r"cg-0*(\d+)", name) and not re.fullmatch(r"cg-0*1", name):
            with open(os.path.join(folder, name)) as f:
                found = re.search(r"^totals: (\d+)", f.read(), re.M)
            total += int(found.group(1)) if found else 0
    return total


def seconds(what: str, op: str, n: int) -> float:
    """(T(2n) - T(n)) / n in µs in this process, as ``instructions`` counts (for ``--smoke``)."""
    times = []
    for k in (n, 2 * n):
        start = time.perf_counter()
        child(what, op, k, 2 * n + 10)
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) * 1e6 / n


def ratio(a: float, b: float) -> str:
    """``a / b`` to two places; "-" where a short noisy run left either at or below 0."""
    return f"{a / b:.2f}" if a > 0 and b > 0 else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=200, help="operations (messages) of the shorter run")
    ap.add_argument("--what", default="journal,forward")
    ap.add_argument("--smoke", action="store_true", help="n=10, timed instead of counted")
    ap.add_argument("--child", nargs=4, metavar=("WHAT", "OP", "N", "FILL"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        child(args.child[0], args.child[1], int(args.child[2]), int(args.child[3]))
        return 0
    measure, n = instructions, args.n
    if args.smoke:
        measure, n = seconds, 10
        print("smoke run: µs in this process, not instructions")
    elif shutil.which("valgrind") is None:
        print("valgrind not found: apt install valgrind", file=sys.stderr)
        return 1
    whats = args.what.split(",")
    if "journal" in whats:
        for op in JOURNAL_OPS:
            plain, journaled = (measure("journal", f"{op}:{j}", n) for j in (0, 1))
            print(f"{op:12} plain {plain:11,.0f}  journaled {journaled:11,.0f}  "
                  f"+{journaled - plain:9,.0f}  ratio {ratio(plain, journaled)}", flush=True)  # fmt: skip
        for op in JOURNAL_OPS:
            plain, journaled = (pages(f"{op}:{j}", n) for j in (0, 1))
            print(f"{op:12} WAL pages an operation: plain {plain:.2f}  journaled {journaled:.2f}  "
                  f"+{journaled - plain:.2f}", flush=True)  # fmt: skip
    if "forward" in whats:
        direct, leased, exclusive, source, destination, worker = (
            measure("forward", op, n) for op in FORWARDS
        )
        # A forward's run also filled the source with enqueue_many: the same cost as ``direct``
        # (not in the destination's thread: its figure is its own).
        leased, exclusive, source, worker = (x - direct for x in (leased, exclusive, source, worker))
        print(f"a message: enqueue_many {direct:,.0f}  leased forwarder {leased:,.0f} "
              f"({ratio(direct, leased)})  exclusive {exclusive:,.0f} "
              f"({ratio(direct, exclusive)})  of the leased, the source's lease_many + ack_many "
              f"{source:,.0f}, the destination's steps {destination:,.0f} "
              f"({ratio(direct, destination)} of enqueue_many); a lease-mode Worker's message "
              f"on the same stock (prefetch 64) {worker:,.0f}")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
