"""A head kept between transactions (``fdbqueue/ops/head.py``) and counters written as read
(``delivery.count_known``), against real OS processes sharing one store file.

Each child process runs commands sent over a pipe on two database handles of its own, so the
test decides the interleaving (seeded: a failure replays) while the processes, their handles
and their kept runs are real and separate. A plain-Python model of the queue says what every
command must return: each message delivered (dequeued or acked) exactly once, none lost, the
head always the highest priority then the oldest, and ``queue_stats`` exact at the end and
equal to a count of the stored keys. A child is also SIGKILLed mid-stream and replaced.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import LeaseError, Queue
from fdbqueue.engines.sqlite import storelock
from tests.support.processes import Children, assert_nothing_left, child_stderr, held, real_clock

pytestmark = pytest.mark.usefixtures(real_clock.__name__)

NAME = "jobs"


class _Abort(Exception):
    """Raised inside a caller's transaction to roll it back."""


# -- the child: commands on its own handles (module level: spawned processes import it) ----------


def serve(url: str, conn: Any) -> None:
    dbs = [fdbqueue.open(url), fdbqueue.open(url)]
    q = Queue(NAME)
    held: dict[str, fdbqueue.Message] = {}  # leases this process holds, by payload
    while True:
        cmd = conn.recv()
        if cmd is None:
            break
        op, h, *args = cmd
        db = dbs[h]
        try:
            conn.send(("ok", _run(db, q, held, op, args)))
        except Exception as exc:  # sent back: the test decides whether it was due
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    for d in dbs:
        d.close()


def _payload(m: fdbqueue.Message | None) -> str | None:
    return None if m is None else m.payload.decode()


def _run(db: Any, q: Queue, held: dict[str, fdbqueue.Message], op: str, args: list[Any]) -> Any:
    if op == "enqueue":
        payload, priority, delay, ttl, dedup = args
        return q.enqueue(db, payload.encode(), priority=priority, delay=delay, ttl=ttl, dedup_key=dedup)
    if op == "dequeue":
        return _payload(q.dequeue(db))
    if op == "dequeue_tr":

        @fdbqueue.transactional
        def deq(tr: Any) -> fdbqueue.Message | None:
            return q.dequeue(tr)

        return _payload(deq(db))
    if op == "dequeue_abort":  # a dequeue in a caller's transaction that then aborts

        @fdbqueue.transactional
        def deq_abort(tr: Any) -> None:
            m = q.dequeue(tr)
            raise _Abort(_payload(m))

        try:
            deq_abort(db)
        except _Abort as exc:
            return exc.args[0]
        raise AssertionError("not aborted")
    if op == "enqueue_dequeue_tr":  # an enqueue then a dequeue in one caller's transaction
        (payload, priority) = args

        @fdbqueue.transactional
        def both(tr: Any) -> fdbqueue.Message | None:
            q.enqueue(tr, payload.encode(), priority=priority)
            return q.dequeue(tr)

        return _payload(both(db))
    if op == "lease":
        m = q.lease(db, lease_seconds=args[0] if args else 600.0)
        if m is not None:
            held[m.payload.decode()] = m
        return _payload(m)
    if op == "lease_many":  # a worker's prefetch
        got = q.lease_many(db, args[0], lease_seconds=600.0)
        held.update((m.payload.decode(), m) for m in got)
        return [m.payload.decode() for m in got]
    if op == "ack_many":  # in one transaction; those whose lease is gone are left out
        return sorted(m.payload.decode() for m in q.ack_many(db, [held.pop(x) for x in args[0]]))
    if op == "ack":
        try:
            q.ack(db, held.pop(args[0]))
            return True
        except LeaseError:
            return False
    if op == "nack":
        try:
            q.nack(db, held.pop(args[0]))
            return True
        except LeaseError:
            return False
    if op == "purge":
        return fdbqueue.purge_queue(db, NAME)
    if op == "stop":
        fdbqueue.set_state(db, NAME, dequeue=False)
        return None
    if op == "start":
        fdbqueue.set_state(db, NAME, dequeue=True)
        return None
    if op == "recreate":  # destroyed and made again under the same name
        fdbqueue.destroy_queue(db, NAME)
        fdbqueue.create_queue(db, NAME, max_deliveries=1000)
        return None
    if op == "window":  # this process, waiting for the store lock, takes it over sooner
        storelock.WINDOW = args[0]
        return None
    if op in ("dequeue_slow", "lease_slow"):  # a caller's transaction that holds the lock long
        seen: list[str | None] = []

        @fdbqueue.transactional
        def slow(tr: Any) -> str | None:
            m = q.dequeue(tr) if op == "dequeue_slow" else q.lease(tr, 600.0)
            seen.append(_payload(m))
            if len(seen) == 1:
                time.sleep(args[0])  # past another process's window: it takes the lock over
            if m is not None and op == "lease_slow":
                held[m.payload.decode()] = m
            return _payload(m)

        return slow(db), seen
    if op == "ack_slow":  # an ack in a caller's transaction that holds the lock long
        m = held.pop(args[0])
        attempts = []

        @fdbqueue.transactional
        def slow_ack(tr: Any) -> None:
            q.ack(tr, m)
            attempts.append(1)
            if len(attempts) == 1:
                time.sleep(args[1])

        slow_ack(db)
        return len(attempts)
    raise AssertionError(op)


