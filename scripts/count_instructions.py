"""What one operation of the embedded engine costs in SQL statements and in instructions.

Per message, on ``sqlite://...?sync=normal`` (the fsync is not an instruction), one process:

- **statements**: the SQL statements SQLite ran (``Connection.set_trace_callback``, which
  reports each statement each time it is stepped), counted over 100 operations;
- **instructions**: valgrind's callgrind (deterministic: the same count whatever else the
  machine does), as (I(2n) - I(n)) / n over two runs of n and 2n operations, so that the
  interpreter's start, the imports and the setup cancel out;
- **time**: the mean of 3,000 operations without valgrind, for the ratio to the floor.

Against the floor: raw ``sqlite3`` doing the least the same work needs (WAL, the same
synchronous, one row a commit: ``INSERT`` for an enqueue, ``SELECT`` + ``DELETE`` for a
dequeue; the tables of scripts/bench_queue.py). A second table times, in raw ``sqlite3``
with no layer at all, the statements an enqueue runs beside the floor's: what SQLite alone
costs for the layer's transaction.

``enqueue_many`` is a message of ``enqueue_many`` in calls of 100 (one transaction each): its
figures are per message, against the floor's one-row transactions.

``worker`` is a lease-mode Worker's message (a no-op handler, batched settlement): one
``Worker.run(max_messages=n)`` handles n messages, so its start and stop cancel out too.
Its prefetch grows with rates measured in wall-clock time, so how many messages share a
transaction varies between runs; ``worker64`` fixes the prefetch at 64 (``prefetch=(64,
64)``) for a figure that compares across revisions. Each run's queue holds exactly the n
messages it handles (the rest of the same fill, 2n + 10 in all, goes to a queue beside it,
so that the fill still cancels), so that no message is leased past n; the settle linger is
longer than the run, so that each batch's acks commit with the next batch's lease, a steady
Worker's settlement; and ``worker64``'s n is rounded down to whole batches (--n 200: runs of
192 and 384), so that the two runs differ by whole batches of the same work. Before (issue
30's ninth pass), both runs drained one stock of 2n + 10 with the Worker's 5 ms linger: at
n = 200 the n-run leased 256 and released 56, one transaction each, and the 2n-run's leases
stopped at 410; the linger ran out under callgrind more often than at full speed. The
difference of the two runs was then not n messages of the same work, and it moved with n
(about 444k at n = 100, 134k at 200, 206k at 400).

``lease_ack4`` is a message of four processes draining one store with lease + ack, as
``bench_contention.py``'s row, in one process: four handles of the store take turns (four
leases, then their four acks), so that every transaction follows another handle's commit, as
it does under contention - no kept head, nothing kept from the handle's last commit.

``dequeue_among`` is a ``dequeue(tr)`` among other consumers, as in ``bench_contention.py``'s
four processes draining: before each of ours, another process (a child at a pipe, which
callgrind does not count) takes one message from the same queue and commits, so that every
take of ours follows another consumer's (the kept head out of date, paused: ops/contended.py).
``enqueue_among`` and ``lease_ack_among`` are the same for an enqueue among other producers
and a lease + ack among other consumers (the other process enqueues, or leases and acks).
``among_ping`` is the turn without ours (the pipe's round trip and the other's take, as seen
from here): subtract it for the operation alone.

``--steps``: what each step of an enqueue costs, in Python bytecodes executed (deterministic,
counted with ``sys.settrace``'s opcode events; callgrind cannot see Python functions) - the
call, the transaction begun (store lock, BEGIN), the queue's metadata read, database time,
the message written, its counters, the commit, and the glue between them.

Usage: .venv/bin/python scripts/count_instructions.py [--n 300]
       [--ops enqueue,enqueue_many,dequeue,lease_ack,worker,worker64] [--markdown] [--steps]
       (``enqueue_owned``, ``dequeue_owned``, ``lease_ack_owned``: the same on a queue with an
       owner and 100 principals' grants, used by a granted principal, bench_journal's third
       table's queue: against the open queue's ops, an owned queue's cost)
       (needs valgrind for the instruction column: apt install valgrind)
       --smoke: every operation at the smallest settings, callgrind left out, then the steps
       (so that CI runs every path of the script; its figures mean nothing)
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sqlite3
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchlib import machine, show_table

import fdbqueue

PAYLOAD = b"x" * 200
OPS = (
    "enqueue",
    "enqueue_many",
    "dequeue",
    "lease_ack",
    "lease_ack4",
    "worker",
    "worker64",
    "enqueue_owned",
    "dequeue_owned",
    "lease_ack_owned",
    "dequeue_among",
    "enqueue_among",
    "lease_ack_among",
    "among_ping",
    "raw_enqueue",
    "raw_dequeue",
)
BATCH = 100  # enqueue_many's messages a call
FLOOR = {
    "enqueue": "raw_enqueue",
    "enqueue_many": "raw_enqueue",
    "dequeue": "raw_dequeue",
    "lease_ack": "raw_dequeue",
    "lease_ack4": "raw_dequeue",
    "worker": "raw_dequeue",
    "worker64": "raw_dequeue",
    "enqueue_owned": "raw_enqueue",
    "dequeue_owned": "raw_dequeue",
    "lease_ack_owned": "raw_dequeue",
    "dequeue_among": "raw_dequeue",
    "enqueue_among": "raw_enqueue",
    "lease_ack_among": "raw_dequeue",
    "among_ping": "raw_dequeue",
}
# Another process does one of the same before each of ours (among_ping: takes one, ours none).
AMONG = {
    "dequeue_among": "dequeue",
    "enqueue_among": "enqueue",
    "lease_ack_among": "lease_ack",
    "among_ping": "dequeue",
}
# The other process: for each byte read, one operation in its own transaction(s), then a byte back.
OTHER = """
import os, sys
import fdbqueue
db = fdbqueue.open(sys.argv[1])
what = sys.argv[2]
q = fdbqueue.Queue("jobs")
take = fdbqueue.transactional(lambda tr: q.dequeue(tr))
while os.read(0, 1):
    if what == "enqueue":
        q.enqueue(db, b"x" * 200)
    elif what == "lease_ack":
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)
    else:
        assert take(db) is not None
    os.write(1, b"+")
