"""Forwarding, what a user expects of it: ``limit`` exact; a restarted forwarder of the same
``name`` resumes its predecessor's batches at once (a real process SIGKILLed mid-batch); two
live forwarders of one name double nothing; a forwarded message keeps every field."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue, QueueError
from fdbqueue.ops.txn import run_once

ENGINES = ["sqlite", "sim"]


def _pair(engine: str, tmp_path: Path, seed: int) -> tuple[fdbqueue.Database, fdbqueue.Database]:
    if engine == "sim":
        return fdbqueue.open(f"sim://?seed={seed}&faults=0"), fdbqueue.open(
            f"sim://?seed={seed + 1}&faults=0"
        )
    return fdbqueue.open(f"sqlite:///{tmp_path / 'src.db'}"), fdbqueue.open(
        f"sqlite:///{tmp_path / 'dst.db'}"
    )


def _ids_at(db: fdbqueue.Database, name: str) -> list[str]:
    return [m.id for m in Queue(name).browse(db, limit=None)]


def _count(db: fdbqueue.Database, tag: str) -> int:
    r = Queue("jobs").keys.q.range((tag,))
    return int(run_once(db, lambda t, _: len(t.get_range(r.start, r.stop, 1000))))


def _in_transit(src: fdbqueue.Database, dst: fdbqueue.Database) -> int:
    """Pending copies on the destination, tombstones and batch records on the source."""
    return _count(dst, "fp") + _count(src, "ft") + _count(src, "fh")


# -- limit ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("exclusive", [False, True])
def test_limit_is_exact_whatever_the_batch(engine: str, exclusive: bool, tmp_path: Path) -> None:
    src, dst = _pair(engine, tmp_path, 40)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(50)])
    assert fdbqueue.forward(src, "jobs", dst, "jobs", limit=5, exclusive=exclusive).forwarded == 5
    assert fdbqueue.forward(src, "jobs", dst, "jobs", limit=30, batch=20, exclusive=exclusive).forwarded == 30
    assert _ids_at(dst, "jobs") == sent[:35]  # the first ones, in order
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (15, 0)  # nothing else leased or taken
    assert fdbqueue.forward(src, "jobs", dst, "jobs", limit=0, exclusive=exclusive).forwarded == 0
    with pytest.raises(QueueError, match="limit"):
        fdbqueue.forward(src, "jobs", dst, "jobs", limit=-1)


def test_limit_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    Queue("jobs").enqueue_many(fdbqueue.open(a), [b"m%d" % i for i in range(30)])
    assert main(["forward", "--from", a, "--queue", "jobs", "--to", b, "--limit", "5"]) == 0
    assert capsys.readouterr().out.startswith("forwarded 5 ")
    assert main(["forward", "--from", a, "--queue", "jobs", "--to", b, "--limit", "7", "--exclusive"]) == 0
    assert capsys.readouterr().out.startswith("forwarded 7 ")
    assert Queue("jobs").size(fdbqueue.open(b)) == 12
    assert fdbqueue.queue_stats(fdbqueue.open(a), "jobs").ready == 18


# -- a named forwarder resumes its predecessor's batches ---------------------------------------

CHILD = """
import os, sys, time, fdbqueue
src, dst = fdbqueue.open(sys.argv[1]), fdbqueue.open(sys.argv[2])
f = fdbqueue.Forwarder(src, "jobs", dst, "jobs", batch=20, name="outbox-1", ack_queue="jobs.acks")
inner = getattr(f, sys.argv[3])
def held(*args):
    out = inner(*args)  # the step's transaction has committed: the parent kills us now
    print("at", sys.argv[3], flush=True)
    time.sleep(60)
    return out
