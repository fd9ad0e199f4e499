"""Many consumers at once: every message delivered exactly once, none lost.

(a) threads on the sim engine (with injected faults) and on memory://;
(b) OS processes (spawn) draining one sqlite file;
(c) producer and consumer processes at once on sqlite, consumers processing each message
    exactly once inside their own transactions (the dequeue and the work's write commit
    together), checked from the store's own ``done/`` keys.
"""

from __future__ import annotations

import multiprocessing as mp
import struct
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.testing import FaultScript, on_backoff

N_MESSAGES = 10_000
BATCH = 500


def fill(db: Any, q: Queue, n: int = N_MESSAGES, batch: int = BATCH) -> list[str]:
    ids: list[str] = []
    for start in range(0, n, batch):
        ids += q.enqueue_many(db, [f"m{i}" for i in range(start, min(n, start + batch))])
    assert len(ids) == n == len(set(ids))
    return ids


def check_exactly_once(ids: list[str], delivered: list[str]) -> None:
    dupes = len(delivered) - len(set(delivered))
    missing = set(ids) - set(delivered)
    foreign = set(delivered) - set(ids)
    assert not dupes and not missing and not foreign, (
        f"{dupes} delivered twice, {len(missing)} never delivered, {len(foreign)} unknown ids"
    )


# -- (a) threads ---------------------------------------------------------------------------------


@pytest.mark.parametrize("url", ["sim://?seed=3&faults=0.02", "memory://"])
def test_threads_drain_exactly_once(url: str) -> None:
    db = fdbqueue.open(url)
    q = Queue("drain")
    ids = fill(db, q)
    got: list[list[str]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    start = threading.Barrier(8)

    def consume(mine: list[str]) -> None:
        try:
            start.wait()
            while (m := q.dequeue(db)) is not None:
                mine.append(m.id)
        except BaseException as exc:  # reported below, with the thread's share
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(g,)) for g in got]
    # Switch threads often, so that transactions interleave (and collide) instead of each
    # running within one 5 ms slice of the GIL.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    t0 = time.monotonic()
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        sys.setswitchinterval(interval)
    elapsed = time.monotonic() - t0
    assert not any(t.is_alive() for t in threads), "a consumer hung"
    assert not errors, errors
    delivered = [i for g in got for i in g]
    left = [m.id for m in q.browse(db)]
    assert not left, f"{len(left)} messages still queued after every consumer saw an empty queue"
    check_exactly_once(ids, delivered)
    assert q.size(db) == 0
    assert sum(1 for g in got if g) >= 2, "only one consumer got work: no concurrency was tested"
    assert isinstance(db, SimDatabase)
    stats = db.stats
    print(f"{url}: {elapsed:.1f} s, per thread {[len(g) for g in got]}, {stats}")
    if "faults" in url:
        assert stats.faults, "no fault was injected"
    db.close()


# -- (b) processes on sqlite -------------------------------------------------------------------


def _drain_worker(url: str, name: str, out: str) -> None:
    db = fdbqueue.open(url)
    q = Queue(name)
    mine = []
    while (m := q.dequeue(db)) is not None:
        mine.append(m.id)
    db.close()
    Path(out).write_text("\n".join(mine))


