"""Forwarding between two databases, exactly once: across SIGKILLs of the forwarder, injected
faults and outages of either side."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue, testing
from fdbqueue.ops.txn import run_once

CHILD = """
import sys, fdbqueue
src, dst = fdbqueue.open(sys.argv[1]), fdbqueue.open(sys.argv[2])
f = fdbqueue.Forwarder(
    src, "jobs", dst, "jobs", batch=int(sys.argv[3]), ack_queue="jobs.acks", lease_seconds=1.0,
    exclusive=sys.argv[4] == "exclusive",
)
print("ready", flush=True)
f.run(follow=True, install_signals=True)
"""


def _drain(db: fdbqueue.Database, name: str) -> list[str]:
    out = []
    while True:
        m = Queue(name).dequeue(db)
        if m is None:
            return out
        out.append(m.id if name == "jobs" else json.loads(m.payload)["id"])


@pytest.mark.slow
@pytest.mark.parametrize("how", ["leased", "exclusive"])
def test_every_message_arrives_once_across_twenty_sigkills(tmp_path: Path, how: str) -> None:
    src_url, dst_url = f"sqlite:///{tmp_path / 'src.db'}", f"sqlite:///{tmp_path / 'dst.db'}"
    src, dst = fdbqueue.open(src_url), fdbqueue.open(dst_url)
    rnd = random.Random(7)
    sent: list[str] = []
    received: list[str] = []
    env = {**os.environ, "PYTHONPATH": str(Path(fdbqueue.__file__).parent.parent)}
    for kill in range(20):
        child = subprocess.Popen(
            [sys.executable, "-c", CHILD, src_url, dst_url, str(rnd.choice([1, 7, 50])), how],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        sent += Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(rnd.randint(5, 60))])
        time.sleep(rnd.uniform(0.0, 0.3))
        received += _drain(dst, "jobs")  # a consumer on the destination meanwhile
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL, kill
    time.sleep(1.2)  # the killed forwarders' leases expire
    exclusive = how == "exclusive"
    f = Forwarder(src, "jobs", dst, "jobs", ack_queue="jobs.acks", lease_seconds=1.0, exclusive=exclusive)
    stats = f.run()
    received += _drain(dst, "jobs")
    assert sorted(received) == sorted(sent)  # every message once: none lost, none twice
    assert len(set(received)) == len(received)
    assert Queue("jobs").size(src) == 0 and fdbqueue.queue_stats(src, "jobs").inflight == 0
    acks = _drain(src, "jobs.acks")
    assert sorted(acks) == sorted(sent)  # one acknowledgement per message
    assert stats.forwarded >= 0


def _left(src: fdbqueue.Database) -> bool:
    """Whether the source still holds a message, ready or leased; asked again while the
    outage thread has the source down (the question is the test's, not the forwarder's)."""
    while True:
        try:
            return bool(Queue("jobs").size(src) or fdbqueue.queue_stats(src, "jobs").inflight)
        except fdbqueue.ClusterUnavailableError:
            time.sleep(0.01)


@pytest.mark.parametrize("exclusive", [False, True])
def test_faults_and_outages_of_either_side(exclusive: bool) -> None:
    src = fdbqueue.open("sim://?seed=11&faults=0.05")
    dst = fdbqueue.open("sim://?seed=12&faults=0.05")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(150)])
    stop = threading.Event()

    def outages() -> None:
        while not stop.is_set():
            for db in (dst, src):
                with testing.outage(db):
                    time.sleep(0.03)
                time.sleep(0.03)

    t = threading.Thread(target=outages)
    t.start()
    try:
        f = Forwarder(
            src, "jobs", dst, "jobs", batch=20, ack_queue="jobs.acks", lease_seconds=0.5, exclusive=exclusive
        )
        stats = f.run()
        while _left(src):
            time.sleep(0.6)  # leases of batches interrupted by an outage come back
            stats = f.run()
    finally:
        stop.set()
        t.join()
    assert stats.retried > 0  # the outages were met
    assert sorted(m.id for m in Queue("jobs").browse(dst, limit=None)) == sorted(sent)
    assert sorted(_drain(src, "jobs.acks")) == sorted(sent)


def test_the_journal_and_the_stats() -> None:
    src, dst = fdbqueue.open("memory://"), fdbqueue.open("memory://")
    fdbqueue.create_queue(src, "jobs", journal=True)
    fdbqueue.create_queue(dst, "in", journal=True)
    ids = Queue("jobs").enqueue_many(src, [b"1", b"2", b"3"])
    stats = fdbqueue.forward(src, "jobs", dst, "in", batch=2)
    assert (stats.forwarded, stats.skipped) == (3, 0) and stats.lag is not None
    assert [m.id for m in Queue("in").browse(dst)] == ids  # ids and order kept
    assert [e.op for e in fdbqueue.history(src, ids[0])] == ["enqueue", "lease", "forward_out"]
    arrived = fdbqueue.history(dst, ids[0])
    assert [(e.op, e.details) for e in arrived] == [("forward_in", {"origin": "jobs"})]
    with pytest.raises(fdbqueue.QueueError, match="batch"):
        Forwarder(src, "jobs", dst, "in", batch=0)
    with pytest.raises(fdbqueue.QueueError, match="exclusive must be True or False"):
        Forwarder(src, "jobs", dst, "in", exclusive="no")  # type: ignore[arg-type]


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    a, b = f"sqlite:///{tmp_path / 'a.db'}", f"sqlite:///{tmp_path / 'b.db'}"
    assert main(["--url", a, "enqueue", "jobs", "x", "y"]) == 0
    capsys.readouterr()
    argv = ["forward", "--from", a, "--queue", "jobs", "--to", b, "--to-queue", "in", "--ack-queue", "acks"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("forwarded 2 (already there: 0, retried: 0")
    assert Queue("in").size(fdbqueue.open(b)) == 2
    assert Queue("acks").size(fdbqueue.open(a)) == 2
    assert main(["forward", "--from", a, "--queue", "jobs"]) == 2
    assert "--to" in capsys.readouterr().err
    assert main(["forward", "--from", "bogus://x", "--queue", "jobs", "--to", b]) == 2
    assert main(["--url", a, "enqueue", "jobs", "k1", "k2", "--header", "kind=k"]) == 0
    assert main(["--url", a, "enqueue", "jobs", "other"]) == 0
    capsys.readouterr()
    argv = ["forward", "--from", a, "--queue", "jobs", "--to", b, "--where", "kind=k", "--exclusive"]
    assert main(argv) == 0
    assert capsys.readouterr().out.startswith("forwarded 2 ")
    assert [m.payload for m in Queue("jobs").browse(fdbqueue.open(b), limit=None)] == [b"k1", b"k2"]
    assert [m.payload for m in Queue("jobs").browse(fdbqueue.open(a), limit=None)] == [b"other"]


def test_where_forwards_only_matching_messages_and_leaves_the_rest_untouched(
    capsys: pytest.CaptureFixture[str],
) -> None:
    src, dst = fdbqueue.open("sim://?seed=3&faults=0"), fdbqueue.open("sim://?seed=4&faults=0")
    q = Queue("jobs")
    for i in range(30):
        q.enqueue(src, b"m%d" % i, headers={"kind": "a" if i % 3 == 0 else "b"})
    stats = fdbqueue.forward(src, "jobs", dst, "jobs", batch=4, where={"kind": "a"}, progress=True)
    assert stats.forwarded == 10
    assert [m.payload for m in q.browse(dst, limit=None)] == [b"m%d" % i for i in range(0, 30, 3)]
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (20, 0)
    assert all(m.deliveries == 0 for m in q.browse(src, limit=None))  # never leased
    assert "forwarded 10" in capsys.readouterr().err
    with pytest.raises(fdbqueue.QueueError, match="where"):
        fdbqueue.forward(src, "jobs", dst, "jobs", where={1: "a"})  # type: ignore[dict-item]
    with pytest.raises(fdbqueue.QueueError, match="where"):
        q.lease_many(src, 1, where=["kind"])  # type: ignore[arg-type]


def test_an_exclusive_forwarder_keeps_order_and_warns_when_another_consumer_takes_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    src, dst = fdbqueue.open("sim://?seed=5&faults=0"), fdbqueue.open("sim://?seed=6&faults=0")
    q = Queue("jobs")
    sent = [b"m%02d" % i for i in range(25)]
    for p in sent:
        q.enqueue(src, p)
    q.enqueue(src, b"later", delay=0.3)
    f = Forwarder(src, "jobs", dst, "jobs", batch=4, exclusive=True)
    assert f.run().forwarded == 25
    assert [m.payload for m in q.browse(dst, limit=None)] == sent  # in order, across batches
    time.sleep(0.4)
    assert f.run().forwarded == 26  # a sweep made the delayed one ready (the stats add up)
    assert [m.payload for m in q.browse(dst, limit=None)][-1] == b"later"
    # The forwarder must be the queue's only consumer: one taken between install and removal
    # was forwarded and consumed both, and is reported.
    q.enqueue(src, b"contested")
    batch = run_once(src, lambda t, _: f._peek(t))
    f._install([r.message for r in batch])
    assert q.dequeue(src) is not None
    with caplog.at_level(logging.WARNING, logger="fdbqueue.runtime.forwarding"):
        done, _ = f._send_away(batch)
    assert done == [] and "taken by another consumer" in caplog.text
