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
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import LeaseError, Queue
from tests.support.processes import real_clock

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
        m = q.lease(db, lease_seconds=600.0)
        if m is not None:
            held[m.payload.decode()] = m
        return _payload(m)
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
    if op == "crash_dequeue":  # dequeue until killed
        while True:
            q.dequeue(db)
    raise AssertionError(op)


@dataclass
class Proc:
    proc: Any
    conn: Any

    def call(self, *cmd: Any) -> Any:
        self.conn.send(cmd)
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
