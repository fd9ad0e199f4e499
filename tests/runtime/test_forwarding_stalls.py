"""Forwarding that must neither delete nor double: a queue forwarded into itself is refused; a
leased forwarder stalled past its lease, while another forwarder or a consumer shares the
source, installs nothing twice; a full destination makes the forwarder wait, and a batch
larger than the destination's ``max_size`` is split to fit."""

from __future__ import annotations

import importlib.util
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue, QueueError
from fdbqueue.ops.txn import run_once
from tests.support import ROOT

# -- a queue forwarded into itself ------------------------------------------------------------


def test_forwarding_a_queue_into_itself_is_refused_on_every_engine(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fdbqueue.cli import main

    url = f"sqlite:///{tmp_path / 'a.db'}"
    db = fdbqueue.open(url)
    ids = Queue("jobs").enqueue_many(db, [b"m%d" % i for i in range(10)])
    # Two handles of one file, the same handle, a second path to the same file: one store.
    (tmp_path / "link").symlink_to(tmp_path)
    for other in (fdbqueue.open(url), db, fdbqueue.open(f"sqlite:///{tmp_path / 'link' / 'a.db'}")):
        with pytest.raises(QueueError, match="into itself"):
            fdbqueue.forward(db, "jobs", other, "jobs")
        with pytest.raises(QueueError, match="into itself"):
            Forwarder(db, "jobs", other, "jobs", exclusive=True).run()
    assert [m.id for m in Queue("jobs").browse(db, limit=None)] == ids  # untouched
    assert main(["forward", "--from", url, "--queue", "jobs", "--to", url]) == 2  # as `move jobs jobs`
    assert "into itself" in capsys.readouterr().err
    assert Queue("jobs").size(db) == 10
    mem = fdbqueue.open("memory://")
    Queue("jobs").enqueue(mem, b"x")
    with pytest.raises(QueueError, match="into itself"):
        fdbqueue.forward(mem, "jobs", mem, "jobs")
    # Another queue of the same store, or the same name under another root, is another queue.
    assert fdbqueue.forward(db, "jobs", fdbqueue.open(url), "other").forwarded == 10
    assert Queue("other").size(db) == 10
    assert Forwarder(db, "other", db, "other", dst_root=("elsewhere",)).run().forwarded == 10


# -- stalls past the lease ----------------------------------------------------------------------


class Stall:
    """Holds a forwarder at one of its steps (its first call of ``method``) until released."""

    def __init__(self, f: Forwarder, method: str) -> None:
        self.at, self.go = threading.Event(), threading.Event()
        inner = getattr(f, method)

        def held(*args: Any) -> Any:
            if not self.go.is_set():
                self.at.set()
                self.go.wait(30)
            return inner(*args)

        setattr(f, method, held)
        self.thread = threading.Thread(target=f.step)
        self.thread.start()
        assert self.at.wait(30)

    def release(self) -> None:
        self.go.set()
        self.thread.join(30)


def _ids_at(db: fdbqueue.Database, name: str) -> list[str]:
    return [m.id for m in Queue(name).browse(db, limit=None)]


def _in_transit(src: fdbqueue.Database, dst: fdbqueue.Database) -> int:
    """Pending copies on the destination and tombstones on the source (fdbqueue/ops/transit.py)."""
    n = 0
    for db, tag in ((dst, "fp"), (src, "ft")):
        r = Queue("jobs").keys.q.range((tag,))
        n += run_once(db, lambda t, _, r=r: len(t.get_range(r.start, r.stop, 1000)))
    return n


@pytest.mark.parametrize("where", ["_install", "_remove"])
def test_a_forwarder_stalled_past_its_lease_doubles_nothing(where: str) -> None:
    src, dst = fdbqueue.open("sim://?seed=21&faults=0"), fdbqueue.open("sim://?seed=22&faults=0")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(10)])
    a = Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2)
    stall = Stall(a, where)  # a has leased the batch, and stops (a GC pause, SIGSTOP)
    time.sleep(0.3)  # past its lease
    Queue("jobs").sweep(src)
    b = Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2)
    assert b.run().forwarded == 10  # another forwarder forwards it all
    stall.release()  # a goes on with the batch it leased
    a.run()
    b.run()
    arrived = _ids_at(dst, "jobs")
    assert Counter(arrived) == Counter(sent)  # each message once at the destination
    assert Queue("jobs").size(src) == 0 and fdbqueue.queue_stats(src, "jobs").inflight == 0
    assert _in_transit(src, dst) == 0  # the stalled forwarder withdrew its copies