@dataclass
class Proc:
    proc: Any
    conn: Any

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
        return self.answer()

    def answer(self) -> tuple[str, Any]:
        assert self.conn.poll(60), "a child did not answer within 60 s"
        status, value = self.conn.recv()
        return (status, value)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[tuple[str, list[Proc], Any]]:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, NAME, max_deliveries=1000)
    ctx = multiprocessing.get_context("spawn")
    out: list[Proc] = []

    def start() -> Proc:
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=serve, args=(url, theirs), daemon=True)
        p.start()
        proc = Proc(p, mine)
        out.append(proc)
        return proc

    for _ in range(3):
        start()
    try:
        yield url, out, (db, start)
    finally:
        for p in out:
            if p.proc.is_alive():
                try:
                    p.conn.send(None)
                except OSError:
                    pass
                p.proc.join(5)
                if p.proc.is_alive():
                    os.kill(p.proc.pid, signal.SIGKILL)
                    p.proc.join(5)
        db.close()


def ok(reply: tuple[str, Any]) -> Any:
    status, value = reply
    assert status == "ok", value
    return value


def stored_counts(db: Any) -> dict[str, int]:
    """What a fresh look at the keys finds: ready records, leases, delayed records."""
    keys = Queue(NAME).keys
    return {
        "ready": len(db.get_range(*keys.ready_range())),
        "inflight": len(db.get_range_startswith(keys.q.pack(("f",)))),
        "delayed": len(db.get_range_startswith(keys.q.pack(("d",)))),
    }


# -- found by this review: a queue destroyed and made again under its name ------------------------


def test_a_queue_destroyed_and_made_again_in_another_process_drops_the_kept_run(
    procs: tuple[str, list[Proc], Any],
) -> None:
    """Process A dequeues (and keeps the records after its head); process B destroys the queue,
    makes it again and puts as many messages back, then takes one: the ready and wake counters
    start again from nothing and end where A's kept run expects them. A must not hand out a
    message of the destroyed queue, nor write counters from it."""
    _, (a, b, _c), (db, _) = procs
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
    procs: tuple[str, list[Proc], Any], take: str
) -> None:
    """A keeps the records after its head (priority 0); B enqueues at priority 5: A's next take
    is B's message, then A's run goes on in order (and then C's priority 1 first)."""
    _, (a, b, c), (db, _) = procs
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


@pytest.mark.parametrize("take", ["dequeue", "lease"])
def test_a_take_whose_commit_fails_after_a_takeover_leaves_its_kept_head_to_the_other_process(
    procs: tuple[str, list[Proc], Any], take: str
) -> None:
    """A takes its head from its kept run in a caller's transaction and holds the store lock
    past B's window: B takes the lock over and takes that same message; A's commit fails
    (transaction_too_old) and its retry takes the next one. Nothing twice, the counters exact
    (they were written as read by B, and by A's retry, never from A's failed attempt)."""
    _, (a, b, _c), (db, _) = procs
    for i in range(6):
        ok(a.call("enqueue", 0, f"m{i}", 0, 0.0, None, None))
    assert ok(a.call(take, 0)) == "m0"  # A keeps m1...
    ok(b.call("window", 0, 0.3))
    a.conn.send((f"{take}_slow", 0, 2.0))
    time.sleep(0.5)  # A holds the lock, asleep in its transaction
    assert ok(b.call(take, 0)) == "m1"  # B waited out its window and took the lock over
    final, seen = ok(a.answer())
    assert seen[0] == "m1" and final == "m2", seen  # the first attempt's take did not land
    assert ok(b.call(take, 1)) == "m3"
    st = fdbqueue.queue_stats(db, NAME)
    want = (2, 0, 4) if take == "dequeue" else (2, 4, 0)
    assert (st.ready, st.inflight, st.done) == want
    assert stored_counts(db) == {"ready": 2, "inflight": want[1], "delayed": 0}


