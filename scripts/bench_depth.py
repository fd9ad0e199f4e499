#!/usr/bin/env python3
"""Depth scaling benchmark: does a deep queue cost more per message? One run prints it all.

On the embedded engine (``sqlite://...?sync=normal`` by default; ``--sync full``):

1. **Fill.** One store per measured depth (0, 10^5 and 10^6 messages by default, capped by
   ``--max-depth``), filled with ``q.enqueue_many(db, batch)`` in transactions of ``--batch``
   (500) 200-byte messages; the fill of the deepest store is timed per tenth, so the fill rate
   itself shows whether inserting slows down as the queue grows.
2. **Rates around each depth.** Three operations, one message per transaction, single thread:
   enqueue (``q.enqueue(db, payload)``), exactly-once dequeue (``q.dequeue(tr)`` inside an
   ``@fdbqueue.transactional`` function) and lease+ack (``m = q.lease(db); q.ack(db, m)``: two
   transactions per message). They run in cycles of blocks (enqueue, dequeue, enqueue,
   lease+ack; ``--block`` messages each), so the depth stays within a block of its target,
   and every block runs on each store in turn (the order rotating), so a noisy neighbour
   hurts every depth of a round alike. Each round runs ``--ops`` messages per operation per
   store; ratio = rate(depth) / rate(0) of the same round, and the figure shown is the median
   over ``--repeat`` rounds (range = min-max). Also per message: p50/p99 latency and the
   process CPU time (``time.process_time``), which the other jobs on a shared machine
   disturb far less than the wall-clock rate.
3. **What one transaction writes** at each depth: WAL frames (= dirty 4 KiB pages) per
   message of each operation, and the cost of checkpointing them (after a TRUNCATE
   checkpoint the operation runs until ``--probe-frames`` frames are in the log, then one
   ``PRAGMA wal_checkpoint(PASSIVE)`` is timed), plus the kv B-tree's height (dbstat), the
   file size and the free-list length.
4. **Worker memory while draining the deepest store.** A child process runs
   ``fdbqueue.Worker(db, q, handler, mode=...)`` (``lease``, then ``exactly_once``; trivial
   handlers) for ``--rss-seconds``, and samples its own VmRSS (/proc/self/status) and the
   messages processed every ``--rss-interval`` s. Reported: RSS at start (store open, worker
   not started), after ``--rss-warmup`` s, peak, end, the kernel's high-water mark (VmHWM),
   the slope after warm-up, and "flat" when the peak after warm-up is within 10 % or 20 MB
   of the value after warm-up.

``--engine memory`` measures section 2 on ``memory://`` instead (the sim engine; no files,
no WAL probe, no worker child). Nothing in ``fdbqueue/`` is changed or monkey-patched; the
probes of section 3 use a separate ``sqlite3`` connection on the store file.

Usage: .venv/bin/python scripts/bench_depth.py [--sync normal|full] [--max-depth 1000000]
       [--ops 3000] [--repeat 5] [--rss-seconds 60] [--json] [--save FILE] [--markdown]
       [--dir DIR] [--keep] [--engine sqlite|memory] [--skip-rss]

A default run takes about 4 minutes on 2 vCPUs (the 10^6 fill about 45 s) and needs about
500 MB of disk in the temp dir (``--dir`` to choose another).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shlex
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import benchlib  # noqa: E402

import fdbqueue  # noqa: E402

PAYLOAD_SIZE = 200
QUEUE = "bench"
DEFAULT_DEPTHS = (0, 100_000, 1_000_000)
OPS = ("enqueue", "dequeue", "lease+ack")

# ---------------------------------------------------------------------------------------------
# Output: rich tables, or Markdown with --markdown.

_JSON = False
_MARKDOWN = False


def note(text: str = "") -> None:
    if not _JSON:
        print(text, flush=True)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.2f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def show_table(title: str, headers: list[str], rows: list[list[Any]]) -> None:
    if not _JSON:
        benchlib.show_table(title, headers, [[_fmt(c) for c in row] for row in rows], markdown=_MARKDOWN)


# ---------------------------------------------------------------------------------------------
# The machine and the code measured.


def machine() -> dict[str, Any]:
    mem = None
    try:
        with open("/proc/meminfo") as f:
            mem = int(f.readline().split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        pass
    return benchlib.machine(memory_mb=mem)


loadavg = benchlib.loadavg
filesystem_of = benchlib.filesystem_of


def code_version() -> dict[str, str]:
    """The commit, and a digest of fdbqueue/*.py as measured (others edit it meanwhile)."""
    out: dict[str, str] = {}
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out["git"] = subprocess.run(
            ["git", "-C", ROOT, "describe", "--always", "--dirty"], capture_output=True, text=True, timeout=10
        ).stdout.strip()
    digest = hashlib.sha256()
    pkg = os.path.join(ROOT, "fdbqueue")
    for dirpath, _dirs, files in sorted(os.walk(pkg)):
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(dirpath, name), "rb") as f:
                    digest.update(name.encode() + f.read())
    out["fdbqueue_sha256"] = digest.hexdigest()[:12]
    return out


# ---------------------------------------------------------------------------------------------
# Stores.


def payloads(n: int = 1000) -> list[bytes]:
    """Distinct 200-byte payloads (random bytes: nothing compresses or repeats)."""
    return [os.urandom(PAYLOAD_SIZE) for _ in range(n)]


class Store:
    """One store (a file, or memory://) holding a queue kept around ``depth`` messages."""

    def __init__(self, depth: int, url: str, path: str | None) -> None:
        self.depth = depth
        self.url = url
        self.path = path
        self.db = fdbqueue.open(url)
        self.q = q = fdbqueue.Queue(QUEUE)
        self.pool = payloads()
        self.i = 0
        fdbqueue.create_queue(self.db, QUEUE)

        @fdbqueue.transactional
        def take(tr: Any) -> Any:
            return q.dequeue(tr)

        self._take = take

    def payload(self) -> bytes:
        self.i += 1
        return self.pool[self.i % len(self.pool)]

    # -- the three measured operations, one message each -----------------------------------
    def enqueue(self) -> None:
        self.q.enqueue(self.db, self.payload())

    def dequeue(self) -> None:
        if self._take(self.db) is None:
            raise AssertionError(f"depth {self.depth}: the queue ran dry")

    def lease_ack(self) -> None:
        m = self.q.lease(self.db)
        if m is None:
            raise AssertionError(f"depth {self.depth}: nothing to lease")
        self.q.ack(self.db, m)

    def op(self, name: str) -> Callable[[], None]:
        return {"enqueue": self.enqueue, "dequeue": self.dequeue, "lease+ack": self.lease_ack}[name]

    def size(self) -> int:
        return self.q.size(self.db)

    def fill(self, target: int, batch: int, segments: int = 1) -> dict[str, Any]:
        """Enqueue ``target - size`` messages in ``enqueue_many`` transactions of ``batch``."""
        start_depth = self.size()
        todo = max(0, target - start_depth)
        marks = [start_depth + todo * (k + 1) // segments for k in range(segments)]
        segs: list[dict[str, Any]] = []
        done = 0
        t0 = seg_t = time.perf_counter()
        seg_from = start_depth
        for mark in marks:
            while start_depth + done < mark:
                n = min(batch, mark - start_depth - done)
                self.q.enqueue_many(self.db, [self.payload() for _ in range(n)])
                done += n
            now = time.perf_counter()
            if mark > seg_from:
                segs.append(
                    {
                        "from": seg_from,
                        "to": mark,
                        "seconds": now - seg_t,
                        "rate": (mark - seg_from) / (now - seg_t),
                    }
                )
            seg_from, seg_t = mark, now
        secs = time.perf_counter() - t0
        return {
            "depth": self.depth,
            "messages": done,
            "seconds": secs,
            "rate": done / secs if secs > 0 else 0.0,
            "segments": segs,
        }

    def close(self) -> None:
        self.db.close()


# ---------------------------------------------------------------------------------------------
# Rates around a depth.


def run_block(fn: Callable[[], None], n: int, lat: list[float]) -> tuple[float, float]:
    """Run ``fn`` ``n`` times; (wall seconds, CPU seconds of this process), latencies appended."""
    clock = time.perf_counter
    cpu0 = time.process_time()
    start = prev = clock()
    for _ in range(n):
        fn()
        now = clock()
        lat.append(now - prev)
        prev = now
    return prev - start, time.process_time() - cpu0


def measure_round(stores: list[Store], ops: int, block: int, turn: int = 0) -> dict[int, dict[str, Any]]:
    """``ops`` messages of each operation on every store, interleaved block by block.

    Blocks cycle enqueue, dequeue, enqueue, lease+ack, so each store's depth moves by at most
    ``block``. Every block runs on each store in turn (the order rotating), so the stores of
    a round see the same machine within a fraction of a second: a neighbour's burst of load
    hits every depth alike instead of whichever happened to be running.
    """
    acc: dict[int, dict[str, dict[str, Any]]] = {
        st.depth: {op: {"n": 0, "wall": 0.0, "cpu": 0.0, "lat": []} for op in OPS} for st in stores
    }
    fns = {st.depth: {op: st.op(op) for op in OPS} for st in stores}
    done = 0
    while done < ops:
        for op in ("enqueue", "dequeue", "enqueue", "lease+ack"):
            order = stores[turn % len(stores) :] + stores[: turn % len(stores)]
            turn += 1
            for st in order:
                a = acc[st.depth][op]
                wall, cpu = run_block(fns[st.depth][op], block, a["lat"])
                a["n"] += block
                a["wall"] += wall
                a["cpu"] += cpu
        done += block
    out: dict[int, dict[str, Any]] = {}
    for d, per_op in acc.items():
        out[d] = {}
        for op, a in per_op.items():
            xs = sorted(a["lat"])
            out[d][op] = {
                "messages": a["n"],
                "seconds": a["wall"],
                "rate": a["n"] / a["wall"],
                "cpu_us": 1e6 * a["cpu"] / a["n"],
                "p50_us": 1e6 * xs[len(xs) // 2],
                "p99_us": 1e6 * xs[min(len(xs) - 1, int(len(xs) * 0.99))],
                "max_us": 1e6 * xs[-1],
            }
    return out


# ---------------------------------------------------------------------------------------------
# What a transaction writes, and the shape of the B-tree (embedded engine only).


def btree_info(path: str) -> dict[str, Any]:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        (leaf,) = conn.execute(
            "SELECT path FROM dbstat WHERE name = 'kv' AND pagetype = 'leaf' LIMIT 1"
        ).fetchone() or ("",)
        pages = conn.execute("PRAGMA page_count").fetchone()[0]
        free = conn.execute("PRAGMA freelist_count").fetchone()[0]
        size = conn.execute("PRAGMA page_size").fetchone()[0]
    except sqlite3.Error as exc:
        return {"error": str(exc)}
    finally:
        conn.close()
    wal = path + "-wal"
    return {
        # '/' is the root; a leaf at '/000/001/' sits two levels below it: height 3.
        "btree_height": leaf.count("/") if leaf else None,
        "pages": pages,
        "freelist_pages": free,
        "file_mb": pages * size / 2**20,
        "wal_mb": os.path.getsize(wal) / 2**20 if os.path.exists(wal) else 0.0,
    }


def _wal_frames(path: str) -> int:
    try:
        size = os.path.getsize(path + "-wal")
    except OSError:
        return 0
    return max(0, (size - 32) // (4096 + 24))  # WAL header, then (frame header + page) each


def wal_probe(st: Store, frames: int, sync: str) -> dict[str, dict[str, float | None]]:
    """Per operation: WAL frames (dirty 4 KiB pages) written per message, and what the
    checkpoint of those frames then costs per message.

    After a TRUNCATE checkpoint, the operation runs until the log holds ``frames`` frames
    (SQLite checkpoints on its own at 1000), then one PASSIVE checkpoint is timed: the
    cadence of the automatic checkpoints, whose cost the measured rates include. lease+ack
    is two transactions: its figures are per message. The depth is restored after each
    operation. Only a separate sqlite3 connection on the file is used.
    """
    assert st.path is not None
    path = st.path
    out: dict[str, dict[str, float | None]] = {}
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"PRAGMA synchronous={sync.upper()}")  # the checkpoint syncs as the store's own do
        for op in ("enqueue", "dequeue", "lease+ack"):
            if op != "enqueue":
                for _ in range(frames):
                    st.enqueue()  # enough to take (an empty queue has nothing to take)
            busy, _log, _ckpt = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
            fn = st.op(op)
            n = 0
            while n < frames and _wal_frames(path) < frames:
                fn()
                n += 1
            t0 = time.perf_counter()
            busy2, log, ckpt = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            secs = time.perf_counter() - t0
            ok = not busy and not busy2 and 0 < log < 1000 and ckpt == log
            out[op] = {
                "messages": n,
                "frames": log / n if ok else None,
                "checkpoint_us": 1e6 * secs / n if ok else None,
            }
            if op == "enqueue":
                for _ in range(n):
                    st.dequeue()  # back to the depth it had
            else:
                for _ in range(n, frames):
                    st.dequeue()
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()
    return out


# ---------------------------------------------------------------------------------------------
# Worker memory (child process).


def _status(field: str) -> int:
    """A /proc/self/status field in kB (VmRSS, VmHWM)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return -1


def child_main(mode: str, url: str, seconds: float, interval: float) -> int:
    """Run a Worker on the deep store for ``seconds``, printing one JSON line per sample."""
    db = fdbqueue.open(url)
    q = fdbqueue.Queue(QUEUE)
    sink = [0]

    def lease_handler(m: Any) -> None:
        sink[0] += len(m.payload)

    def in_transaction_handler(tr: Any, m: Any) -> None:
        sink[0] += len(m.payload)  # no writes of its own: the dequeue alone commits

    handler: Callable[..., None] = lease_handler if mode == "lease" else in_transaction_handler

    worker = fdbqueue.Worker(db, q, handler, mode=mode)
    t0 = time.monotonic()

    def emit(kind: str, **more: Any) -> None:
        rec = {"kind": kind, "t": time.monotonic() - t0, "rss_kb": _status("VmRSS"), **more}
        print(json.dumps(rec), flush=True)

    emit("start", processed=0, depth=q.size(db))
    stop_at = t0 + seconds

    def sample() -> None:
        nxt = t0
        while True:
            nxt += interval
            delay = nxt - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            emit("sample", processed=worker.stats.processed)
            if time.monotonic() >= stop_at:
                worker.stop()
                return

    threading.Thread(target=sample, daemon=True).start()
    stats = worker.run()
    emit(
        "end",
        processed=stats.processed,
        failed=stats.failed,
        released=stats.released,
        hwm_kb=_status("VmHWM"),
        depth=q.size(db),
    )
    db.close()
    return 0


def run_worker_child(mode: str, url: str, seconds: float, interval: float, warmup: float) -> dict[str, Any]:
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        mode,
        "--child-url",
        url,
        "--rss-seconds",
        str(seconds),
        "--rss-interval",
        str(interval),
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 300)
    lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines or lines[-1]["kind"] != "end":
        raise RuntimeError(f"worker child ({mode}) failed: rc={proc.returncode}\n{proc.stderr[-2000:]}")
    start, end = lines[0], lines[-1]
    samples = [x for x in lines if x["kind"] == "sample"]
    after = [x for x in samples if x["t"] >= warmup] or samples[-1:]
    warm = after[0]
    peak = max(x["rss_kb"] for x in samples)
    peak_after = max(x["rss_kb"] for x in after)
    growth_kb = peak_after - warm["rss_kb"]
    # Least-squares slope of RSS after warm-up, MB per minute.
    slope = 0.0
    if len(after) >= 3:
        ts = [x["t"] for x in after]
        rs = [x["rss_kb"] / 1024 for x in after]
        mt, mr = statistics.fmean(ts), statistics.fmean(rs)
        den = sum((t - mt) ** 2 for t in ts)
        slope = 60 * sum((t - mt) * (r - mr) for t, r in zip(ts, rs, strict=False)) / den if den else 0.0
    span = end["t"] - (samples[0]["t"] if samples else 0)
    half = len(samples) // 2
    rate_first = rate_second = None
    if half >= 2:
        a, b, c = samples[0], samples[half], samples[-1]
        rate_first = (b["processed"] - a["processed"]) / (b["t"] - a["t"])
        rate_second = (c["processed"] - b["processed"]) / (c["t"] - b["t"])
    return {
        "mode": mode,
        "seconds": seconds,
        "samples": len(samples),
        "depth_before": start["depth"],
        "depth_after": end["depth"],
        "processed": end["processed"],
        "rate": end["processed"] / span if span > 0 else 0.0,
        "rate_first_half": rate_first,
        "rate_second_half": rate_second,
        "rss_start_mb": start["rss_kb"] / 1024,
        "rss_warm_mb": warm["rss_kb"] / 1024,
        "warm_at_s": warm["t"],
        "rss_peak_mb": peak / 1024,
        "rss_end_mb": samples[-1]["rss_kb"] / 1024 if samples else end["rss_kb"] / 1024,
        "vm_hwm_mb": end["hwm_kb"] / 1024,
        "growth_after_warmup_mb": growth_kb / 1024,
        "growth_after_warmup_pct": 100 * growth_kb / warm["rss_kb"],
        "slope_mb_per_min": slope,
        "flat": growth_kb <= max(0.10 * warm["rss_kb"], 20 * 1024),
        "series": [(round(x["t"], 2), x["rss_kb"], x["processed"]) for x in samples],
    }


# ---------------------------------------------------------------------------------------------


def plan_depths(args: argparse.Namespace) -> list[int]:
    if args.depths:
        depths = sorted({int(float(x)) for x in args.depths.split(",") if x})
    else:
        depths = sorted({d for d in DEFAULT_DEPTHS if d <= args.max_depth} | {args.max_depth})
    if depths[0] != 0:
        depths.insert(0, 0)
    return depths


def main(argv: list[str] | None = None) -> int:
    global _JSON, _MARKDOWN
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--sync", choices=("normal", "full"), default="normal", help="embedded engine durability (normal)"
    )
    p.add_argument(
        "--engine",
        choices=("sqlite", "memory"),
        default="sqlite",
        help="sqlite (the embedded engine, default) or memory (the sim engine; rates only)",
    )
    p.add_argument("--max-depth", type=int, default=1_000_000, help="deepest queue measured (1000000)")
    p.add_argument(
        "--depths", default=None, help="explicit depths, e.g. 0,1e5,1e6 (overrides the default set)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=500,
        help="messages per enqueue_many transaction in the fill (500: within a transaction's byte budget)",
    )
    p.add_argument(
        "--ops", type=int, default=3000, help="messages per operation per round at each depth (3000)"
    )
    p.add_argument(
        "--block", type=int, default=100, help="messages per block; the depth moves by at most this (100)"
    )
    p.add_argument("--repeat", type=int, default=5, help="rounds over every depth; medians shown (5)")
    p.add_argument(
        "--warmup-ops", type=int, default=300, help="untimed messages per operation before round 1 (300)"
    )
    p.add_argument(
        "--probe-frames",
        type=int,
        default=800,
        help="WAL frames each operation writes in the WAL probe (800)",
    )
    p.add_argument("--rss-seconds", type=float, default=60.0, help="each worker child runs this long, s (60)")
    p.add_argument("--rss-interval", type=float, default=0.5, help="RSS sampling period, s (0.5)")
    p.add_argument(
        "--rss-warmup", type=float, default=10.0, help="RSS baseline taken this long after start, s (10)"
    )
    p.add_argument(
        "--rss-modes", default="lease,exactly_once", help="worker modes to run (lease,exactly_once)"
    )
    p.add_argument("--skip-rss", action="store_true", help="no worker children")
    p.add_argument("--dir", default=None, help="directory for the store files (default: the temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the store files (their directory is printed)")
    p.add_argument("--json", action="store_true", help="print one JSON document instead of tables")
    p.add_argument("--markdown", action="store_true", help="print the tables as Markdown")
    p.add_argument("--save", default=None, metavar="FILE", help="also write the JSON document to FILE")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--child-url", default=None, help=argparse.SUPPRESS)
    args = benchlib.parse_args(
        p, argv, depths="0,1000", ops=100, block=50, repeat=1, warmup_ops=20, skip_rss=True
    )
    if args.child:
        return child_main(args.child, args.child_url, args.rss_seconds, args.rss_interval)
    _JSON, _MARKDOWN = args.json, args.markdown
    if args.ops < args.block or args.block < 1:
        p.error("--ops must be >= --block >= 1")
    depths = plan_depths(args)
    sqlite_engine = args.engine == "sqlite"

    report: dict[str, Any] = {
        "command": " ".join(shlex.quote(a) for a in [sys.executable, *sys.argv]),
        "machine": machine(),
        "code": code_version(),
        "loadavg_at_start": loadavg(),
        "settings": {
            "engine": args.engine,
            "sync": args.sync if sqlite_engine else None,
            "depths": depths,
            "payload_bytes": PAYLOAD_SIZE,
            "fill_batch": args.batch,
            "ops": args.ops,
            "block": args.block,
            "repeat": args.repeat,
            "rss_seconds": args.rss_seconds,
            "rss_interval": args.rss_interval,
            "rss_warmup": args.rss_warmup,
        },
    }
    m = report["machine"]
    note(
        f"machine: {m['nproc']} CPU ({m['cpu']}), {m['memory_mb']} MB RAM, Python {m['python']}, "
        f"SQLite {m['sqlite']}, {m['platform']}"
    )
    note(f"code: {report['code']}; load average at start: {report['loadavg_at_start']}")
    note(f"command: {report['command']}")
    wall = time.perf_counter()

    directory = None
    if sqlite_engine:
        parent = args.dir or tempfile.gettempdir()
        directory = tempfile.mkdtemp(prefix="fdbqueue-depth-", dir=parent)
        fs = filesystem_of(directory)
        report["settings"]["store_dir"] = f"{directory} ({fs})" if fs else directory
        label = f"embedded engine, sync={args.sync}"
        engine_text = (
            f"embedded engine, sqlite://...?sync={args.sync}, files in {report['settings']['store_dir']}"
        )
        if "tmpfs" in fs:
            note("WARNING: tmpfs: no disk under these figures (use --dir)")
    else:
        label = "memory://, the sim engine"
        engine_text = "memory:// (the sim engine, no faults)"
    note(f"engine: {engine_text}")

    stores: dict[int, Store] = {}
    try:
        # 1. Fill ----------------------------------------------------------------------------
        note(
            f"\n== 1. Fill: depths {', '.join(f'{d:,}' for d in depths)}; enqueue_many of {args.batch} "
            f"{PAYLOAD_SIZE}-byte messages per transaction"
        )
        fills = []
        for d in depths:
            if sqlite_engine:
                assert directory is not None
                path = os.path.join(directory, f"depth-{d}.db")
                st = Store(d, f"sqlite://{path}?sync={args.sync}", path)
            else:
                st = Store(d, "memory://", None)
            stores[d] = st
            segments = 10 if d == depths[-1] and d >= 10 * args.batch else 1
            f = st.fill(d, args.batch, segments)
            fills.append(f)
            if d:
                note(
                    f"   depth {d:,}: {f['messages']:,} messages in {f['seconds']:.1f} s "
                    f"({f['rate']:,.0f} msg/s)"
                )
        report["fill"] = fills
        deepest = fills[-1]
        if len(deepest["segments"]) > 1:
            segs = deepest["segments"]
            show_table(
                f"Fill of the {depths[-1]:,}-message store by tenths "
                f"(enqueue_many, {args.batch}/transaction)",
                ["depth range", "msg/s", "seconds", "vs first tenth"],
                [
                    [
                        f"{s['from']:,}-{s['to']:,}",
                        s["rate"],
                        s["seconds"],
                        f"{s['rate'] / segs[0]['rate']:.2f}",
                    ]
                    for s in segs
                ],
            )

        # 2. Rates --------------------------------------------------------------------------
        note(
            f"\n== 2. Rates around each depth: {args.ops:,} messages per operation per round, blocks of "
            f"{args.block} interleaved over the depths, {args.repeat} rounds (load now {loadavg()})"
        )
        order = list(stores.values())
        measure_round(order, max(args.block, args.warmup_ops), args.block)  # warm-up: not kept
        rounds: list[dict[int, dict[str, dict[str, Any]]]] = []
        for r in range(args.repeat):
            this = measure_round(order, args.ops, args.block, turn=r)
            rounds.append(this)
            note(
                f"   round {r + 1}: "
                + "; ".join(
                    f"{d:,}: " + "/".join(f"{this[d][op]['rate']:,.0f}" for op in OPS) for d in depths
                )
                + f" msg/s (enqueue/dequeue/lease+ack); load {loadavg()}"
            )
        rates: list[dict[str, Any]] = []
        rows = []
        for op in OPS:
            for d in depths:
                rs = [rd[d][op]["rate"] for rd in rounds]
                ratios = [rd[d][op]["rate"] / rd[0][op]["rate"] for rd in rounds]
                med = statistics.median(rs)
                ratio = statistics.median(ratios)
                p50 = statistics.median(rd[d][op]["p50_us"] for rd in rounds)
                p50_ratio = statistics.median(rd[0][op]["p50_us"] / rd[d][op]["p50_us"] for rd in rounds)
                cpu = statistics.median(rd[d][op]["cpu_us"] for rd in rounds)
                cpu_ratio = statistics.median(rd[0][op]["cpu_us"] / rd[d][op]["cpu_us"] for rd in rounds)
                p99 = statistics.median(rd[d][op]["p99_us"] for rd in rounds)
                mx = max(rd[d][op]["max_us"] for rd in rounds)
                rates.append(
                    {
                        "op": op,
                        "depth": d,
                        "rate": med,
                        "rates": rs,
                        "ratio": ratio,
                        "ratios": ratios,
                        "p50_us": p50,
                        "p50_ratio": p50_ratio,
                        "cpu_us": cpu,
                        "cpu_ratio": cpu_ratio,
                        "p99_us": p99,
                        "max_us": mx,
                        "messages": sum(rd[d][op]["messages"] for rd in rounds),
                        "meets_target": ratio >= 0.8 if d else None,
                    }
                )
                rows.append(
                    [
                        op,
                        f"{d:,}",
                        med,
                        f"{min(rs):,.0f}-{max(rs):,.0f}",
                        f"{ratio:.2f}",
                        "-" if not d else f"{min(ratios):.2f}-{max(ratios):.2f}",
                        p50,
                        f"{p50_ratio:.2f}",
                        cpu,
                        f"{cpu_ratio:.2f}",
                        p99,
                        mx / 1000,
                        "-" if not d else ("yes" if ratio >= 0.8 else "NO"),
                    ]
                )
        report["rates"] = rates
        report["rounds"] = rounds
        show_table(
            f"Rates around each depth ({label}; msg/s, one message per transaction, "
            f"lease+ack = 2 transactions; median of {args.repeat} rounds; ratios: rate(depth) / rate(0) of "
            "the same round, p50(0) / p50(depth), CPU(0) / CPU(depth))",
            [
                "operation",
                "depth",
                "msg/s",
                "range",
                "ratio vs depth 0",
                "ratio range",
                "p50 µs",
                "p50 ratio",
                "CPU µs/msg",
                "CPU ratio",
                "p99 µs",
                "max ms",
                ">= 0.8",
            ],
            rows,
        )

        # 3. What a transaction writes ----------------------------------------------------
        if sqlite_engine:
            note(
                f"\n== 3. Pages written per transaction (each operation until {args.probe_frames} "
                "WAL frames) and the B-tree"
            )
            shape = []
            rows = []
            for d, st in stores.items():
                assert st.path is not None
                probed = wal_probe(st, args.probe_frames, args.sync)
                info = btree_info(st.path)
                info.update({"depth": d, "ready": st.size(), "wal": probed})
                shape.append(info)

                def cell(v: float | None) -> Any:
                    return "-" if v is None else v

                rows.append(
                    [
                        f"{d:,}",
                        info["ready"],
                        info.get("btree_height"),
                        info.get("file_mb"),
                        *(cell(probed[op]["frames"]) for op in OPS),
                        *(cell(probed[op]["checkpoint_us"]) for op in OPS),
                    ]
                )
            report["shape"] = shape
            show_table(
                "Store shape; WAL frames (4 KiB pages written) per message; checkpoint of those "
                "frames, µs per message (lease+ack = 2 transactions)",
                [
                    "depth",
                    "ready now",
                    "kv B-tree height",
                    "file MB",
                    "frames/enqueue",
                    "frames/dequeue",
                    "frames/lease+ack",
                    "ckpt µs/enqueue",
                    "ckpt µs/dequeue",
                    "ckpt µs/lease+ack",
                ],
                rows,
            )

        # 4. Worker RSS -----------------------------------------------------------------------
        if sqlite_engine and not args.skip_rss:
            deep = stores[depths[-1]]
            note(
                f"\n== 4. Worker RSS while draining the {depths[-1]:,}-message store: "
                "a child process per mode, "
                f"{args.rss_seconds:g} s each, sampled every {args.rss_interval:g} s (load now {loadavg()})"
            )
            runs = []
            for mode in [x for x in args.rss_modes.split(",") if x]:
                res = run_worker_child(mode, deep.url, args.rss_seconds, args.rss_interval, args.rss_warmup)
                runs.append(res)
                note(
                    f"   {mode}: {res['processed']:,} messages at {res['rate']:,.0f} msg/s, "
                    f"depth {res['depth_before']:,} -> {res['depth_after']:,}"
                )
            report["worker_rss"] = runs
            show_table(
                f"Worker RSS draining the {depths[-1]:,}-message store (MB; baseline = first sample at >= "
                f"{args.rss_warmup:g} s; flat = peak after it within 10 % or 20 MB)",
                [
                    "mode",
                    "msgs",
                    "msg/s (1st half / 2nd half)",
                    "start",
                    "after warm-up",
                    "peak",
                    "end",
                    "VmHWM",
                    "growth MB (%)",
                    "slope MB/min",
                    "flat",
                ],
                [
                    [
                        r["mode"],
                        r["processed"],
                        f"{r['rate']:,.0f} ({_fmt(r['rate_first_half'] or 0)} / "
                        f"{_fmt(r['rate_second_half'] or 0)})",
                        r["rss_start_mb"],
                        r["rss_warm_mb"],
                        r["rss_peak_mb"],
                        r["rss_end_mb"],
                        r["vm_hwm_mb"],
                        f"{r['growth_after_warmup_mb']:+.1f} ({r['growth_after_warmup_pct']:+.1f}%)",
                        f"{r['slope_mb_per_min']:+.2f}",
                        "yes" if r["flat"] else "NO",
                    ]
                    for r in runs
                ],
            )
    finally:
        for st in stores.values():
            with contextlib.suppress(Exception):
                st.close()
        if directory is not None:
            if args.keep:
                note(f"\nstores kept in {directory}")
            else:
                shutil.rmtree(directory, ignore_errors=True)

    report["loadavg_at_end"] = loadavg()
    report["code_at_end"] = code_version()
    if report["code_at_end"] != report["code"]:
        note(f"\nWARNING: fdbqueue/ changed during the run ({report['code']} -> {report['code_at_end']})")
    report["wall_seconds"] = time.perf_counter() - wall
    summary = []
    for r in report.get("rates", []):
        if r["depth"] == depths[-1] and r["depth"]:
            summary.append(f"{r['op']} {r['ratio']:.2f}")
    if args.save:
        with open(args.save, "w") as out:
            json.dump(report, out, indent=2, default=str)
    if _JSON:
        print(json.dumps(report, indent=2, default=str))
    else:
        note(f"\nrate({depths[-1]:,}) / rate(0): " + ", ".join(summary) + " (target >= 0.8)")
        note(f"load average at end: {report['loadavg_at_end']}; total {report['wall_seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