@pytest.mark.slow
def test_processes_drain_sqlite_exactly_once(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    q = Queue("drain")
    ids = fill(db, q)
    ctx = mp.get_context("spawn")
    outs = [tmp_path / f"worker{i}.txt" for i in range(4)]
    procs = [ctx.Process(target=_drain_worker, args=(url, "drain", str(o))) for o in outs]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    elapsed = time.monotonic() - t0
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    got = [o.read_text().split() for o in outs]
    print(f"4 processes drained {N_MESSAGES} in {elapsed:.1f} s: {[len(g) for g in got]}")
    check_exactly_once(ids, [i for g in got for i in g])
    assert q.size(db) == 0 and q.empty(db)
    assert sum(1 for g in got if g) >= 2, "only one process got work: no concurrency was tested"
    db.close()


# -- (c) producers and exactly-once consumers on sqlite ----------------------------------------

PER_PRODUCER = 5_000
ONE = struct.pack("<q", 1)


def _producer(url: str, name: str, tag: str, n: int, out: str) -> None:
    db = fdbqueue.open(url)
    q = Queue(name)
    ids = []
    for start in range(0, n, 50):
        if start % 500 == 0:
            ids += [q.enqueue(db, f"{tag}:{i}") for i in range(start, start + 50)]  # singly, too
        else:
            ids += q.enqueue_many(db, [f"{tag}:{i}" for i in range(start, min(n, start + 50))])
    db.close()
    Path(out).write_text("\n".join(ids))


def _consumer(url: str, name: str, producers_done: Any, out: str) -> None:
    db = fdbqueue.open(url)
    q = Queue(name)

    @fdbqueue.transactional
    def work(tr: Any) -> str | None:
        m = q.dequeue(tr)
        if m is None:
            return None
        # The work's own write, in the transaction that consumes the message; an add (not
        # a set) so that a message processed twice would show as 2.
        tr.add(b"done/" + m.id.encode(), ONE)
        return m.id

    mine = []
    while True:
        mid = work(db)
        if mid is not None:
            mine.append(mid)
        elif producers_done.is_set():
            if work(db) is None:  # nothing was enqueued after the producers finished
                break
        else:
            q.wait(db, 0.2)
    db.close()
    Path(out).write_text("\n".join(mine))


@pytest.mark.slow
def test_producers_and_exactly_once_consumers_on_sqlite(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "work")
    ctx = mp.get_context("spawn")
    done = ctx.Event()
    p_out = [tmp_path / f"producer{i}.txt" for i in range(2)]
    c_out = [tmp_path / f"consumer{i}.txt" for i in range(2)]
    producers = [
        ctx.Process(target=_producer, args=(url, "work", f"p{i}", PER_PRODUCER, str(o)))
        for i, o in enumerate(p_out)
    ]
    consumers = [ctx.Process(target=_consumer, args=(url, "work", done, str(o))) for o in c_out]
    t0 = time.monotonic()
    for p in consumers + producers:
        p.start()
    for p in producers:
        p.join(120)
    done.set()
    for p in consumers:
        p.join(120)
    elapsed = time.monotonic() - t0
    assert all(p.exitcode == 0 for p in producers + consumers), [p.exitcode for p in producers + consumers]

    produced = [i for o in p_out for i in o.read_text().split()]
    consumed = [i for o in c_out for i in o.read_text().split()]
    assert len(produced) == 2 * PER_PRODUCER == len(set(produced))
    # The store's own record of the work: one done/ key per message, each written once.
    done_keys = {kv.key[len(b"done/") :].decode(): kv.value for kv in db.get_range_startswith(b"done/")}
    twice = sorted(k for k, v in done_keys.items() if v != ONE)
    assert not twice, f"{len(twice)} messages processed more than once, e.g. {twice[:3]}"
    assert set(done_keys) == set(produced), (
        f"{len(set(produced) - set(done_keys))} produced but never processed, "
        f"{len(set(done_keys) - set(produced))} processed but never produced"
    )
    check_exactly_once(produced, consumed)
    assert q_empty(db)
    assert all(o.read_text() for o in c_out), "a consumer got no work: no concurrency was tested"
    print(f"2 producers + 2 consumers, {len(produced)} messages in {elapsed:.1f} s")
    db.close()


def q_empty(db: Any) -> bool:
    q = Queue("work")
    return q.empty(db) and q.size(db) == 0


# -- a retried enqueue racing a consumer (deterministic) -----------------------------------------


def test_enqueue_retry_after_the_message_was_consumed_writes_nothing() -> None:
    """1021 on an enqueue that did land; a consumer takes it before the retry runs.

    The retry must see that its first attempt committed (a receipt, not the message
    itself, which is gone) and write nothing: the message is delivered once.
    """
    db = fdbqueue.open("sim://?seed=1")
    assert isinstance(db, SimDatabase)
    faults = FaultScript(db)
    q = Queue("jobs")
    fdbqueue.create_queue(db, "jobs")
    taken: list[Any] = []
    faults.arm([("1021", True)])
    on_backoff(db, lambda: taken.append(q.dequeue(db)))
    mid = q.enqueue(db, b"once")
    assert [m.id for m in taken if m is not None] == [mid]
    assert q.dequeue(db) is None, "the retried enqueue wrote the message a second time"
    assert q.size(db) == 0
