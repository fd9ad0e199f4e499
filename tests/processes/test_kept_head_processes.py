"""A head kept between transactions (``fdbqueue/ops/head.py``) and counters written as read
(``delivery.count_known``), against real OS processes sharing one store file.

The children (``tests/support/kept_children.py``) run commands sent over a pipe on two
database handles each, so the test decides the interleaving (seeded: a failure replays) while
the processes, their handles and their kept runs are real and separate. A plain-Python model
of the queue says what every command must return: each message delivered (dequeued or acked)
exactly once, none lost, the head always the highest priority then the oldest, and
``queue_stats`` exact at the end and equal to a count of the stored keys. Free-running
processes are also SIGKILLed mid-stream and started again.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import LeaseError, Queue
from tests.support.kept_children import NAME, Children_, Proc, command_children, header_of, ok, stored_counts
from tests.support.processes import Children, assert_nothing_left, child_stderr, held, real_clock

pytestmark = pytest.mark.usefixtures(real_clock.__name__)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Children_]:
    with command_children(tmp_path) as got:
        yield got


# -- found by this review: a queue destroyed and made again under its name ------------------------


def test_a_queue_destroyed_and_made_again_in_another_process_drops_the_kept_run(
    procs: Children_,
) -> None:
    """Process A dequeues (and keeps the records after its head); process B destroys the queue,
    makes it again and puts as many messages back, then takes one: the ready and wake counters
    start again from nothing and end where A's kept run expects them. A must not hand out a
    message of the destroyed queue, nor write counters from it."""
    _, (a, b, _c), db, _ = procs
    for i in range(3):
        ok(a.call("enqueue", 0, f"old{i}", 0, 0.0, None, None))
    assert ok(a.call("dequeue", 0)) == "old0"
    ok(b.call("recreate", 0))
    for i in range(3):
        ok(b.call("enqueue", 0, f"new{i}", 0, 0.0, None, None))
    assert ok(b.call("dequeue", 0)) == "new0"
    assert ok(a.call("dequeue", 0)) == "new1"  # not old1, a message of the destroyed queue
    assert ok(b.call("dequeue", 0)) == "new2"
    assert ok(a.call("dequeue", 0)) is None
    st = fdbqueue.queue_stats(db, NAME)
    assert (st.ready, st.inflight, st.done) == (0, 0, 3)
    assert stored_counts(db) == {"ready": 0, "inflight": 0, "delayed": 0}


@pytest.mark.parametrize("take", ["dequeue", "lease"])
def test_a_priority_message_from_another_process_is_served_before_a_kept_run(
    procs: Children_, take: str
) -> None:
    """A keeps the records after its head (priority 0); B enqueues at priority 5: A's next take
    is B's message, then A's run goes on in order (and then C's priority 1 first)."""
    _, (a, b, c), db, _ = procs
    for p in (5, 1):  # the priorities used before: no new priority marker below
        ok(a.call("enqueue", 0, f"warm{p}", p, 0.0, None, None))
        assert ok(a.call("dequeue", 0)) == f"warm{p}"
    for i in range(6):
        ok(a.call("enqueue", 0, f"low{i}", 0, 0.0, None, None))
    assert ok(a.call(take, 0)) == "low0"
    assert ok(a.call(take, 0)) == "low1"  # from the kept run
    ok(b.call("enqueue", 1, "high", 5, 0.0, None, None))
    assert ok(a.call(take, 0)) == "high"
    assert ok(a.call(take, 0)) == "low2"
    ok(c.call("enqueue", 0, "mid", 1, 0.0, None, None))
    assert [ok(a.call(take, 0)) for _ in range(4)] == ["mid", "low3", "low4", "low5"]
    st = fdbqueue.queue_stats(db, NAME)
    assert (st.ready, st.inflight, st.done) == ((0, 0, 10) if take == "dequeue" else (0, 8, 2))
    assert stored_counts(db) == {"ready": 0, "inflight": st.inflight, "delayed": 0}


# -- a seeded random walk against a model -----------------------------------------------------------


@dataclass
class Model:
    """What the queue holds, in the test's terms: payloads, their priority and their place."""

    info: dict[str, tuple[int, int]] = field(default_factory=dict)  # payload -> (priority, place)
    ready: set[str] = field(default_factory=set)
    inflight: dict[str, int] = field(default_factory=dict)  # payload -> the process holding it
    lost: dict[str, int] = field(default_factory=dict)  # leases purged under their holder
    delayed: set[str] = field(default_factory=set)
    dedup: dict[str, str] = field(default_factory=dict)  # dedup key -> the id of its message
    done: int = 0
    delivered: set[str] = field(default_factory=set)
    stopped: bool = False

    def head(self) -> str | None:
        """Highest priority first, then the oldest place (a nacked message keeps its own)."""
        info = self.info
        return min(self.ready, key=lambda x: (-info[x][0], info[x][1]), default=None)

    def head_where(self, header: str) -> str | None:
        """The first in :meth:`head`'s order whose header ``k`` is ``header``."""
        info = self.info
        match = [x for x in self.ready if header_of(x) == header]
        return min(match, key=lambda x: (-info[x][0], info[x][1]), default=None)

    def make_ready(self, payload: str, priority: int) -> None:
        self.info[payload] = (priority, len(self.info))
        self.ready.add(payload)

    def deliver(self, payload: str) -> None:
        assert payload not in self.delivered, f"{payload} delivered twice"
        self.delivered.add(payload)
        self.done += 1

    def clear(self) -> None:
        self.lost.update(self.inflight)
        self.ready, self.inflight, self.delayed, self.dedup = set(), {}, set(), {}


OPS = {
    "enqueue": 30,
    "dequeue": 12,
    "dequeue_tr": 10,
    "dequeue_abort": 4,
    "dequeue_where": 4,
    "enqueue_dequeue_tr": 4,
    "lease": 12,
    "lease_many": 4,
    "ack": 8,
    "ack_many": 3,
    "nack": 5,
    "purge": 1,
    "stop": 1,
    "start": 2,
    "recreate": 1,
}


def walk(procs: list[Proc], rng: random.Random, steps: int) -> Model:
    """``steps`` commands, each on a random process and handle, checked against the model."""
    m = Model()
    n = 0
    names, weights = list(OPS), list(OPS.values())
    i = h = 0
    for step in range(steps):
        op = rng.choices(names, weights)[0]
        if rng.random() < 0.4:  # else the same handle again: a kept run, used or found out of date
            i, h = rng.randrange(len(procs)), rng.randrange(2)
        p = procs[i]
        where = f"step {step}: process {i} handle {h} {op}"
        if op == "enqueue":
            n += 1
            payload = f"m{n}"
            priority = rng.choice((0, 0, 0, 1, 5))
            delay = 1000.0 if rng.random() < 0.1 else 0.0  # never due within the test
            ttl = 3600.0 if rng.random() < 0.2 else None
            dedup = f"k{rng.randrange(4)}" if rng.random() < 0.2 else None
            got = ok(p.call("enqueue", h, payload, priority, delay, ttl, dedup))
            if dedup is not None and dedup in m.dedup:
                assert got == m.dedup[dedup], where
                continue
            if dedup is not None:
                m.dedup[dedup] = got
            if delay:
                m.delayed.add(payload)
            else:
                m.make_ready(payload, priority)
        elif op in ("dequeue", "dequeue_tr", "dequeue_abort", "dequeue_where", "lease"):
            status, got = p.call(op, h)
            if m.stopped:
                assert status == "error" and "QueueStoppedError" in got, (where, got)
                continue
            assert status == "ok", (where, got)
            want = m.head_where("a") if op == "dequeue_where" else m.head()
            assert got == want, (where, got, want)
            if got is None or op == "dequeue_abort":
                continue
            m.ready.discard(got)
            if op == "lease":
                m.inflight[got] = i
            else:
                m.deliver(got)
        elif op == "lease_many":
            k = rng.randrange(2, 6)
            status, got = p.call(op, h, k)
            if m.stopped:
                assert status == "error" and "QueueStoppedError" in got, (where, got)
                continue
            assert status == "ok", (where, got)
            batch: list[str] = []
            for _ in range(k):
                x = m.head()
                if x is None:
                    break
                batch.append(x)
                m.ready.discard(x)
                m.inflight[x] = i
            assert got == batch, (where, got, batch)
        elif op == "ack_many":
            mine = sorted(x for x, holder in m.inflight.items() if holder == i)
            lost = sorted(x for x, holder in m.lost.items() if holder == i)
            if not mine and not lost:
                continue
            assert ok(p.call(op, h, mine + lost)) == mine, where  # the purged ones left out
            for x in mine:
                del m.inflight[x]
                m.deliver(x)
            for x in lost:
                del m.lost[x]
        elif op == "enqueue_dequeue_tr":
            if m.stopped:
                continue
            n += 1
            payload = f"m{n}"
            priority = rng.choice((0, 1, 5))
            got = ok(p.call(op, h, payload, priority))
            m.make_ready(payload, priority)
            assert got == m.head(), (where, got, m.head())
            m.ready.discard(got)
            m.deliver(got)
        elif op in ("ack", "nack"):
            mine = sorted(x for x, holder in m.inflight.items() if holder == i)
            lost = sorted(x for x, holder in m.lost.items() if holder == i)
            if lost and (not mine or rng.random() < 0.3):  # a lease purged under its holder
                del m.lost[lost[0]]
                assert ok(p.call(op, h, lost[0])) is False, where
                continue
            if not mine:
                continue
            x = rng.choice(mine)
            assert ok(p.call(op, h, x)) is True, where
            del m.inflight[x]
            if op == "ack":
                m.deliver(x)
            else:
                m.ready.add(x)  # back to its own place
        elif op == "purge":
            assert ok(p.call(op, h)) == len(m.ready) + len(m.inflight) + len(m.delayed), where
            m.clear()
        elif op in ("stop", "start"):
            ok(p.call(op, h))
            m.stopped = op == "stop"
        elif op == "recreate":
            ok(p.call(op, h))
            m.clear()
            m.done, m.stopped = 0, False
    return m


def check_stats(db: Any, m: Model) -> None:
    """``queue_stats`` as the model says, and as a fresh look at the stored keys says."""
    st = fdbqueue.queue_stats(db, NAME)
    want = {"ready": len(m.ready), "inflight": len(m.inflight), "delayed": len(m.delayed)}
    assert {"ready": st.ready, "inflight": st.inflight, "delayed": st.delayed} == want
    assert stored_counts(db) == want
    assert st.done == m.done


# FDBQUEUE_WALK_SEEDS=1-200 (a range) walks more seeds; FDBQUEUE_WALK_STEPS, longer walks.
_SEEDS = os.environ.get("FDBQUEUE_WALK_SEEDS", "1-3").partition("-")
SEEDS = range(int(_SEEDS[0]), int(_SEEDS[2] or _SEEDS[0]) + 1)
STEPS = int(os.environ.get("FDBQUEUE_WALK_STEPS", "500"))


@pytest.mark.parametrize("journal", [False, True], ids=["plain", "journaled"])
@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_walk_over_three_processes_keeps_every_message_once_in_order(
    tmp_path: Path, seed: int, journal: bool
) -> None:
    """Enqueues (priority, delay, TTL, dedup keys), dequeues on their own and in callers'
    transactions (some aborted, some after an enqueue of their own), leases, acks and nacks,
    purges, a dequeue stop and start, the queue destroyed and made again: each from one of
    three processes on one of its two handles. Every take returns what the model says is the
    head, nothing is delivered twice, and the counters end exact. A journaled queue's takes
    write their counters by adds, not as read: both."""
    with command_children(tmp_path, journal=journal) as (_, children, db, _):
        _walk_and_drain(children, db, seed)


def _walk_and_drain(children: list[Proc], db: Any, seed: int) -> None:
    m = walk(children, random.Random(seed), STEPS)
    check_stats(db, m)
    # Drain what is left from every process in turn: the rest, each once, in order.
    if m.stopped:
        ok(children[0].call("start", 0))
        m.stopped = False
    for x, holder in sorted(m.inflight.items()):
        assert ok(children[holder].call("ack", 0, x)) is True
        m.deliver(x)
    m.inflight.clear()
    turn = 0
    while True:
        got = ok(children[turn % 3].call("dequeue", turn % 2))
        turn += 1
        assert got == m.head(), (turn, got, m.head())
        if got is None:
            break
        m.ready.discard(got)
        m.deliver(got)
    check_stats(db, m)


# -- free-running processes, SIGKILLed mid-stream -----------------------------------------------------

PRODUCED = 1200  # messages, from two producers
ONE = (1).to_bytes(8, "little")


def priority_of(i: int) -> int:
    """Each message's priority, the same every time it is enqueued again."""
    return random.Random(i).choice((0, 0, 0, 1, 5))


def producer(url: str, errors: str, first: int, count: int) -> None:
    """Enqueue ``first..first+count``, each with a dedup key of its own: a producer started
    again after a SIGKILL enqueues every one again, and each is still one message."""
    child_stderr(errors)
    db: Any = fdbqueue.open(url)
    q = Queue(NAME)
    for i in range(first, first + count):
        ttl = 3600.0 if i % 5 == 0 else None
        q.enqueue(db, f"p{i}".encode(), priority=priority_of(i), ttl=ttl, dedup_key=f"p{i}")


def consumer(url: str, errors: str, seed: int) -> None:
    """Dequeue (alone or in a caller's transaction), or lease then ack or nack, at random, on
    two handles, until killed; sweeps now and then (the leases of killed consumers come back)."""
    child_stderr(errors)
    dbs = [fdbqueue.open(url), fdbqueue.open(url)]
    q = Queue(NAME)
    rng = random.Random(seed + os.getpid())
    swept = 0.0

    @fdbqueue.transactional
    def deq(tr: Any) -> bool:
        m = q.dequeue(tr)
        if m is not None:
            tr.add(b"app/" + m.payload, ONE)
        return m is not None

    @fdbqueue.transactional
    def ack(tr: Any, m: fdbqueue.Message) -> None:
        q.ack(tr, m)
        tr.add(b"app/" + m.payload, ONE)

    while True:
        db = dbs[rng.randrange(2)] if rng.random() < 0.2 else dbs[0]
        if time.monotonic() - swept > 0.3:
            q.sweep(db)
            swept = time.monotonic()
        if rng.random() < 0.5:
            got = deq(db)
        else:
            m = q.lease(db, lease_seconds=1.0)
            got = m is not None
            if m is not None:
                try:
                    if rng.random() < 0.15:
                        q.nack(db, m)
                    else:
                        ack(db, m)
                except LeaseError:  # ran out first (a slow turn): another takes it
                    pass
        if not got:
            time.sleep(0.01)


def test_processes_killed_mid_stream_lose_nothing_and_leave_the_counters_exact(tmp_path: Path) -> None:
    """Two producers and three consumers (dequeue, dequeue in a transaction with the
    application's write, lease + ack or nack) run free on one store while the test SIGKILLs
    a random one every 0.2-0.5 s and starts it again. Every message is consumed exactly once
    (the application's write in the consuming transaction counts 1 for each), and the counters
    end exact: nothing ready, in flight or delayed, ``done`` the number of messages."""
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    errors = tmp_path / "errors"
    errors.mkdir()
    db: Any = fdbqueue.open(url)
    fdbqueue.create_queue(db, NAME, max_deliveries=1000, lease_seconds=1.0)
    q = Queue(NAME)
    kids = Children("spawn", errors)
    half = PRODUCED // 2
    try:
        kids.start("producer", producer, url, str(errors), 0, half, may_finish=True)
        kids.start("producer", producer, url, str(errors), half, PRODUCED - half, may_finish=True)
        for seed in range(3):
            kids.start("consumer", consumer, url, str(errors), seed)
        rng = random.Random(7)
        start = time.monotonic()
        next_kill = start + rng.uniform(0.2, 0.5)
        while True:
            kids.check_alive()
            producing = [c for c in kids.children if c.role == "producer" and c.proc.exitcode != 0]
            if not producing and held(db, q) == (0, 0, 0):
                break
            assert time.monotonic() - start < 120, f"not drained: {held(db, q)}"
            if time.monotonic() >= next_kill:
                live = [c for c in kids.children if c.proc.is_alive()]
                if live:
                    victim = rng.choice(live)
                    kids.kill(victim)
                    kids.restart(victim)
                next_kill = time.monotonic() + rng.uniform(0.2, 0.5)
            time.sleep(0.02)
    finally:
        kids.stop()
    assert sum(kids.kills.values()) >= 3, kids.kills
    counts = {kv.key: kv.value for kv in db.get_range_startswith(b"app/")}
    assert {k for k, v in counts.items() if v != ONE} == set()  # none consumed twice
    assert len(counts) == PRODUCED  # none lost
    st = fdbqueue.queue_stats(db, NAME)
    assert (st.ready, st.inflight, st.delayed, st.done) == (0, 0, 0, PRODUCED)
    assert stored_counts(db) == {"ready": 0, "inflight": 0, "delayed": 0}
    assert_nothing_left(db, NAME)
    db.close()