@pytest.mark.parametrize("where", ["_install", "_remove"])
def test_a_message_consumed_at_the_source_during_a_stall_is_not_forwarded(where: str) -> None:
    src, dst = fdbqueue.open("sim://?seed=23&faults=0"), fdbqueue.open("sim://?seed=24&faults=0")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(10)])
    a = Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2)
    stall = Stall(a, where)
    time.sleep(0.3)
    Queue("jobs").sweep(src)
    consumed = [m.id for m in (Queue("jobs").dequeue(src) for _ in range(4)) if m is not None]
    assert len(consumed) == 4  # a consumer of the source takes some of a's batch back
    stall.release()
    a.run()
    arrived = _ids_at(dst, "jobs")
    assert not set(arrived) & set(consumed)  # none both consumed and forwarded
    assert Counter(arrived + consumed) == Counter(sent)  # and none lost
    assert _in_transit(src, dst) == 0


class Crash(Exception):
    """A forwarder dying at one of its steps (the step's transaction never runs)."""


@pytest.mark.parametrize("where", ["_remove", "_publish"])
def test_what_a_crashed_forwarder_left_is_finished_by_another(where: str) -> None:
    src, dst = fdbqueue.open("sim://?seed=29&faults=0"), fdbqueue.open("sim://?seed=30&faults=0")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(8)])
    a = Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2)

    def crash(*args: Any) -> Any:
        raise Crash

    setattr(a, where, crash)  # dies with its copies pending (and, at _publish, removed from the source)
    with pytest.raises(Crash):
        a.step()
    assert _ids_at(dst, "jobs") == []  # nothing visible yet
    time.sleep(0.3)  # a lease later
    b = Forwarder(src, "jobs", dst, "jobs", lease_seconds=0.2)
    b.run()
    assert Counter(_ids_at(dst, "jobs")) == Counter(sent)  # each once, in either window
    assert _in_transit(src, dst) == 0  # published and cleared, or withdrawn
    assert Queue("jobs").size(src) == 0 and fdbqueue.queue_stats(src, "jobs").inflight == 0


# -- a full destination -------------------------------------------------------------------------


def test_a_full_destination_makes_the_forwarder_wait_and_a_batch_is_split_to_fit() -> None:
    src, dst = fdbqueue.open("sim://?seed=25&faults=0"), fdbqueue.open("sim://?seed=26&faults=0")
    fdbqueue.create_queue(dst, "jobs", max_size=3)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(12)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=100)  # a batch larger than max_size
    out: list[fdbqueue.ForwardStats | BaseException] = []

    def run() -> None:
        try:
            out.append(f.run())
        except BaseException as exc:  # reported below
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    received: list[str] = []
    deadline = time.monotonic() + 20
    while len(received) < 12 and time.monotonic() < deadline:
        assert Queue("jobs").size(dst) <= 3  # the bound holds throughout
        m = Queue("jobs").dequeue(dst)
        if m is None:
            assert not out, out  # not given up: waiting for room
            time.sleep(0.02)
            continue
        received.append(m.id)
    t.join(20)
    assert received == sent  # in order, each once
    assert len(out) == 1 and isinstance(out[0], fdbqueue.ForwardStats) and out[0].forwarded == 12


def test_a_forwarder_waiting_for_room_stops_when_told() -> None:
    src, dst = fdbqueue.open("sim://?seed=27&faults=0"), fdbqueue.open("sim://?seed=28&faults=0")
    fdbqueue.create_queue(dst, "jobs", max_size=2)
    Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(5)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=100)
    t = threading.Thread(target=f.run, kwargs={"follow": True})
    t.start()
    time.sleep(0.5)
    assert Queue("jobs").size(dst) == 2
    f.stop()
    t.join(5)
    assert not t.is_alive()
    assert fdbqueue.queue_stats(src, "jobs").ready == 3  # the rest left on the source


# -- real processes: two forwarders and a consumer, SIGSTOPs past the lease --------------------


@pytest.mark.slow
def test_two_forwarders_and_a_consumer_under_sigstops_past_the_lease(tmp_path: Path) -> None:
    path = ROOT / "scripts" / "forward_stalls.py"
    spec = importlib.util.spec_from_file_location("forward_stalls", path)
    assert spec is not None and spec.loader is not None
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    counts = harness.run(
        messages=400, stops=5, stop_seconds=1.3, lease=1.0, batch=20, seed=3, workdir=tmp_path
    )
    assert counts["lost"] == 0 and counts["doubled"] == 0, counts
    assert counts["consumed_and_forwarded"] == 0 and counts["left_on_source"] == 0, counts
    assert counts["pending_left"] == 0 and counts["tombstones_left"] == 0, counts
    assert counts["consumed_at_source"] > 0 and counts["forwarded"] > 0, counts  # all three took part
