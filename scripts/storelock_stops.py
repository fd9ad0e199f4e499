#!/usr/bin/env python3
"""The embedded store's lock under random SIGSTOPs of its writers (issue 26, item 12).

Eight writer processes share one ``sqlite://`` store and commit read-modify-write
transactions as fast as they can: each reads a counter, writes it plus one, and writes a
log key of its own (``log/<writer>/<n>``) in the same transaction, then appends ``n`` to a
file once the commit returned. Meanwhile this process SIGSTOPs writers at random moments
for random durations (at most two at once; with ``--long``, some past the 5-second window)
and SIGCONTs them. At the end it counts:

- lost: a commit a writer saw return whose log key is missing, or a counter below the
  number of log keys (an update overwritten);
- doubled: a counter above the number of log keys (an increment applied twice);
- the longest wait of a live writer: the longest transaction, less the time its own writer
  was stopped, and the longest that overlapped no stop of a writer caught inside its
  commit (pinned: it holds SQLite's write lock, which nobody can take over; see
  engines/sqlite/storelock.py).

    python scripts/storelock_stops.py --seconds 60 --long
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import signal
import struct
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import fdbqueue
from fdbqueue.engines.sqlite import storelock as _storelock
from fdbqueue.engines.sqlite.page import read_page

COUNTER = b"counter"
SLOW = 0.5  # transactions longer than this are written down, with their times


def writer(url: str, me: int, outdir: str) -> None:
    """Commit read-modify-write transactions until killed; log each acknowledged one."""
    db = fdbqueue.open(url)
    done = open(Path(outdir, f"w{me}.acked"), "a", buffering=1)  # noqa: SIM115 - lives as long as the process
    slow = open(Path(outdir, f"w{me}.slow"), "a", buffering=1)  # noqa: SIM115
    n = 0

    @fdbqueue.transactional
    def step(tr: fdbqueue.Transaction, n: int) -> None:
        value = tr.get(COUNTER)
        tr.set(COUNTER, struct.pack("<Q", (struct.unpack("<Q", value)[0] if value else 0) + 1))
        tr.set(b"log/%d/%d" % (me, n), b"")

    while True:
        n += 1
        start = time.monotonic()
        step(db, n)
        end = time.monotonic()
        done.write(f"{n}\n")
        if end - start > SLOW:
            slow.write(f"{start} {end}\n")


@dataclass
class Result:
    commits: int = 0
    lost: int = 0
    doubled: int = 0
    stops: int = 0
    stops_past_window: int = 0
    stops_in_commit: int = 0
    longest_wait: float = 0.0  # of a live writer
    longest_wait_no_commit_stop: float = 0.0  # ... overlapping no stop of a writer inside its commit
    notes: list[str] = field(default_factory=list)


def _page_holder(path: str) -> tuple[int, int]:
    """(pid of the lock's slot holder, its start) as the lock file's page says."""
    page = read_page(path + "-lock")
    if page is None:
        return (0, 0)
    gen, claimed, since, pid, _ = page.lease()
    return (pid, since) if claimed == gen else (0, 0)


def run(seconds: float, writers: int = 8, long_stops: bool = False, seed: int | None = None) -> Result:
    seed = random.randrange(2**32) if seed is None else seed
    rng = random.Random(seed)
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "q.db")
        url = f"sqlite://{path}?sync=normal&lock_timeout=30"
        fdbqueue.open(url).close()
        procs = [ctx.Process(target=writer, args=(url, i, tmp), daemon=True) for i in range(writers)]
        for p in procs:
            p.start()
        result = Result(notes=[f"seed {seed}"])
        stopped: dict[int, float] = {}  # pid -> when to resume
        intervals: dict[int, list[tuple[float, float]]] = {p.pid or 0: [] for p in procs}
        in_commit: list[tuple[float, float]] = []
        began: dict[int, tuple[float, bool]] = {}
        # Each writer makes its two files once its store is open: wait for all of them, not
        # a fixed second (on a loaded machine a spawned writer may take longer to import and
        # open, and one killed before it made its files left nothing for the counts below).
        opened = time.monotonic() + 120.0
        while not all(Path(tmp, f"w{i}.slow").exists() for i in range(writers)):
            if time.monotonic() > opened or any(p.exitcode is not None for p in procs):
                raise RuntimeError(f"a writer did not open the store (seed {seed})")
            time.sleep(0.05)
        end = time.monotonic() + seconds
        next_stop = time.monotonic()
        while time.monotonic() < end:
            now = time.monotonic()
            for pid, until in list(stopped.items()):
                if now >= until:
                    os.kill(pid, signal.SIGCONT)
                    start, pinned = began.pop(pid)
                    intervals[pid].append((start, now))
                    if pinned:
                        in_commit.append((start, now))
                    del stopped[pid]
            if now >= next_stop and len(stopped) < 2:
                pid = rng.choice([p.pid for p in procs if p.pid not in stopped and p.pid])
                if long_stops and rng.random() < 0.1:
                    hold = rng.uniform(5.5, 8.0)
                    result.stops_past_window += 1
                else:
                    hold = rng.uniform(0.01, 1.5)
                os.kill(pid, signal.SIGSTOP)
                holder, since = _page_holder(path)
                pinned = holder == pid and since == _storelock._PINNED
                result.stops += 1
                result.stops_in_commit += pinned
                began[pid] = (time.monotonic(), pinned)
                stopped[pid] = time.monotonic() + hold
                next_stop = time.monotonic() + rng.uniform(0.05, 0.6)
            time.sleep(0.005)
        for pid in list(stopped):
            os.kill(pid, signal.SIGCONT)
            start, pinned = began.pop(pid)
            intervals[pid].append((start, time.monotonic()))
            if pinned:
                in_commit.append((start, time.monotonic()))
        time.sleep(1.0)
        for p in procs:
            os.kill(p.pid or 0, signal.SIGKILL)
            p.join(10)
        db = fdbqueue.open(url)
        value = db.get(COUNTER)
        counter = struct.unpack("<Q", value)[0] if value else 0
        keys = {bytes(k) for k, _ in db.get_range_startswith(b"log/")}
        result.commits = len(keys)
        for i, p in enumerate(procs):
            acked = Path(tmp, f"w{i}.acked").read_text().split()
            result.lost += sum(1 for n in acked if b"log/%d/%s" % (i, n.encode()) not in keys)
            for line in Path(tmp, f"w{i}.slow").read_text().splitlines():
                a, b = map(float, line.split())
                own = sum(max(0.0, min(b, y) - max(a, x)) for x, y in intervals[p.pid or 0])
                wait = b - a - own
                result.longest_wait = max(result.longest_wait, wait)
                if not any(x < b and a < y for x, y in in_commit):
                    result.longest_wait_no_commit_stop = max(result.longest_wait_no_commit_stop, wait)
        result.lost += max(0, len(keys) - counter)
        result.doubled = max(0, counter - len(keys))
        db.close()
        return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--writers", type=int, default=8)
    ap.add_argument("--long", action="store_true", help="some stops past the 5-second window")
    ap.add_argument("--seed", type=int)
    args = ap.parse_args()
    r = run(args.seconds, args.writers, args.long, args.seed)
    print(
        f"{r.commits} commits, {r.stops} stops ({r.stops_past_window} past the window, "
        f"{r.stops_in_commit} inside a commit): lost {r.lost}, doubled {r.doubled}; longest wait of a "
        f"live writer {r.longest_wait:.2f} s, {r.longest_wait_no_commit_stop:.2f} s outside stops inside "
        f"a commit ({', '.join(r.notes)})"
    )
    return 0 if r.lost == r.doubled == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
