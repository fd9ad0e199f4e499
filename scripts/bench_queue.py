#!/usr/bin/env python3
"""Queue throughput and contention benchmark. One run prints everything.

1. The embedded engine against its floor, for sync=full and sync=normal: fdbqueue enqueue
   (``q.enqueue(db, payload)``, one 200-byte message a transaction), exactly-once dequeue
   (``q.dequeue(tr)`` in a ``@fdbqueue.transactional`` function, one a transaction) and
   lease + ack (``q.lease(db)`` then ``q.ack(db, m)``: two transactions), against raw
   sqlite3 (WAL, the same ``synchronous``) inserting one row per commit into a WITHOUT
   ROWID table keyed by a queue index, and selecting the first row then deleting it per
   commit (the floor of both dequeues). Plus the layer's KV work per message (counted by
   wrapping a transaction's methods) and the SQL statements it costs on the embedded engine
   (SQLite's trace callback).
2. Contention on the in-memory FoundationDB-style engine (``memory://``): 1, 2, 4 and 8
   dequeuer threads draining a pre-filled queue, "plain" (the FDB basic recipe:
   ``q.dequeue(tr)`` inside ``run_transaction``, which retries 1020) against "staged"
   (``q.dequeue(db)``, which switches to the staged request set on conflict) and
   "direct" (``fdbqueue.ops.contention.staged_dequeue`` always). Run at 0 ms commit latency
   (in-process: the GIL serialises everything) and at ``--commit-latency-ms`` (each commit
   that writes sleeps that long first, releasing the GIL: clients of a real cluster).

Usage: .venv/bin/python scripts/bench_queue.py [--n 3000] [--seconds 1] [--json] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import sqlite3
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import benchlib

import fdbqueue
import fdbqueue.ops.contention as contention
from fdbqueue.engines.sim.database import SimDatabase, SimTransaction
from fdbqueue.engines.transactional import run_transaction

PAYLOAD_SIZE = 200
# The targets (docs/performance.md): enqueue and exactly-once dequeue within 2x of the raw floor, lease + ack
# (two transactions) within 4x of the raw dequeue.
TARGETS = {"enqueue": 0.5, "dequeue": 0.5, "lease + ack": 0.25}
QUEUE = "bench"
PREFILL_BATCH = 200

# ---------------------------------------------------------------------------------------------
# Output: rich tables, or Markdown with --markdown.

_MARKDOWN = False


def show_table(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    benchlib.show_table(title, headers, [[_fmt(c) for c in row] for row in rows], markdown=_MARKDOWN)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if value >= 100:
            return f"{value:,.0f}"
        if value >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def note(text: str = "") -> None:
    if not _JSON:
        print(text)


_JSON = False

# ---------------------------------------------------------------------------------------------
# The machine.


def machine() -> dict[str, Any]:
    return benchlib.machine(loadavg_at_start=benchlib.loadavg())


filesystem_of = benchlib.filesystem_of


# ---------------------------------------------------------------------------------------------
# 1. The embedded engine against raw sqlite3.


def _payload(i: int) -> bytes:
    return (i.to_bytes(8, "big") + os.urandom(24)) * (PAYLOAD_SIZE // 32) + b"x" * (PAYLOAD_SIZE % 32)


class _Side:
    """One side of an interleaved comparison: a step function, its count and its time."""

    def __init__(self, step: Callable[[int], object]) -> None:
        self.step = step
        self.done = 0
        self.elapsed = 0.0

    def run(self, count: int) -> None:
        step, i = self.step, self.done
        start = time.perf_counter()
        for j in range(i, i + count):
            step(j)
        self.elapsed += time.perf_counter() - start
        self.done += count


def interleave(sides: list[_Side], targets: list[int], seconds: float, rounds: int = 10) -> None:
    """Run the sides alternately in rounds, up to ``targets[i]`` steps or ``seconds`` each.

    Alternating short rounds exposes both sides to the same drift of the machine (a shared
    disk's fsync latency changes by 10x within a minute here), which back-to-back runs do not.
    """
    chunk = [max(1, t // rounds) for t in targets]
    while True:
        active = [i for i, s in enumerate(sides) if s.done < targets[i] and s.elapsed < seconds]
        if not active:
            return
        for i in active:
            sides[i].run(min(chunk[i], targets[i] - sides[i].done))


class _Layer:
    """fdbqueue on the embedded engine: enqueue and @transactional dequeue, one per transaction."""

    def __init__(self, path: str, sync: str, payloads: list[bytes]) -> None:
        self.db = fdbqueue.open(f"sqlite://{path}?sync={sync}")
        self.q = q = fdbqueue.Queue(QUEUE)
        q.enqueue(self.db, b"warm-up")  # creates the queue: not timed
        q.dequeue(self.db)
        self.payloads = payloads

        @fdbqueue.transactional
        def take(tr: Any) -> Any:
            return q.dequeue(tr)

        self.take = take

    def enqueue(self, i: int) -> None:
        self.q.enqueue(self.db, self.payloads[i])

    def dequeue(self, _: int) -> None:
        if self.take(self.db) is None:
            raise AssertionError("the queue ran dry before every message was dequeued")

    def lease_ack(self, _: int) -> None:
        m = self.q.lease(self.db)
        if m is None:
            raise AssertionError("the queue ran dry before every message was leased")
        self.q.ack(self.db, m)

    def refill(self, n: int) -> None:
        for i in range(0, n, PREFILL_BATCH):
            self.q.enqueue_many(self.db, self.payloads[i : min(n, i + PREFILL_BATCH)])

    def close(self) -> None:
        self.db.close()


RAW_SCHEMA = "CREATE TABLE q (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID"
RAW_PREFIX = b"\x02q\x00"  # a subspace prefix, then (index, rand): keyed like the queue


class _Raw:
    """The floor: raw sqlite3, WAL, the same synchronous; one row per commit."""

    def __init__(self, path: str, sync: str, payloads: list[bytes]) -> None:
        self.conn = conn = sqlite3.connect(path, isolation_level=None)
        assert conn.execute("PRAGMA journal_mode=WAL").fetchone()[0] == "wal"
        conn.execute(f"PRAGMA synchronous={sync.upper()}")
        conn.execute(RAW_SCHEMA)
        self.payloads = payloads

    def enqueue(self, i: int) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(
            "INSERT INTO q (k, v) VALUES (?, ?)",
            (RAW_PREFIX + struct.pack(">Q", i) + os.urandom(8), self.payloads[i]),
        )
        conn.execute("COMMIT")

    def dequeue(self, _: int) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        row = conn.execute("SELECT k, v FROM q ORDER BY k LIMIT 1").fetchone()
        if row is None:
            raise AssertionError("raw table ran dry")
        conn.execute("DELETE FROM q WHERE k = ?", (row[0],))
        conn.execute("COMMIT")

    def refill(self, n: int) -> None:
        conn = self.conn
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany(
            "INSERT INTO q (k, v) VALUES (?, ?)",
            ((RAW_PREFIX + struct.pack(">Q", n + i) + os.urandom(8), self.payloads[i]) for i in range(n)),
        )
        conn.execute("COMMIT")

    def close(self) -> None:
        self.conn.close()


def bench_embedded(
    directory: str, sync: str, n: int, seconds: float
) -> dict[str, dict[str, tuple[int, float]]]:
    """Enqueue, dequeue, then lease + ack (against the raw dequeue) on fdbqueue and on raw
    sqlite3, interleaved; (count, seconds) each."""
    payloads = [_payload(i) for i in range(n)]
    layer = _Layer(os.path.join(directory, f"layer-{sync}.db"), sync, payloads)
    raw = _Raw(os.path.join(directory, f"raw-{sync}.db"), sync, payloads)
    try:
        enq = [_Side(layer.enqueue), _Side(raw.enqueue)]
        interleave(enq, [n, n], seconds)
        deq = [_Side(layer.dequeue), _Side(raw.dequeue)]
        interleave(deq, [enq[0].done, enq[1].done], seconds)
        layer.refill(n)  # not timed: both sides hold n messages again
        raw.refill(n)
        lease = [_Side(layer.lease_ack), _Side(raw.dequeue)]
        interleave(lease, [n, n], seconds)
    finally:
        layer.close()
        raw.close()
    return {
        side: {
            op: (pair[i].done, pair[i].elapsed)
            for op, pair in (("enqueue", enq), ("dequeue", deq), ("lease + ack", lease))
        }
        for i, side in enumerate(("fdbqueue", "raw"))
    }


# -- per-message KV work ----------------------------------------------------------------------

_READS = ("get", "get_key", "get_range", "get_range_startswith")
_WRITES = (
    "set",
    "clear",
    "clear_range",
    "add",
    "max",
    "min",
    "byte_max",
    "byte_min",
    "bit_and",
    "bit_or",
    "bit_xor",
    "compare_and_clear",
    "append_if_fits",
    "set_versionstamped_key",
    "set_versionstamped_value",
    "set_journal_entry",
    "watch",
)
_CONFLICTS = (
    "add_read_conflict_range",
    "add_read_conflict_key",
    "add_write_conflict_range",
    "add_write_conflict_key",
)


class _CountingSnapshot:
    def __init__(self, real: Any, counts: dict[str, int]) -> None:
        self._real, self._counts = real, counts

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if name not in _READS:
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._counts[f"snapshot.{name}"] = self._counts.get(f"snapshot.{name}", 0) + 1
            return attr(*args, **kwargs)

        return counted


def _instrument(tr: Any, counts: dict[str, int]) -> Any:
    """Count the calls the layer makes on ``tr`` (a counting proxy of its methods, in place)."""
    depth = [0]
    for name in (*_READS, *_WRITES, *_CONFLICTS, "commit"):
        real = getattr(tr, name)

        def counted(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            if depth[0] == 0:
                counts[_name] = counts.get(_name, 0) + 1
            depth[0] += 1
            try:
                return _real(*args, **kwargs)
            finally:
                depth[0] -= 1

        setattr(tr, name, counted)
    # ``snapshot`` is a property of the engine's transaction (a view made at each use): the
    # transaction's class is swapped for a subclass whose view counts.
    cls = type(tr)
    view = cls.snapshot.fget  # type: ignore[attr-defined]
    tr.__class__ = type(
        f"Counting{cls.__name__}",
        (cls,),
        {"__slots__": (), "snapshot": property(lambda self: _CountingSnapshot(view(self), counts))},
    )
    return tr


def kv_work() -> dict[str, dict[str, Any]]:
    """The KV calls of one enqueue and one dequeue (memory engine: logical, engine-independent),
    and the SQL statements they cost on the embedded engine."""
    out: dict[str, dict[str, Any]] = {}
    q = fdbqueue.Queue(QUEUE)

    @fdbqueue.transactional
    def take(tr: Any) -> Any:
        return q.dequeue(tr)

    ops: list[tuple[str, Callable[[Any], Any]]] = [
        ("enqueue: q.enqueue(db, p)", lambda db: q.enqueue(db, _payload(0))),
        ("dequeue: q.dequeue(tr) in @transactional", take),
        ("dequeue: q.dequeue(db)", lambda db: q.dequeue(db)),
    ]
    mem = fdbqueue.open("memory://")
    for label, op in ops:
        q.enqueue_many(mem, [_payload(1), _payload(2)])
        counts: dict[str, int] = {}
        real_create = mem.create_transaction

        def create(_real: Any = real_create, _counts: dict[str, int] = counts) -> Any:
            return _instrument(_real(), _counts)

        mem.create_transaction = create  # type: ignore[method-assign]
        try:
            op(mem)
        finally:
            del mem.create_transaction
        out[label] = {"kv": counts}
    mem.close()
    # SQL statements on the embedded engine (BEGIN and COMMIT included).
    directory = tempfile.mkdtemp(prefix="fdbqueue-kv-")
    try:
        db = fdbqueue.open(f"sqlite://{os.path.join(directory, 'kv.db')}")
        q.enqueue_many(db, [_payload(i) for i in range(200)])
        statements: list[str] = []
        conn = getattr(db, "_conn", None)
        if conn is not None:
            for label, op in ops:
                reps = 64  # q.dequeue(db) sweeps old receipts about one time in 64
                statements.clear()
                conn.set_trace_callback(statements.append)
                for _ in range(reps):
                    op(db)
                conn.set_trace_callback(None)
                out[label]["sql"] = len(statements) / reps
        db.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return out


def _kv_summary(counts: dict[str, int]) -> tuple[int, int, int, str]:
    reads = sum(v for k, v in counts.items() if k.split(".")[-1] in _READS)
    writes = sum(v for k, v in counts.items() if k in _WRITES)
    conflicts = sum(v for k, v in counts.items() if k in _CONFLICTS)
    detail = ", ".join(f"{v} {k}" for k, v in sorted(counts.items()) if k != "commit")
    return reads, writes, conflicts, detail


# ---------------------------------------------------------------------------------------------
# 2. Contention on the in-memory engine.


class _LatencyTransaction(SimTransaction):
    """A sim transaction whose commits that write first sleep ``latency`` seconds.

    The sleep releases the GIL, so dequeuer threads overlap as the clients of a cluster
    do, and a transaction's conflict window (read version to commit) is that long.
    Read-only commits stay local and instant, as on FoundationDB.
    """

    def __init__(self, db: SimDatabase, latency: float) -> None:
        self._latency = latency
        super().__init__(db)

    def commit(self) -> None:
        if self._wrote():
            time.sleep(self._latency)
        super().commit()

    def _wrote(self) -> bool:
        """Whether this attempt has mutations or write conflict ranges (the sim engine's buffers)."""
        known = False
        for name in ("_writes", "_cb", "_vs_keys", "_wconf"):
            if hasattr(self, name):
                known = True
                if getattr(self, name):
                    return True
        return not known  # the engine's internals changed: count every commit as writing


MODES: dict[str, str] = {
    "plain": "q.dequeue(tr) in run_transaction (FDB basic recipe; retries 1020)",
    "staged": "q.dequeue(db) (plain first, staged request set on conflict)",
    "direct": "fdbqueue.ops.contention.staged_dequeue(db, q.keys) (always staged)",
}


def run_contention(mode: str, dequeuers: int, latency: float, prefill: int, seconds: float) -> dict[str, Any]:
    q = fdbqueue.Queue(QUEUE)
    db = fdbqueue.open("memory://")
    assert isinstance(db, SimDatabase)
    payload = _payload(0)
    for start in range(0, prefill, PREFILL_BATCH):
        q.enqueue_many(db, [payload] * min(PREFILL_BATCH, prefill - start))
    if latency > 0:
        db.create_transaction = lambda: _LatencyTransaction(db, latency)  # type: ignore[method-assign]
    base = (db.stats.commits, db.stats.read_only, db.stats.conflicts, db.stats.too_old)

    staged_calls = [0]
    count_lock = threading.Lock()
    real_staged = contention.staged_dequeue

    def counting_staged(d: Any, queue: Any) -> Any:
        msg = real_staged(d, queue)
        if msg is not None:
            with count_lock:
                staged_calls[0] += 1  # messages that came through the staged request set
        return msg

    if mode == "plain":

        def dequeue_one() -> Any:
            return run_transaction(db, lambda tr: q.dequeue(tr))
    elif mode == "staged":

        def dequeue_one() -> Any:
            return q.dequeue(db)
    else:

        def dequeue_one() -> Any:
            return counting_staged(db, q)

    results: list[list[tuple[str, float, float]]] = [[] for _ in range(dequeuers)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(dequeuers + 1)
    stop_at = [0.0]
    drained = [False]

    def worker(slot: int) -> None:
        got = results[slot]
        barrier.wait()
        try:
            while time.perf_counter() < stop_at[0]:
                t0 = time.perf_counter()
                m = dequeue_one()
                t1 = time.perf_counter()
                if m is None:
                    drained[0] = True
                    return
                got.append((m.id, t1 - t0, t1))
        except BaseException as exc:
            errors.append(exc)

    contention.staged_dequeue = counting_staged  # type: ignore[assignment]
    try:
        threads = [threading.Thread(target=worker, args=(i,), daemon=True) for i in range(dequeuers)]
        for t in threads:
            t.start()
        stop_at[0] = time.perf_counter() + seconds
        start = time.perf_counter()
        barrier.wait()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - start
    finally:
        contention.staged_dequeue = real_staged  # type: ignore[assignment]
    if errors:
        raise errors[0]
    ids = [i for got in results for i, _, _ in got]
    lat = sorted(d for got in results for _, d, _ in got)
    # Throughput over a fixed window: dequeues completed by the deadline over the window
    # (or, when the queue ran dry first, up to the last completion). A dequeuer stuck in a
    # retry backoff past the deadline neither counts nor stretches the window.
    done_at = sorted(t for got in results for _, _, t in got)
    end = done_at[-1] if drained[0] and done_at and done_at[-1] < stop_at[0] else stop_at[0]
    in_window = sum(1 for t in done_at if t <= end)
    window = end - start
    left = q.size(db)
    commits = db.stats.commits - base[0]
    read_only = db.stats.read_only - base[1]
    conflicts = db.stats.conflicts - base[2]
    too_old = db.stats.too_old - base[3]
    db.close()
    n = len(ids)
    per = max(n, 1)
    return {
        "mode": mode,
        "dequeuers": dequeuers,
        "latency_ms": latency * 1000,
        "messages": n,
        "seconds": elapsed,
        "window_seconds": window,
        "rate": in_window / window if window > 0 else 0.0,
        "commits": commits,
        "read_only_commits": read_only,
        "conflicts": conflicts,
        "too_old": too_old,
        "commits_per_msg": commits / per,
        "conflicts_per_msg": conflicts / per,
        # Every 1020 costs a retry (plain) or a fall-back/another fulfilment round (staged).
        "retries_per_msg": (conflicts + too_old) / per,
        "staged_share": (staged_calls[0] / per) if mode != "plain" else 0.0,
        "p50_ms": 1000 * lat[len(lat) // 2] if lat else 0.0,
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else 0.0,
        "max_ms": 1000 * lat[-1] if lat else 0.0,
        "duplicates": n - len(set(ids)),
        "left_in_queue": left,
        "exactly_once": len(set(ids)) == n and left == prefill - n,
    }


# ---------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    global _JSON, _MARKDOWN
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=3000, help="messages per embedded-engine measurement (3000)")
    p.add_argument("--seconds", type=float, default=1.0, help="time cap of each measurement, s (1)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--prefill", type=int, default=5000, help="messages in the contention queue (5000)")
    p.add_argument(
        "--commit-latency-ms",
        type=float,
        default=2.0,
        help="sleep before each writing commit on the sim engine, ms (2; 0 runs only the in-process table)",
    )
    p.add_argument(
        "--repeat", type=int, default=3, help="contention runs per configuration; median shown (3)"
    )
    p.add_argument("--dequeuers", default="1,2,4,8", help="dequeuer thread counts (1,2,4,8)")
    p.add_argument("--modes", default="plain,staged,direct", help="contention modes (plain,staged,direct)")
    p.add_argument("--syncs", default="full,normal", help="sqlite sync settings (full,normal)")
    p.add_argument("--dir", default=None, help="directory for the sqlite files (default: the temp dir)")
    p.add_argument("--skip-embedded", action="store_true")
    p.add_argument("--skip-contention", action="store_true")
    args = benchlib.parse_args(
        p, argv, n=200, seconds=0.2, prefill=200, dequeuers="1,2", modes="plain,staged", syncs="normal"
    )
    _JSON, _MARKDOWN = args.json, args.markdown
    dequeuer_counts = [int(x) for x in args.dequeuers.split(",") if x]
    modes = [m for m in args.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            p.error(f"unknown mode {m!r}; use {', '.join(MODES)}")
    syncs = [s for s in args.syncs.split(",") if s]

    report: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "machine": machine(),
        "settings": {
            "n": args.n,
            "seconds": args.seconds,
            "payload_bytes": PAYLOAD_SIZE,
            "prefill": args.prefill,
            "commit_latency_ms": args.commit_latency_ms,
            "repeat": args.repeat,
        },
    }
    m = report["machine"]
    note(
        f"machine: {m['nproc']} CPU ({m['cpu']}), Python {m['python']}, SQLite {m['sqlite']}, {m['platform']}"
    )
    note(f"load average at start (1, 5, 15 min): {m['loadavg_at_start']} (other load skews figures)")
    note(f"command: {report['command']}")
    wall = time.perf_counter()

    if not args.skip_embedded:
        parent = args.dir or tempfile.gettempdir()
        directory = tempfile.mkdtemp(prefix="fdbqueue-bench-", dir=parent)
        fs = filesystem_of(directory)
        report["settings"]["store_dir"] = f"{directory} ({fs})" if fs else directory
        note(
            f"\n== 1. Embedded engine vs raw sqlite3: {PAYLOAD_SIZE}-byte messages, one per transaction, "
            f"up to {args.n} or {args.seconds:g} s each; files in {report['settings']['store_dir']}"
        )
        if "tmpfs" in fs:
            note("   WARNING: tmpfs: fsync is free there, sync=full figures are not disk figures (use --dir)")
        rows = []
        embedded: dict[str, Any] = {}
        try:
            for sync in syncs:
                both = bench_embedded(directory, sync, args.n, args.seconds)
                layer, raw = both["fdbqueue"], both["raw"]
                for op in ("enqueue", "dequeue", "lease + ack"):
                    ln, ls = layer[op]
                    rn, rs = raw[op]
                    lr, rr = ln / ls, rn / rs
                    embedded[f"{sync}/{op}"] = {
                        "fdbqueue_msgs": ln,
                        "fdbqueue_rate": lr,
                        "raw_msgs": rn,
                        "raw_rate": rr,
                        "ratio": lr / rr,
                        "target": TARGETS[op],
                        "layer_us_per_msg": 1e6 / lr - 1e6 / rr,
                    }
                    against = "select+delete" if op == "lease + ack" else "the same"
                    rows.append(
                        [
                            f"{op} (sync={sync}; raw {against}, synchronous={sync.upper()})",
                            lr,
                            rr,
                            f"{lr / rr:.2f}",
                            f">= {TARGETS[op]}",
                            1e6 / lr,
                            1e6 / rr,
                            f"{ln}/{rn}",
                        ]
                    )
        finally:
            shutil.rmtree(directory, ignore_errors=True)
        report["embedded"] = embedded
        if not _JSON:
            show_table(
                "Embedded engine vs its floor (msgs/s; one message per transaction, single thread)",
                [
                    "operation",
                    "fdbqueue msg/s",
                    "raw sqlite3 msg/s",
                    "ratio",
                    "target",
                    "fdbqueue µs",
                    "raw µs",
                    "msgs (fdbqueue/raw)",
                ],
                rows,
            )
        work = kv_work()
        report["kv_work"] = work
        if not _JSON:
            rows = []
            for label, w in work.items():
                reads, writes, conflicts, detail = _kv_summary(w["kv"])
                rows.append([label, reads, writes, conflicts, w.get("sql", "-"), detail])
            show_table(
                "Layer KV work per message (counted by a proxy of the transaction's methods; "
                "SQL = statements on the embedded engine incl. BEGIN/COMMIT; raw: insert 3, dequeue 4)",
                ["operation", "reads", "writes", "conflict ranges", "SQL stmts", "calls"],
                rows,
            )

    if not args.skip_contention:
        latencies = [0.0] + ([args.commit_latency_ms / 1000] if args.commit_latency_ms > 0 else [])
        runs: list[dict[str, Any]] = []
        for latency in latencies:
            note(
                f"\n== 2. Contention, memory:// (no faults), {args.prefill} messages pre-filled, "
                f"commit latency {latency * 1000:g} ms (writing commits only), up to {args.seconds:g} s a run"
            )
            for mode in modes:
                note(f"   {mode}: {MODES[mode]}")
            samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
            failures: dict[tuple[str, int], str] = {}
            for _ in range(args.repeat):  # round-robin: machine drift hits every configuration alike
                for mode in modes:
                    for k in dequeuer_counts:
                        if (mode, k) in failures:
                            continue
                        try:
                            r = run_contention(mode, k, latency, args.prefill, args.seconds)
                        except Exception as exc:  # report it in the table, carry on with the others
                            failures[(mode, k)] = f"{type(exc).__name__}: {exc}"
                            note(f"   {mode} x{k} failed: {failures[(mode, k)]}")
                            continue
                        samples.setdefault((mode, k), []).append(r)
            rows = []
            for mode in modes:
                rate1 = None
                for k in dequeuer_counts:
                    if (mode, k) in failures:
                        failed = failures[(mode, k)]
                        runs.append(
                            {"mode": mode, "dequeuers": k, "latency_ms": latency * 1000, "error": failed}
                        )
                        rows.append([f"{mode} x{k}", f"ERROR {failed[:80]}", *[""] * 12])
                        continue
                    got = sorted(samples[(mode, k)], key=lambda x: x["rate"])
                    r = dict(got[len(got) // 2])  # the median run by rate
                    r["rates"] = [x["rate"] for x in got]
                    r["exactly_once"] = all(x["exactly_once"] for x in got)
                    runs.append(r)
                    if rate1 is None:
                        rate1 = r["rate"]
                    r["vs_first"] = r["rate"] / rate1 if rate1 else 0.0
                    rows.append(
                        [
                            f"{mode} x{k}",
                            r["rate"],
                            f"{r['rates'][0]:,.0f}-{r['rates'][-1]:,.0f}",
                            f"{r['vs_first']:.2f}",
                            r["messages"],
                            r["commits"],
                            r["conflicts"],
                            r["retries_per_msg"],
                            r["commits_per_msg"],
                            f"{100 * r['staged_share']:.0f}%" if mode != "plain" else "-",
                            r["p50_ms"],
                            r["p99_ms"],
                            r["max_ms"],
                            "ok" if r["exactly_once"] else "FAILED",
                        ]
                    )
            if not _JSON:
                show_table(
                    f"Dequeuers draining one queue, commit latency {latency * 1000:g} ms "
                    f"(median run by msg/s of {args.repeat}; range = slowest-fastest)",
                    [
                        "mode x dequeuers",
                        "msg/s",
                        "range",
                        "vs x1",
                        "msgs",
                        "commits",
                        "1020s",
                        "retries/msg",
                        "commits/msg",
                        "via staged",
                        "p50 ms",
                        "p99 ms",
                        "max ms",
                        "exactly once",
                    ],
                    rows,
                )
                summary = []
                for mode in modes:
                    mine = [
                        r
                        for r in runs
                        if r["mode"] == mode and r["latency_ms"] == latency * 1000 and "error" not in r
                    ]
                    if not mine:
                        continue
                    by_k = {r["dequeuers"]: r["rate"] for r in mine}
                    lo, hi = min(by_k), max(by_k)
                    summary.append(f"{mode} rate(x{hi})/rate(x{lo}) = {by_k[hi] / by_k[lo]:.2f}")
                note("   " + "; ".join(summary))
        report["contention"] = runs
        report["contention_modes"] = MODES

    report["wall_seconds"] = time.perf_counter() - wall
    if _JSON:
        print(json.dumps(report, indent=2, default=str))
    else:
        note(f"\ntotal {report['wall_seconds']:.0f} s")
    bad = [r for r in report.get("contention", []) if "error" in r or not r["exactly_once"]]
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
