"""Issue 28 on the sim, measured with ``testing.traffic``: no key outside a queue's own is
written by every queue that comes to have work, and one idle consumer wakes for a message,
not all of them (``workindex.sleep`` / ``wake_one``)."""

from __future__ import annotations

import json
import threading
import time

import fdb.tuple

import fdbqueue
from fdbqueue import Queue, Worker, testing
from fdbqueue.ops import workindex
from fdbqueue.ops.txn import run_once
from fdbqueue.store.codec import ONE  # noqa: F401 - fdb.tuple packs versionstamps without libfdb_c


def sim() -> fdbqueue.Database:
    return fdbqueue.open("sim://?seed=5")


def outside_queues(key: bytes) -> bool:
    kind = fdb.tuple.unpack(key)[1]
    return kind not in ("q", "wk")  # a queue's own keys and its own index entry


def test_queues_coming_to_have_work_share_no_key() -> None:
    db = sim()
    names = [f"t.{i:02d}" for i in range(30)]
    for name in names:
        fdbqueue.create_queue(db, name)
    with testing.traffic(db) as t:
        for name in names:
            Queue(name).enqueue(db, b"x")  # each one enters the work index
    assert t.commits == 30
    shared = [(k, w) for k, w in t.writes.items() if outside_queues(k)]
    assert shared == []  # the old design bumped root + ("wb",) 30 times


def _idle_workers(db: fdbqueue.Database, pattern: str, n: int, got: list[str]) -> list[Worker]:
    workers = [Worker(db, pattern, lambda m: got.append(m.queue), idle_timeout=0.2) for _ in range(n)]
    for w in workers:
        threading.Thread(target=w.run, daemon=True).start()
    return workers


def _until(cond: object, seconds: float = 20.0) -> None:
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:  # type: ignore[operator]
        time.sleep(0.02)


def _asleep(db: fdbqueue.Database, n: int) -> None:
    begin, end = workindex.work_keys().sleepers_range()
    _until(lambda: len(run_once(db, lambda t, _: t.get_range(begin, end))) == n)


def test_one_idle_consumer_wakes_for_a_message() -> None:
    db = sim()
    for i in range(20):
        fdbqueue.create_queue(db, f"h.{i:02d}")
    got: list[str] = []
    workers = _idle_workers(db, "h.*", 8, got)
    try:
        _asleep(db, 8)
        with testing.traffic(db) as t:
            Queue("h.07").enqueue(db, b"x")
            _until(lambda: len(got) == 1)
            time.sleep(1.0)  # five idle timeouts of every worker: they cost no transaction
        assert got == ["h.07"]
        # The enqueue, then one consumer: its turn, the lease, the ack, the retire, its
        # sleep again (and a look or two more). Eight consumers woken each cost a turn.
        assert t.transactions <= 10, (t.transactions, t.commits)
        assert sum(w.stats.wakeups for w in workers) == 1
    finally:
        for w in workers:
            w.stop()


def test_a_consumer_of_other_queues_sleeps_on() -> None:
    db = sim()
    for name in ("a.1", "b.1"):
        fdbqueue.create_queue(db, name)
    got: list[str] = []
    a = _idle_workers(db, "a.*", 1, got)[0]
    b = _idle_workers(db, "b.*", 1, got)[0]
    try:
        _asleep(db, 2)
        assert a.workset is not None
        before = a.workset.watches
        Queue("b.1").enqueue(db, b"x")
        _until(lambda: got == ["b.1"])
        time.sleep(0.5)
        assert got == ["b.1"]
        assert a.stats.wakeups == 0 and a.workset.watches == before
        assert b.stats.wakeups == 1
    finally:
        a.stop()
        b.stop()


def test_a_dead_consumers_registration_is_passed_over() -> None:
    db = sim()
    for name in ("d.1", "d.2"):
        fdbqueue.create_queue(db, name)
    wk = workindex.work_keys()
    ghost = wk.sleeper(b"\x00" * 8)
    stale = json.dumps({"p": "d.*", "at": 0}).encode()  # registered long ago, never renewed
    run_once(db, lambda t, _: t.set(ghost, stale))
    Queue("d.1").enqueue(db, b"x")  # the waker meets only the ghost: clears it, wakes nobody
    assert run_once(db, lambda t, _: t.get(ghost)) is None
    run_once(db, lambda t, _: t.set(ghost, stale))
    got: list[str] = []
    w = _idle_workers(db, "d.*", 1, got)[0]
    try:
        _until(lambda: got == ["d.1"], 10.0)
        _asleep(db, 2)  # the live consumer and the ghost
        Queue("d.2").enqueue(db, b"y")  # whichever the waker meets first, the live one wakes
        _until(lambda: got == ["d.1", "d.2"], 10.0)  # well before LOST_WAKEUP_RECHECK
        assert got == ["d.1", "d.2"]
    finally:
        w.stop()


def test_a_stopped_consumer_leaves_no_registration() -> None:
    db = sim()
    fdbqueue.create_queue(db, "s.1")
    got: list[str] = []
    w = _idle_workers(db, "s.*", 1, got)[0]
    _asleep(db, 1)
    w.stop()
    _asleep(db, 0)
    begin, end = workindex.work_keys().sleepers_range()
    assert run_once(db, lambda t, _: t.get_range(begin, end)) == []