def test_time_moving_under_a_kept_run_in_another_process(procs: tuple[str, list[Proc], Any]) -> None:
    """While A keeps a run: B's delayed priority message comes due, A's own lease of a kept
    record runs out, and a kept record's TTL passes, with no commit in between. A's takes: the
    due message first, the expired lease back at its place, the expired record never."""
    _, (a, b, _c), (db, _) = procs
    ok(a.call("enqueue", 0, "warm", 5, 0.0, None, None))  # priority 5's marker made before
    assert ok(a.call("dequeue", 0)) == "warm"
    for i in range(6):
        ok(a.call("enqueue", 0, f"low{i}", 0, 0.0, 2.0 if i == 3 else None, None))
    assert ok(a.call("dequeue", 0)) == "low0"
    assert ok(a.call("lease", 0, 1.0)) == "low1"  # from the kept run
    ok(b.call("enqueue", 1, "late", 5, 1.0, None, None))
    time.sleep(2.5)
    got = [ok(a.call("dequeue", 0)) for _ in range(6)]
    assert got == ["late", "low1", "low2", "low4", "low5", None]
    st = fdbqueue.queue_stats(db, NAME)
    assert (st.ready, st.inflight, st.delayed, st.done, st.expired) == (0, 0, 0, 7, 1)
    assert stored_counts(db) == {"ready": 0, "inflight": 0, "delayed": 0}


def test_an_ack_whose_commit_fails_after_a_takeover_writes_no_counter(procs: tuple[str, list[Proc], Any]) -> None:
    """A acks in a caller's transaction (its counters written as the values read) and holds the
    store lock past B's window; B takes it over and acks its own lease; A's commit fails and
    its retry acks again: in flight and done exact, not what A's first attempt read."""
    _, (a, b, _c), (db, _) = procs
    for i in range(3):
        ok(a.call("enqueue", 0, f"m{i}", 0, 0.0, None, None))
    assert ok(a.call("lease", 0)) == "m0"
    assert ok(b.call("lease", 0)) == "m1"
    ok(b.call("window", 0, 0.3))
    a.conn.send(("ack_slow", 0, "m0", 2.0))
    time.sleep(0.5)
    assert ok(b.call("ack", 0, "m1")) is True
    assert ok(a.answer()) == 2  # the first attempt did not land
    st = fdbqueue.queue_stats(db, NAME)
    assert (st.ready, st.inflight, st.done) == (1, 0, 2)
    assert stored_counts(db) == {"ready": 1, "inflight": 0, "delayed": 0}


@pytest.mark.parametrize("take", ["dequeue", "lease"])
def test_a_process_killed_inside_a_take_from_its_kept_run_leaves_the_counters_exact(
    procs: tuple[str, list[Proc], Any], take: str
) -> None:
    """A takes from its kept run in a caller's transaction and is SIGKILLed before it commits;
    B takes that message, a new process takes the next: nothing lost or doubled, counters
    exact."""
    _, (a, b, _c), (db, start) = procs
    for i in range(5):
        ok(a.call("enqueue", 0, f"m{i}", 0, 0.0, None, None))
    assert ok(a.call(take, 0)) == "m0"
    a.conn.send((f"{take}_slow", 0, 30.0))
    time.sleep(0.5)  # inside its transaction, the store lock held, its take not committed
    os.kill(a.proc.pid, signal.SIGKILL)
    a.proc.join(10)
    assert ok(b.call(take, 0)) == "m1"
    assert ok(start().call(take, 1)) == "m2"
    assert ok(b.call(take, 0)) == "m3"
    st = fdbqueue.queue_stats(db, NAME)
    want = (1, 0, 4) if take == "dequeue" else (1, 4, 0)
    assert (st.ready, st.inflight, st.done) == want
    assert stored_counts(db) == {"ready": 1, "inflight": want[1], "delayed": 0}


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
        elif op in ("dequeue", "dequeue_tr", "dequeue_abort", "lease"):
            status, got = p.call(op, h)
            if m.stopped:
                assert status == "error" and "QueueStoppedError" in got, (where, got)
                continue
            assert status == "ok", (where, got)
            assert got == m.head(), (where, got, m.head())
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
            want = []
            for _ in range(k):
                x = m.head()
                if x is None:
                    break
                want.append(x)
                m.ready.discard(x)
                m.inflight[x] = i
            assert got == want, (where, got, want)
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


@pytest.mark.parametrize("seed", SEEDS)
def test_a_random_walk_over_three_processes_keeps_every_message_once_in_order(
    procs: tuple[str, list[Proc], Any], seed: int
) -> None:
    """Enqueues (priority, delay, TTL, dedup keys), dequeues on their own and in callers'
    transactions (some aborted, some after an enqueue of their own), leases, acks and nacks,
    purges, a dequeue stop and start, the queue destroyed and made again: each from one of
    three processes on one of its two handles. Every take returns what the model says is the
    head, nothing is delivered twice, and the counters end exact."""
    _, children, (db, _) = procs
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
    db = fdbqueue.open(url)
    q = Queue(NAME)
    for i in range(first, first + count):
        ttl = 3600.0 if i % 5 == 0 else None
        q.enqueue(db, f"p{i}".encode(), priority=priority_of(i), ttl=ttl, dedup_key=f"p{i}")


@fdbqueue.transactional
def _done(tr: Any, payload: bytes) -> None:
    """The application's write, in the transaction that consumes the message: a second
    delivery of one message shows as a count of 2."""
    tr.add(b"app/" + payload, ONE)


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
    db = fdbqueue.open(url)
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