"""
OWNER, GRANTS, USER = "svc-owner", 100, "svc-050"  # the *_owned ops' queue and who uses it


WORKERS = ("worker", "worker64")  # each run's queue holds exactly the messages it handles
REST = "rest"  # the workers' queue beside "jobs" for the rest of the fill (a name as long)
PREFETCH = 64  # worker64's prefetch; its runs are rounded down to whole batches of it
LINGER = 3600.0  # the workers' settle linger: longer than any run (acks go with the next lease)


def _setup(
    op: str, folder: str, stock: int, ready: int | None = None
) -> tuple[Callable[[int], object], list[sqlite3.Connection]]:
    """The operation as a call that does it n times, with ``stock`` messages in place for a
    dequeue (of them ``ready`` in the operation's queue, the rest in a queue beside it; all
    of them when None), and the SQLite connections whose statements it runs."""
    one, conns = _setup_one(op, folder, stock, stock if ready is None else ready)
    if callable(getattr(one, "times", None)):
        return one.times, conns  # type: ignore[attr-defined]

    def times(n: int) -> None:
        for _ in range(n):
            one()

    return times, conns


def _setup_one(
    op: str, folder: str, stock: int, ready: int
) -> tuple[Callable[[], object], list[sqlite3.Connection]]:
    if op.startswith("raw_"):
        conn = sqlite3.connect(os.path.join(folder, "raw.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE q (k BLOB PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
        counter = iter(range(10**9))

        def key() -> bytes:
            return b"\x02q\x00" + struct.pack(">Q", next(counter)) + os.urandom(8)

        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO q VALUES (?, ?)", ((key(), PAYLOAD) for _ in range(stock)))
        conn.execute("COMMIT")

        def raw_enqueue() -> None:
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT INTO q (k, v) VALUES (?, ?)", (key(), PAYLOAD))
            conn.execute("COMMIT")

        def raw_dequeue() -> None:
            conn.execute("BEGIN IMMEDIATE")
            k = conn.execute("SELECT k, v FROM q ORDER BY k LIMIT 1").fetchone()[0]
            conn.execute("DELETE FROM q WHERE k = ?", (k,))
            conn.execute("COMMIT")

        return (raw_enqueue if op == "raw_enqueue" else raw_dequeue), [conn]
    url = f"sqlite://{os.path.join(folder, 'q.db')}?sync=normal"
    owned = op.endswith("_owned")
    if owned:  # an owner and 100 principals' grants; the operations run as a granted one
        op = op[: -len("_owned")]
        admin = fdbqueue.open(url, principal=OWNER)
        fdbqueue.create_queue(admin, "jobs", owner=OWNER)
        for i in range(GRANTS):
            fdbqueue.grant(admin, "jobs", f"svc-{i:03d}", ["enqueue", "dequeue", "browse"])
        admin.close()
    db = fdbqueue.open(url, principal=USER if owned else None)
    q = fdbqueue.Queue("jobs")
    rest = fdbqueue.Queue(REST)

    @fdbqueue.transactional
    def fill(tr: fdbqueue.Transaction, lo: int, hi: int) -> None:
        if lo < min(hi, ready):  # the operation's queue first, then the rest beside it
            q.enqueue_many(tr, [PAYLOAD] * (min(hi, ready) - lo))
        if max(lo, ready) < hi:
            rest.enqueue_many(tr, [PAYLOAD] * (hi - max(lo, ready)))

    for lo in range(0, stock, 500):  # a transaction's byte budget holds about 900 of them
        fill(db, lo, min(stock, lo + 500))
    for _ in range(3):  # settings cached, pages warm
        q.enqueue(db, PAYLOAD)
        q.dequeue(db)
    if op in AMONG:
        pipe = subprocess.PIPE
        other = subprocess.Popen([sys.executable, "-c", OTHER, url, AMONG[op]], stdin=pipe, stdout=pipe)
        assert other.stdin is not None and other.stdout is not None
        to, back = other.stdin.fileno(), other.stdout.fileno()

        @fdbqueue.transactional
        def ours(tr: fdbqueue.Transaction) -> fdbqueue.Message | None:
            return q.dequeue(tr)

        def among() -> None:
            os.write(to, b"+")  # the other process's operation commits, then ours
            if os.read(back, 1) != b"+":
                raise RuntimeError("the other process stopped")
            if op == "dequeue_among" and ours(db) is None:
                raise RuntimeError("the queue ran dry")
            if op == "enqueue_among":
                q.enqueue(db, PAYLOAD)
            elif op == "lease_ack_among":
                m = q.lease(db)
                if m is None:
                    raise RuntimeError("the queue ran dry")
                q.ack(db, m)

        return among, [db._store.conn]  # type: ignore[attr-defined]
    conns = [db._store.conn]  # type: ignore[attr-defined]
    if op == "enqueue":
        return (lambda: q.enqueue(db, PAYLOAD)), conns
    if op == "dequeue":

        @fdbqueue.transactional
        def take(tr: fdbqueue.Transaction) -> fdbqueue.Message | None:
            return q.dequeue(tr)

        return (lambda: take(db)), conns

    if op == "enqueue_many":

        def batch() -> None:
            raise AssertionError("enqueue_many runs n messages in calls of BATCH")

        def many(n: int) -> None:
            for lo in range(0, n, BATCH):
                q.enqueue_many(db, [PAYLOAD] * min(BATCH, n - lo))

        batch.times = many  # type: ignore[attr-defined]
        return batch, conns

    if op in ("worker", "worker64"):
        prefetch = (PREFETCH, PREFETCH) if op == "worker64" else (1, 256)  # the second: Worker's default

        def noop(m: fdbqueue.Message) -> None:
            pass

        def worker() -> None:
            raise AssertionError("a Worker runs n messages at once")

        def times(n: int) -> None:
            # The queue holds n (``ready``): nothing leased past n, nothing released.
            worker = fdbqueue.Worker(db, "jobs", noop, mode="lease", prefetch=prefetch, settle_linger=LINGER)
            stats = worker.run(max_messages=n)
            assert stats.processed == n and not stats.released, stats

        worker.times = times  # type: ignore[attr-defined]
        return worker, conns

    if op == "lease_ack4":
        url = f"sqlite://{os.path.join(folder, 'q.db')}?sync=normal"
        handles = [db, *(fdbqueue.open(url) for _ in range(3))]

        def four() -> None:
            raise AssertionError("lease_ack4 runs n messages in turns of four handles")

        def turns(n: int) -> None:
            for lo in range(0, n, 4):
                taken = [(h, q.lease(h)) for h in handles[: min(4, n - lo)]]
                for h, m in taken:
                    assert m is not None
                    q.ack(h, m)

        four.times = turns  # type: ignore[attr-defined]
        return four, [h._store.conn for h in handles]  # type: ignore[attr-defined]

    def lease_ack() -> None:
        m = q.lease(db)
        assert m is not None
        q.ack(db, m)

    return lease_ack, conns


def child(op: str, n: int, stock: int) -> None:
    """Run ``n`` operations (valgrind counts the whole process; the parent subtracts)."""
    with tempfile.TemporaryDirectory() as folder:
        # Among another consumer each turn takes two: the same stock for both runs, doubled.
        run, _ = _setup(op, folder, 2 * stock if op in AMONG else stock, n if op in WORKERS else None)
        run(n)


def instructions(op: str, n: int) -> float | None:
    """(I(2n) - I(n)) / n under callgrind (for worker64, n rounded down to a multiple of 64);
    None without valgrind."""
    if shutil.which("valgrind") is None:
        return None
    if op == "worker64":  # whole batches of 64 in both runs: the same work, no partial batch
        n = max(PREFETCH, n // PREFETCH * PREFETCH)
    counts = []
    for k in (n, 2 * n):
        out = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--callgrind-out-file=/dev/null",
                sys.executable,
                os.path.abspath(__file__),
                "--child",
                op,
                str(k),
                str(2 * n + 10),
            ],
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"Collected : (\d+)", out.stderr)
        if found is None:
            raise RuntimeError(f"no instruction count from callgrind: {out.stderr[-500:]}")
        counts.append(int(found.group(1)))
    return (counts[1] - counts[0]) / n


def statements_and_time(op: str, timed: int) -> tuple[float, float]:
    """Statements per operation (over 100) and mean seconds per operation (over ``timed``)."""
    with tempfile.TemporaryDirectory() as folder:
        # A worker's queue holds exactly what each run handles: a store for each of the two.
        stock = timed + 110
        run, conns = _setup(op, folder, 2 * stock if op in AMONG else stock, 100 if op in WORKERS else None)
        seen: list[str] = []
        for c in conns:
            c.set_trace_callback(seen.append)
        run(100)
        for c in conns:
            c.set_trace_callback(None)
        if op in WORKERS:
            os.mkdir(os.path.join(folder, "timed"))
            run, _ = _setup(op, os.path.join(folder, "timed"), timed + 110, timed)
        start = time.perf_counter()
        run(timed)
        return len(seen) / 100, (time.perf_counter() - start) / timed


def sql_alone(n: int = 5000) -> list[list[str]]:
    """Raw sqlite3 running an enqueue's statements (BEGIN, one SELECT of the queue's 6 small
    keys, one INSERT of the message and 2 counters, COMMIT) beside the floor's (BEGIN IMMEDIATE,
    one INSERT, COMMIT): mean µs per statement over ``n`` transactions, no Python layer."""
    with tempfile.TemporaryDirectory() as folder:
        conn = sqlite3.connect(os.path.join(folder, "kv.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("CREATE TABLE kv (k BLOB PRIMARY KEY, v BLOB) WITHOUT ROWID")
        prefix = b"\x02fdbqueue\x00\x02q\x00\x02jobs\x00"
        small = [prefix + b"\x02m\x00" + bytes([i]) for i in range(6)]
        conn.executemany("INSERT INTO kv VALUES (?, ?)", [(k, b"\0" * 8) for k in small])
        select = f"SELECT k, v FROM kv WHERE k IN ({','.join('?' * 6)})"
        insert = "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?), (?, ?), (?, ?)"
        layer = [0.0] * 4
        floor = [0.0] * 3
        for i in range(n):
            key = prefix + b"\x02r\x00" + struct.pack(">Q", i) + os.urandom(8)
            marks = [time.perf_counter()]
            conn.execute("BEGIN")
            marks.append(time.perf_counter())
            conn.execute(select, small).fetchall()
            marks.append(time.perf_counter())
            conn.execute(insert, (key, PAYLOAD, small[1], b"\1" * 8, small[2], b"\2" * 8))
            marks.append(time.perf_counter())
            conn.execute("COMMIT")
            marks.append(time.perf_counter())
            for j in range(4):
                layer[j] += marks[j + 1] - marks[j]
            marks = [time.perf_counter()]
            conn.execute("BEGIN IMMEDIATE")
            marks.append(time.perf_counter())
            conn.execute("INSERT INTO kv (k, v) VALUES (?, ?)", (key + b"f", PAYLOAD))
            marks.append(time.perf_counter())
            conn.execute("COMMIT")
            marks.append(time.perf_counter())
            for j in range(3):
                floor[j] += marks[j + 1] - marks[j]
        conn.close()
    us = [f"{t / n * 1e6:.1f}" for t in layer]
    fl = [f"{t / n * 1e6:.1f}" for t in floor]
    return [
        ["an enqueue's statements", *us, f"{sum(layer) / n * 1e6:.1f}"],
        ["the floor's", fl[0], "-", fl[1], fl[2], f"{sum(floor) / n * 1e6:.1f}"],
    ]


# The steps of an enqueue, by the function that does each (inclusive counts; begin runs inside
# the metadata read, the operation's first, and is taken out of it).
STEPS = (
    ("the call: arguments checked, the item made", "new_item"),
    ("the transaction made", "create_transaction"),
    ("begun: the store lock, BEGIN", "_begin"),
    ("the metadata and counters read (one statement)", "read_meta"),
    ("database time (the read version; only for a delay, TTL or dedup key)", "db_now"),
    ("the message encoded and written", "_write_new"),
    ("its counters, the work index", "count_new"),
    ("the commit: guards, INSERT, version, COMMIT, release", "commit"),
)


def steps(reps: int = 20) -> list[list[str]]:
    """Bytecodes per step of an enqueue (see STEPS), over ``reps`` enqueues after a warm-up."""
    with tempfile.TemporaryDirectory() as folder:
        run, _ = _setup("enqueue", folder, 0)
        run(3)
        incl: dict[str, int] = {}
        stack: list[str] = []
        total = [0]

        def tracer(frame: object, event: str, arg: object) -> object:
            if event == "call":
                frame.f_trace_opcodes = True  # type: ignore[attr-defined]
                stack.append(frame.f_code.co_name)  # type: ignore[attr-defined]
            elif event == "opcode":
                total[0] += 1
                for name in set(stack):
                    incl[name] = incl.get(name, 0) + 1
            elif event == "return" and stack:
                stack.pop()
            return tracer

        sys.settrace(tracer)  # type: ignore[arg-type]
        try:
            run(reps)
        finally:
            sys.settrace(None)
    per = {name: incl.get(fn, 0) / reps for name, fn in STEPS}
    per["begun: the store lock, BEGIN"] = incl.get("_begin", 0) / reps
    per["the metadata and counters read (one statement)"] -= per["begun: the store lock, BEGIN"]
    rows = [[name, f"{v:,.0f}"] for name, v in per.items()]
    rest = total[0] / reps - sum(per.values())
    rows.append(["the rest: retry loop, adopt, the queue's checks", f"{rest:,.0f}"])
    rows.append(["total", f"{total[0] / reps:,.0f}"])
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300, help="operations of the shorter callgrind run")
    ap.add_argument("--timed", type=int, default=3000, help="operations timed without valgrind")
    ap.add_argument("--ops", default="enqueue,dequeue,lease_ack")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--steps", action="store_true", help="bytecodes per step of an enqueue, then exit")
    ap.add_argument("--smoke", action="store_true", help="every operation, smallest settings, no callgrind")
    ap.add_argument("--child", nargs=3, metavar=("OP", "N", "STOCK"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]), int(args.child[2]))
        return
    if args.smoke:
        args.ops, args.timed = ",".join(FLOOR), 20
    if args.steps:
        show_table(
            "an enqueue, step by step: Python bytecodes",
            ["step", "bytecodes"],
            steps(),
            markdown=args.markdown,
        )
        return
    ops = [o for o in args.ops.split(",") if o]
    unknown = [o for o in ops if o not in FLOOR]
    if unknown:
        ap.error(f"unknown operation(s) {unknown}: choose from {sorted(FLOOR)}")
    measured: dict[str, tuple[float, float, float | None]] = {}
    for op in dict.fromkeys([*ops, *(FLOOR[o] for o in ops)]):
        stmts, seconds = statements_and_time(op, args.timed)
        measured[op] = (stmts, seconds, None if args.smoke else instructions(op, args.n))
    print(machine(sync="normal", payload=len(PAYLOAD), n=args.n, timed=args.timed))
    rows = []
    for op in ops:
        stmts, seconds, ir = measured[op]
        fst, fsec, fir = measured[FLOOR[op]]
        rows.append(
            [
                op,
                f"{stmts:g} / {fst:g}",
                "-" if ir is None or fir is None else f"{ir:,.0f} / {fir:,.0f} ({fir / ir:.2f})",
                f"{seconds * 1e6:.1f} / {fsec * 1e6:.1f} ({fsec / seconds:.2f})",
            ]
        )
    show_table(
        "per message, fdbqueue / raw sqlite3 floor (ratio: floor / fdbqueue)",
        ["operation", "statements", "instructions", "µs"],
        rows,
        markdown=args.markdown,
    )
    show_table(
        "SQLite alone, µs per statement (raw sqlite3, sync=normal)",
        ["statements", "BEGIN", "SELECT", "INSERT", "COMMIT", "total"],
        sql_alone(200 if args.smoke else 5000),
        markdown=args.markdown,
    )
    if args.smoke:
        title = "an enqueue, step by step: Python bytecodes"
        show_table(title, ["step", "bytecodes"], steps(2), markdown=args.markdown)


if __name__ == "__main__":
    main()