setattr(f, sys.argv[3], held)
f.run()
"""


@pytest.mark.parametrize("after", ["_lease", "_install", "_remove"])
def test_a_named_forwarder_killed_mid_batch_is_resumed_at_once(tmp_path: Path, after: str) -> None:
    src_url, dst_url = f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'dst.db'}"
    src, dst = fdbqueue.open(src_url), fdbqueue.open(dst_url)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(30)])
    env = {**os.environ, "PYTHONPATH": str(Path(fdbqueue.__file__).parent.parent)}
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, src_url, dst_url, after], stdout=subprocess.PIPE, text=True, env=env
    )
    assert child.stdout is not None and child.stdout.readline().strip() == f"at {after}"
    child.send_signal(signal.SIGKILL)
    assert child.wait(30) == -signal.SIGKILL
    assert fdbqueue.queue_stats(src, "jobs").inflight + len(_ids_at(dst, "jobs")) <= 20  # mid-batch
    began = time.monotonic()
    stats = Forwarder(src, "jobs", dst, "jobs", batch=20, name="outbox-1", ack_queue="jobs.acks").run()
    assert time.monotonic() - began < 20  # at once: not after the killed one's 60-second lease
    assert Counter(_ids_at(dst, "jobs")) == Counter(sent)  # 0 lost, 0 doubled
    assert _ids_at(dst, "jobs") == sent  # and in order
    assert stats.forwarded == 30  # all of it by this run
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
    acks = [m.json()["id"] for m in Queue("jobs.acks").browse(src, limit=None)]
    assert Counter(acks) == Counter(sent)  # one acknowledgement each
    assert _in_transit(src, dst) == 0  # nothing left pending, no tombstone, no record


def test_without_a_name_a_restarted_forwarder_waits_for_the_lease(tmp_path: Path) -> None:
    src, dst = _pair("sim", tmp_path, 50)
    Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(30)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=20)
    a._install = _crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        a.step()
    assert Forwarder(src, "jobs", dst, "jobs", batch=20).run().forwarded == 10  # the 20 wait
    assert fdbqueue.queue_stats(src, "jobs").inflight == 20


class Crash(Exception):
    """A forwarder dying at one of its steps (the step's transaction never runs)."""


def _crash(*args: Any) -> Any:
    raise Crash


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["_install", "_remove", "_publish"])
def test_a_named_forwarder_dying_at_any_step_is_resumed_by_the_next(
    engine: str, where: str, tmp_path: Path
) -> None:
    src, dst = _pair(engine, tmp_path, 60)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(30)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=8, name="outbox-1")
    a.step()  # one batch forwarded: its record is cleared later
    setattr(a, where, _crash)
    with pytest.raises(Crash):
        a.step()
    b = Forwarder(src, "jobs", dst, "jobs", batch=8, name="outbox-1")
    assert b.run().forwarded == 22
    assert _ids_at(dst, "jobs") == sent  # each once, in order
    assert fdbqueue.queue_stats(src, "jobs").inflight == 0 and _in_transit(src, dst) == 0
    # Another name, or none, does not touch outbox-1's batches.
    Queue("jobs").enqueue_many(src, [b"n%d" % i for i in range(4)])
    c = Forwarder(src, "jobs", dst, "jobs", batch=8, name="outbox-1")
    c._install = _crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        c.step()
    assert Forwarder(src, "jobs", dst, "jobs", name="outbox-2").run().forwarded == 0
    assert Forwarder(src, "jobs", dst, "jobs", name="outbox-1").run().forwarded == 4


