"""Child processes that run queue commands sent over a pipe, for the tests of a head kept between
transactions (``tests/processes/test_kept_head_*.py``).

Each child opens two database handles of its own on the store and runs the commands the test
sends it, one at a time, so that the test decides the interleaving while the processes, their
handles and what each keeps (``fdbqueue/ops/head.py``) are real and separate.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fdbqueue
from fdbqueue import LeaseError, Queue
from fdbqueue.engines.sqlite import storelock

NAME = "jobs"


class _Abort(Exception):
    """Raised inside a caller's transaction to roll it back."""


# -- the child: commands on its own handles (module level: spawned processes import it) ----------


def serve(url: str, conn: Any, settings: dict[str, Any]) -> None:
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
            conn.send(("ok", _run(db, q, held, op, args, settings)))
        except Exception as exc:  # sent back: the test decides whether it was due
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
    for d in dbs:
        d.close()


def header_of(payload: str) -> str:
    """The header ``k`` of the message whose payload is ``payload``: "a" for one in three of
    ``m<n>`` (the number it ends with), "b" for the others."""
    digits = payload[len(payload.rstrip("0123456789")) :]
    return "a" if digits and int(digits) % 3 == 0 else "b"


def _payload(m: fdbqueue.Message | None) -> str | None:
    return None if m is None else m.payload.decode()


def _run(
    db: Any, q: Queue, held: dict[str, fdbqueue.Message], op: str, args: list[Any], settings: dict[str, Any]
) -> Any:
    if op == "enqueue":
        payload, priority, delay, ttl, dedup = args
        return q.enqueue(
            db,
            payload.encode(),
            priority=priority,
            delay=delay,
            ttl=ttl,
            dedup_key=dedup,
            headers={"k": header_of(payload)},
        )
    if op == "dequeue_where":  # by a filter: a message from the middle of the ready set
        return _payload(q.dequeue(db, where={"k": "a"}))
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
            q.enqueue(tr, payload.encode(), priority=priority, headers={"k": header_of(payload)})
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
        fdbqueue.create_queue(db, NAME, **settings)
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


#: What a test gets: the store's URL, the children, the test's own handle, and a way to start
#: another child.
Children_ = tuple[str, list[Proc], Any, Callable[[], Proc]]


@contextmanager
def command_children(tmp_path: Path, n: int = 3, **settings: Any) -> Iterator[Children_]:
    """``n`` spawned children on a new store ``tmp_path/q.db`` with queue NAME made (with
    ``settings``, and max_deliveries=1000 unless they say); stopped (asked, then SIGKILLed)
    at the end."""
    settings = {"max_deliveries": 1000, **settings}
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, NAME, **settings)
    ctx = multiprocessing.get_context("spawn")
    out: list[Proc] = []

    def start() -> Proc:
        mine, theirs = ctx.Pipe()
        p = ctx.Process(target=serve, args=(url, theirs, settings), daemon=True)
        p.start()
        proc = Proc(p, mine)
        out.append(proc)
        return proc

    for _ in range(n):
        start()
    try:
        yield url, out, db, start
    finally:
        for p in out:
            if p.proc.is_alive():
                with suppress(OSError):
                    p.conn.send(None)
                p.proc.join(5)
                if p.proc.is_alive():
                    os.kill(p.proc.pid, signal.SIGKILL)
                    p.proc.join(5)
        db.close()
