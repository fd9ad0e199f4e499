#!/usr/bin/env python3
"""Durable throughput with several producers and consumers: fdbqueue's embedded engine
(``sqlite://...?sync=full``) against huey's ``SqliteStorage`` (WAL, ``synchronous=FULL``, its
default), side by side in one run, 200-byte messages, one commit per message.

What issue 30 asks of the embedded engine where processes share a store (the store lock's lease
between them, group commit letting them share an fsync), and what ``scripts/bench_peers.py``
does not measure with as many producers:

- enqueue: 1 producer; 4 producer threads in one process (one client shared); 4 producer
  processes (a client each);
- 4 processes draining a pre-filled queue: ``q.dequeue(tr)`` in ``@fdbqueue.transactional``
  (huey: its ``dequeue``, SELECT + DELETE); and fdbqueue's ``lease`` + ``ack`` (2 transactions);
- latency at an offered 500 msg/s (an open-loop producer stamping its send time into the
  payload; one consumer process): fdbqueue's ``lease(db, timeout=0.5)`` + ``ack`` (send to ack
  returned), and a blocking ``dequeue(db, timeout=0.5)`` (send to return); p50 and p99 per
  round, and the worst round's p99.

A process that fails (huey's "database is locked" once its 5-second busy timeout runs out)
reports what it did and its error; the table counts the rounds with errors. Each round runs
every row for every system (the systems' order alternates between rounds);
tables give the median over rounds and the ratio of the two medians. Exactly-once is checked
for every drain (each id seen once across the processes).

Usage: .venv/bin/python scripts/bench_contention.py [--n 3000] [--rounds 3] [--rate 500]
       [--seconds 5] [--systems fdbqueue,huey] [--rows e1,e4t,e4p,c_tx,c_lease,l_lease,l_deq]
       [--markdown] [--smoke]
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib
from bench_peers import SENTINEL, client, paced, payload, unpack

WORKERS = 4
ROWS = {
    "e1": "enqueue, 1 producer",
    "e4t": f"enqueue, {WORKERS} producer threads in one process",
    "e4p": f"enqueue, {WORKERS} producer processes",
    "c_tx": f"{WORKERS} processes draining: dequeue(tr) (huey: dequeue)",
    "c_lease": f"{WORKERS} processes draining: lease + ack",
}
LATENCY = {
    "l_lease": "lease(db, timeout) + ack, 1 consumer process",
    "l_deq": "blocking dequeue(db, timeout), 1 consumer process",
}
FDB_ONLY = {"c_lease", "l_lease", "l_deq"}


def spec(system: str, folder: str, tag: str) -> dict[str, Any]:
    # A short name: the store's notify socket lives beside it, and AF_UNIX paths are short.
    path = os.path.join(folder, f"{system[0]}{tag}.db")
    if system == "fdbqueue":
        return {"system": system, "url": f"sqlite://{path}?sync=full", "queue": "bench", "files": [path]}
    return {"system": system, "path": path, "queue": "bench", "sync": "default", "files": [path]}


def drop(folder: str) -> None:
    for name in os.listdir(folder):
        p = os.path.join(folder, name)
        if os.path.isdir(p):
            shutil.rmtree(p, ignore_errors=True)
        else:
            with contextlib.suppress(OSError):
                os.unlink(p)


# -- throughput rows -----------------------------------------------------------------------------


def _worker(sp: dict[str, Any], kind: str, lo: int, hi: int, barrier: Any, out: Any) -> None:
    """In a process of its own: enqueue ids [lo, hi), or drain ("take" / "lease") until empty."""
    c = client(sp)
    seen: list[int] = []
    error = ""
    barrier.wait()
    t0 = time.monotonic()
    try:
        if kind == "enqueue":
            for i in range(lo, hi):
                c.enqueue(payload(i))
                seen.append(i)
        else:
            take = c.take if kind == "take" else c.lease_ack
            while (p := take()) is not None:
                seen.append(unpack(p)[0])
    except Exception as exc:  # e.g. huey's "database is locked" past its busy timeout
        error = f"{type(exc).__name__}: {exc}"
    out.put((t0, time.monotonic(), seen, error))
    c.close()


def run_processes(sp: dict[str, Any], kind: str, n: int) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    barrier, out = ctx.Barrier(WORKERS), ctx.Queue()
    step = -(-n // WORKERS)
    procs = [
        ctx.Process(target=_worker, args=(sp, kind, i * step, min(n, (i + 1) * step), barrier, out))
        for i in range(WORKERS)
    ]
    for p in procs:
        p.start()
    res = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join()
    start, end = min(r[0] for r in res), max(r[1] for r in res)
    seen = [i for r in res for i in r[2]]
    row: dict[str, Any] = {"rate": len(seen) / (end - start), "errors": [r[3] for r in res if r[3]]}
    if kind != "enqueue":
        row["exactly_once"] = sorted(seen) == list(range(n))
    return row


def run_threads(sp: dict[str, Any], n: int) -> dict[str, Any]:
    c = client(sp)
    step = -(-n // WORKERS)
    go = threading.Barrier(WORKERS + 1)

    def body(lo: int, hi: int) -> None:
        go.wait()
        for i in range(lo, hi):
            c.enqueue(payload(i))

    threads = [threading.Thread(target=body, args=(i * step, min(n, (i + 1) * step))) for i in range(WORKERS)]
    for t in threads:
        t.start()
    go.wait()
    t0 = time.monotonic()
    for t in threads:
        t.join()
    rate = n / (time.monotonic() - t0)
    c.close()
    return {"rate": rate}


def run_one(sp: dict[str, Any], n: int) -> dict[str, Any]:
    c = client(sp)
    t0 = time.monotonic()
    for i in range(n):
        c.enqueue(payload(i))
    rate = n / (time.monotonic() - t0)
    c.close()
    return {"rate": rate}


def fill(sp: dict[str, Any], n: int) -> None:
    c = client(sp)
    c.fill([payload(i) for i in range(n)])
    c.close()


# -- latency rows --------------------------------------------------------------------------------


def _consumer(sp: dict[str, Any], kind: str, ready: Any, out: Any, hard: float) -> None:
    c = client(sp)
    q, db = c.q, c.db
    lat: list[float] = []
    error = ""
    ready.set()
    try:
        while time.monotonic() < hard:
            if kind == "l_lease":
                m = q.lease(db, timeout=0.5)
                if m is not None:
                    q.ack(db, m)
            else:
                m = q.dequeue(db, timeout=0.5)
            now = time.monotonic()
            if m is None:
                continue
            seq, stamp = unpack(m.payload)
            if seq == SENTINEL:
                break
            lat.append(now - stamp)
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    out.put((lat, error))
    c.close()


def run_latency(sp: dict[str, Any], kind: str, rate: float, seconds: float) -> dict[str, Any]:
    c = client(sp)
    c.enqueue(payload(SENTINEL - 1))  # the queue exists before the consumer starts
    c.take()
    ctx = mp.get_context("spawn")
    ready, out = ctx.Event(), ctx.Queue()
    proc = ctx.Process(target=_consumer, args=(sp, kind, ready, out, time.monotonic() + seconds + 40))
    proc.start()
    ready.wait(60)
    time.sleep(0.3)  # the consumer reaches its first blocking wait
    sent = 0
    for _ in paced(rate, seconds):
        c.enqueue(payload(sent, time.monotonic()))
        sent += 1
    c.enqueue(payload(SENTINEL))
    got, error = out.get(timeout=120)
    lat = sorted(got)
    proc.join()
    c.close()

    def pct(p: float) -> float:
        return lat[min(len(lat) - 1, int(len(lat) * p / 100))] * 1e3 if lat else float("nan")

    return {"p50_ms": pct(50), "p99_ms": pct(99), "received": len(lat), "sent": sent, "error": error}


# -- a round, the tables -------------------------------------------------------------------------


def run_row(row: str, sp: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    if row == "e1":
        return run_one(sp, args.n)
    if row == "e4t":
        return run_threads(sp, args.n)
    if row == "e4p":
        return run_processes(sp, "enqueue", args.n)
    if row in ("c_tx", "c_lease"):
        fill(sp, args.n)
        return run_processes(sp, "take" if row == "c_tx" else "lease", args.n)
    return run_latency(sp, row, args.rate, args.seconds)


def med(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=3000, help="messages per throughput row")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--rate", type=float, default=500.0, help="offered msg/s of the latency rows")
    ap.add_argument("--seconds", type=float, default=5.0, help="length of a latency row")
    ap.add_argument("--systems", default="fdbqueue,huey")
    ap.add_argument("--rows", default=",".join([*ROWS, *LATENCY]))
    ap.add_argument("--markdown", action="store_true")
    args = benchlib.parse_args(ap, argv, n=200, rounds=1, seconds=0.5)
    systems = args.systems.split(",")
    rows = args.rows.split(",")
    if "huey" in systems and importlib.util.find_spec("huey") is None:
        print("huey is not installed (pip install huey, or the bench extra): fdbqueue only")
        systems.remove("huey")
    print(f"machine: {benchlib.machine(filesystem=benchlib.filesystem_of(tempfile.gettempdir()))}")
    results: dict[tuple[str, str], list[dict[str, Any]]] = {}
    folder = tempfile.mkdtemp(prefix="bc")
    try:
        for r in range(args.rounds):
            order = systems if r % 2 == 0 else systems[::-1]
            for row in rows:
                for system in order:
                    if system != "fdbqueue" and row in FDB_ONLY:
                        continue
                    res = run_row(row, spec(system, folder, f"{r}{rows.index(row)}"), args)
                    drop(folder)
                    results.setdefault((row, system), []).append(res)
                    print(f"round {r + 1} {row:8} {system:9} {res}", file=sys.stderr, flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)

    n_r = args.rounds
    tag = f"sync=full (huey: synchronous=FULL), N={args.n:,}, median of {n_r} round{'s' * (n_r > 1)}"
    table = []
    for row, label in ROWS.items():
        if row not in rows:
            continue
        cells: list[str] = [label]
        meds = {}
        for system in systems:
            rates = [x["rate"] for x in results.get((row, system), [])]
            meds[system] = med(rates)
            once = [x["exactly_once"] for x in results.get((row, system), []) if "exactly_once" in x]
            failed = sum(bool(x.get("errors")) for x in results.get((row, system), []))
            flag = "" if all(once) else " (NOT exactly once)"
            flag += f" ({failed} rounds with errors)" if failed else ""
            cells.append(f"{meds[system]:,.0f}{flag}" if rates else "-")
        peer = meds.get("huey", float("nan"))
        if row == "c_lease":
            peer = med([x["rate"] for x in results.get(("c_tx", "huey"), [])])  # huey's 4-process drain
        ratio = meds.get("fdbqueue", float("nan")) / peer if peer == peer and peer else float("nan")
        cells.append(f"{ratio:.2f}" if ratio == ratio else "-")
        table.append(cells)
    benchlib.show_table(
        f"msg/s, {tag}",
        ["row", *systems, "fdbqueue ÷ huey"],
        table,
        markdown=args.markdown,
    )
    lat_rows = []
    for row, label in LATENCY.items():
        got = results.get((row, "fdbqueue"), [])
        if row not in rows or not got:
            continue
        p50 = [x["p50_ms"] for x in got]
        p99 = [x["p99_ms"] for x in got]
        recv = sum(x["received"] for x in got)
        sent = sum(x["sent"] for x in got)
        errors = sorted({x["error"] for x in got if x.get("error")})
        note = f" ({'; '.join(errors)[:80]})" if errors else ""
        cells = [f"{med(p50):.2f}", f"{med(p99):.2f}", f"{max(p99):.2f}", f"{recv}/{sent}{note}"]
        lat_rows.append([label, *cells])
    if lat_rows:
        benchlib.show_table(
            f"latency at {args.rate:g} msg/s offered for {args.seconds:g} s, ms (fdbqueue, sync=full, "
            f"{n_r} round{'s' * (n_r > 1)})",
            ["row", "p50 (median)", "p99 (median)", "p99 (worst round)", "received/sent"],
            lat_rows,
            markdown=args.markdown,
        )


if __name__ == "__main__":
    main()
