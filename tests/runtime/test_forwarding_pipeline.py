"""The leased forwarder's run, pipelined: in its steady state one transaction per side per
batch (the source removes a batch and leases the next in one transaction, the destination
publishes a batch and installs the next in one), and every guarantee as before: nothing lost
or doubled, in order, the limit exact, a stop leaves nothing leased or in transit."""

from __future__ import annotations

from collections import Counter

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue
from fdbqueue.ops.txn import run_once
from tests.support.faults import ScriptedFaults


def _pair(seed: int) -> tuple[fdbqueue.Database, fdbqueue.Database]:
    return fdbqueue.open(f"sim://?seed={seed}&faults=0"), fdbqueue.open(f"sim://?seed={seed + 1}&faults=0")


def _ids_at(db: fdbqueue.Database, name: str) -> list[str]:
    return [m.id for m in Queue(name).browse(db, limit=None)]


def _in_transit(src: fdbqueue.Database, dst: fdbqueue.Database) -> int:
    """Pending copies on the destination, tombstones and batch records on the source."""

    def count(db: fdbqueue.Database, tag: str) -> int:
        r = Queue("jobs").keys.q.range((tag,))
        return int(run_once(db, lambda t, _: len(t.get_range(r.start, r.stop, 1000))))

    return count(dst, "fp") + count(src, "ft") + count(src, "fh")


@pytest.mark.parametrize("name", [None, "outbox-1"])
def test_a_run_commits_once_per_side_per_batch(name: str | None) -> None:
    src, dst = _pair(90)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(100)])
    counted = ScriptedFaults(src), ScriptedFaults(dst)
    for c in counted:
        c.arm([None] * 1000)  # each commit with writes takes one entry, and commits as it would
    stats = Forwarder(src, "jobs", dst, "jobs", batch=10, name=name, ack_queue="jobs.acks").run()
    assert stats.forwarded == 100
    src_commits, dst_commits = (c.drawn for c in counted)
    # 10 batches: one commit a batch on each side, and a few around them (the probe of the
    # store written and cleared; the first lease and install; the last removal's clean-up;
    # named, the look for a namesake's batches and the last, empty, lease write a receipt).
    # Unpipelined it was two a batch on each side: 23 (named 25) and 21.
    assert src_commits <= 10 + 4 + (2 if name else 0), src_commits
    assert dst_commits <= 10 + 2, dst_commits
    assert _ids_at(dst, "jobs") == sent  # each once, in order
    acks = [m.json()["id"] for m in Queue("jobs.acks").browse(src, limit=None)]
    assert Counter(acks) == Counter(sent)
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
    assert _in_transit(src, dst) == 0


def test_a_stopped_run_leaves_no_batch_leased_ahead() -> None:
    src, dst = _pair(92)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(50)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=10)
    seen: list[int] = []

    def progress(stats: fdbqueue.ForwardStats) -> None:
        seen.append(stats.forwarded)
        f.stop()  # after the first batch: the one leased ahead of it is finished, not left

    stats = f.run(progress=progress)
    assert seen and stats.forwarded in (10, 20)
    assert _ids_at(dst, "jobs") == sent[: stats.forwarded]
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (50 - stats.forwarded, 0)  # nothing leased ahead
    assert _in_transit(src, dst) == 0


def test_a_run_limit_counts_the_batch_leased_ahead() -> None:
    src, dst = _pair(94)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(50)])
    assert Forwarder(src, "jobs", dst, "jobs", batch=7).run(limit=23).forwarded == 23
    assert _ids_at(dst, "jobs") == sent[:23]
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (27, 0)
    assert _in_transit(src, dst) == 0


def test_a_run_into_a_small_queue_leases_ahead_only_what_fits() -> None:
    src, dst = _pair(96)
    fdbqueue.create_queue(dst, "jobs", max_size=15)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(40)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=10)
    assert f.run(limit=15).forwarded == 15
    assert _ids_at(dst, "jobs") == sent[:15]
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (25, 0)  # none leased for room the queue has not
    assert _in_transit(src, dst) == 0


@pytest.mark.parametrize("mid", ["01J0ABC", "a\x00b", "é\x00\x00ü", ""])
def test_transit_keys_are_the_tuple_layers(mid: str) -> None:
    """Built from cached prefixes and encoded elements, byte for byte what ``fdb.tuple``
    packs: a store written by an earlier version is read and cleared alike."""
    from fdbqueue.store import layout

    keys = Queue("jobs", root=("r\x00", 7)).keys
    assert layout.tomb_key(keys, "t\x00k", mid) == keys.q.pack(("ft", "t\x00k", mid))
    assert layout.pending_key(keys, "src", mid, "r.1") == keys.q.pack(("fp", "src", mid, "r.1"))
    for rest in [(), (mid,), (mid, "r.1")]:
        r = keys.q.range(("fp", "src", *rest))
        assert layout.pending_range(keys, "src", *rest) == (r.start, r.stop)


@pytest.mark.parametrize(("where", "nth"), [("_remove", 2), ("_publish", 1)])
def test_a_batch_leased_ahead_and_lost_to_a_stall_doubles_nothing(where: str, nth: int) -> None:
    """A run held, past its leases, at its second removal (the batch leased ahead by the
    first is installed, pending) or its first publication (that batch leased, not installed
    yet; the first removed, not published): a consumer of the source takes some of the batch
    leased ahead meanwhile; none is both consumed and forwarded, none is lost, and the
    stalled run withdraws its copies."""
    import threading
    import time

    src, dst = _pair(98)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(10)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=5, lease_seconds=0.2)
    inner, calls = getattr(a, where), []
    at, go = threading.Event(), threading.Event()

    def held(*args: object) -> object:
        calls.append(1)
        if len(calls) == nth:
            at.set()
            go.wait(30)
        return inner(*args)

    setattr(a, where, held)
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(a.run()))
    thread.start()
    assert at.wait(30)
    time.sleep(0.3)  # past the lease of the batch leased ahead
    Queue("jobs").sweep(src)
    consumed = [m.id for m in (Queue("jobs").dequeue(src) for _ in range(3)) if m is not None]
    assert len(consumed) == 3  # a consumer of the source takes part of it back
    go.set()
    thread.join(30)
    assert not thread.is_alive() and not isinstance(out[0], BaseException)
    a.run()
    arrived = _ids_at(dst, "jobs")
    assert not set(arrived) & set(consumed)  # none both consumed and forwarded
    assert Counter(arrived + consumed) == Counter(sent)  # and none lost
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
    assert _in_transit(src, dst) == 0
