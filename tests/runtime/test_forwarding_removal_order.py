"""The leased forwarder's removal in a run's steady state leases the next batch before it writes
anything (runtime/leased.py ``_remove``), and its publication installs the next batch before
it publishes (``_publish``): each read then meets no write of its own transaction, so the
embedded engine keeps no sorted index of the transaction's writes (issue 30's ninth pass,
docs/performance.md). And the order changes no outcome: a batch in hand whose lease expired
during a stall is swept back by that lease and forwarded once, never twice."""

from __future__ import annotations

import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue
from fdbqueue.ops.txn import run_once


def _ids_at(db: fdbqueue.Database, name: str) -> list[str]:
    return [m.id for m in Queue(name).browse(db, limit=None)]


def _in_transit(src: fdbqueue.Database, dst: fdbqueue.Database) -> int:
    """Pending copies on the destination, tombstones and batch records on the source."""

    def count(db: fdbqueue.Database, tag: str) -> int:
        r = Queue("jobs").keys.q.range((tag,))
        return int(run_once(db, lambda t, _: len(t.get_range(r.start, r.stop, 1000))))

    return count(dst, "fp") + count(src, "ft") + count(src, "fh")


def _pair(where: str, tmp_path: Path, seed: int) -> tuple[fdbqueue.Database, fdbqueue.Database]:
    if where == "sim":
        a, b = (fdbqueue.open(f"sim://?seed={s}&faults=0") for s in (seed, seed + 1))
        return a, b
    return fdbqueue.open(f"sqlite:///{tmp_path}/src.db"), fdbqueue.open(f"sqlite:///{tmp_path}/dst.db")


@pytest.mark.parametrize("name", [None, "outbox-1"])
def test_a_removal_leases_the_next_batch_before_it_writes(tmp_path: Path, name: str | None) -> None:
    src, dst = _pair("sqlite", tmp_path, 0)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(50)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, name=name)
    inner = f._lease_in
    wrote_before: list[bool] = []

    def lease_in(t: Any, n: int) -> Any:
        wrote_before.append(bool(t._has_writes))  # the embedded engine's: a write made in t
        return inner(t, n)

    f._lease_in = lease_in  # type: ignore[method-assign]
    assert f.run().forwarded == 50
    assert _ids_at(dst, "jobs") == sent  # each once, in order
    # The four removals that lease a batch ahead (and, named, the first lease): none of them
    # after a write of its own transaction.
    assert len(wrote_before) >= 4
    assert not any(wrote_before), wrote_before


@pytest.mark.parametrize("name", [None, "outbox-1"])
def test_a_publication_installs_the_next_batch_before_it_writes(tmp_path: Path, name: str | None) -> None:
    src, dst = _pair("sqlite", tmp_path, 0)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(50)])
    f = Forwarder(src, "jobs", dst, "jobs", batch=10, name=name)
    inner = f._install_in
    wrote_before: list[bool] = []

    def install_in(t: Any, batch: Any, layer: Any, meta: Any) -> Any:
        if meta is not None:  # in a publication's transaction (else one of its own)
            wrote_before.append(bool(t._has_writes))
        return inner(t, batch, layer, meta)

    f._install_in = install_in  # type: ignore[method-assign]
    assert f.run().forwarded == 50
    assert _ids_at(dst, "jobs") == sent  # each once, in order
    assert len(wrote_before) >= 4  # the four batches installed by a publication
    assert not any(wrote_before), wrote_before


@pytest.mark.parametrize("where", ["sim", "sqlite"])
def test_a_batch_in_hand_expired_in_a_stall_is_swept_by_the_lease_ahead_and_forwarded_once(
    tmp_path: Path, where: str
) -> None:
    """A run held before its first removal past its lease, with nothing else at work on the
    source (no sweep, no consumer): the removal's own lease of the next batch finds the batch
    in hand expired and gives it back (its due check) before the ack looks at it; the ack then
    finds it lost, its copies are withdrawn, and it is forwarded later: each message once."""
    src, dst = _pair(where, tmp_path, 71)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(10)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=5, lease_seconds=0.2)
    inner, calls, results = a._remove, [], []
    at, go = threading.Event(), threading.Event()

    def held(*args: Any) -> Any:
        calls.append(args)
        if len(calls) == 1:
            at.set()
            go.wait(30)
        results.append(inner(*args))
        return results[-1]

    a._remove = held  # type: ignore[method-assign]
    out: list[object] = []
    thread = threading.Thread(target=lambda: out.append(a.run()))
    thread.start()
    assert at.wait(30)
    time.sleep(0.3)  # past the lease of the batch in hand
    go.set()
    thread.join(30)
    assert not thread.is_alive() and out and not isinstance(out[0], BaseException)
    assert calls[0][1] > 0  # that removal leased a batch ahead ...
    removed, ahead, _ = results[0]
    assert removed == [] and ahead  # ... and removed nothing of the batch in hand: lost
    for _ in range(50):  # what went back to the queue is forwarded by later runs
        if Queue("jobs").size(src) == 0 and fdbqueue.queue_stats(src, "jobs").inflight == 0:
            break
        a.run()
        time.sleep(0.05)
    arrived = _ids_at(dst, "jobs")
    assert Counter(arrived) == Counter(sent)  # each message once: none lost, none doubled
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
    assert _in_transit(src, dst) == 0  # the copies of the lost batch withdrawn