class Stall:
    """Holds a forwarder at one of its steps (its first call of ``method``) until released."""

    def __init__(self, f: Forwarder, method: str) -> None:
        self.at, self.go = threading.Event(), threading.Event()
        inner = getattr(f, method)
        self.out: list[object] = []

        def held(*args: Any) -> Any:
            if not self.go.is_set():
                self.at.set()
                self.go.wait(30)
            return inner(*args)

        def run() -> None:
            try:
                self.out.append(f.run())
            except BaseException as exc:  # reported by the test
                self.out.append(exc)

        setattr(f, method, held)
        self.thread = threading.Thread(target=run)
        self.thread.start()
        assert self.at.wait(30)

    def release(self) -> None:
        self.go.set()
        self.thread.join(30)
        assert not self.thread.is_alive()


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("where", ["_install", "_remove", "_publish"])
def test_two_live_forwarders_of_one_name_double_nothing(engine: str, where: str, tmp_path: Path) -> None:
    src, dst = _pair(engine, tmp_path, 70)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(25)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=10, name="outbox-1", ack_queue="jobs.acks")
    stall = Stall(a, where)  # a holds a batch, alive, within its lease
    b = Forwarder(src, "jobs", dst, "jobs", batch=10, name="outbox-1", ack_queue="jobs.acks")
    assert b.step() == 10  # takes a's batch over and forwards it (its tombstones still there)
    stall.release()  # a goes on with the batch b finished, and forwards the rest
    assert not any(isinstance(o, BaseException) for o in stall.out), stall.out
    # b's record of the batch it leased anew: a left it to b. (A batch a had removed already
    # is recorded the same by both: a clears it once published.)
    assert _count(src, "fh") == (where != "_publish")
    a.run()
    b.run()
    assert Counter(_ids_at(dst, "jobs")) == Counter(sent)  # each once
    acks = [m.json()["id"] for m in Queue("jobs.acks").browse(src, limit=None)]
    assert Counter(acks) == Counter(sent)
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
    assert _in_transit(src, dst) == 0


def test_a_name_is_checked_and_is_on_the_command_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fdbqueue.cli import main

    src, dst = fdbqueue.open("memory://"), fdbqueue.open("memory://")
    for bad in ("", 7, "x" * 300):
        with pytest.raises(QueueError, match="name"):
            Forwarder(src, "jobs", dst, "jobs", name=bad)  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="name"):
        Forwarder(src, "jobs", dst, "jobs", name="x", exclusive=True)  # no leases: nothing to resume
    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    adb = fdbqueue.open(a)
    Queue("jobs").enqueue_many(adb, [b"m%d" % i for i in range(6)])
    f = Forwarder(adb, "jobs", fdbqueue.open(b), "jobs", batch=4, name="svc")
    f._install = _crash  # type: ignore[method-assign]
    with pytest.raises(Crash):
        f.step()
    assert main(["forward", "--from", a, "--queue", "jobs", "--to", b, "--name", "svc"]) == 0
    assert capsys.readouterr().out.startswith("forwarded 6 ")


# -- every field kept -------------------------------------------------------------------------


@pytest.mark.parametrize("engine", ENGINES)
@pytest.mark.parametrize("exclusive", [False, True])
def test_a_forwarded_message_keeps_every_field(engine: str, exclusive: bool, tmp_path: Path) -> None:
    src, dst = _pair(engine, tmp_path, 80)
    q = Queue("jobs")
    ids = [
        q.enqueue(src, b"plain"),
        q.enqueue(src, {"json": 1}, priority=5, headers={"k": "v", "n": 2}, ttl=3600.0),
        q.enqueue(src, "text", priority=-2, headers={"a": "b"}),
        q.enqueue(src, b"x" * 25_000, ttl=600.0),  # chunked
    ]
    before = {i: q.get(src, i) for i in ids}
    time.sleep(0.05)  # a forward later: the enqueue time is the producer's, not the forwarder's
    assert fdbqueue.forward(src, "jobs", dst, "jobs", exclusive=exclusive).forwarded == 4
    for i in ids:
        b, a = before[i], q.get(dst, i)
        assert a is not None and b is not None
        assert (a.id, a.payload, a.headers, a.priority, a.content_type) == (
            b.id,
            b.payload,
            b.headers,
            b.priority,
            b.content_type,
        )
        assert a.enqueued_at == b.enqueued_at  # exactly
        assert a.deliveries == 0  # as documented: deliveries start over at the destination
        if b.expires_at is None:
            assert a.expires_at is None
        else:  # the TTL left, carried by the wall clock between two databases
            assert a.expires_at == pytest.approx(b.expires_at, abs=0.05)
