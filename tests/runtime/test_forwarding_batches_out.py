"""A run's batches while they are out (leased on the source, pending on the destination, or
removed and not yet published) meet what else the source sees: a purge, and a namesake
taking over after a crash at each step of the steady state (a batch in hand and the next one
leased ahead). Between two embedded stores, where a forward's cost is counted
(docs/performance.md). Each message arrives once or not at all, never both purged and
forwarded, and nothing stays in transit: what any cheaper lease of a run's batches on the
source must keep (docs/forwarding.md)."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Forwarder, Queue
from fdbqueue.ops.txn import run_once


def _pair(tmp_path: Path) -> tuple[fdbqueue.Database, fdbqueue.Database]:
    src = fdbqueue.open(f"sqlite:///{tmp_path / 'src.db'}")
    return src, fdbqueue.open(f"sqlite:///{tmp_path / 'dst.db'}")


def _ids_at(db: fdbqueue.Database, name: str) -> list[str]:
    return [m.id for m in Queue(name).browse(db, limit=None)]


def _in_transit(src: fdbqueue.Database, dst: fdbqueue.Database) -> int:
    """Pending copies on the destination, tombstones and batch records on the source."""

    def count(db: fdbqueue.Database, tag: str) -> int:
        r = Queue("jobs").keys.q.range((tag,))
        return int(run_once(db, lambda t, _: len(t.get_range(r.start, r.stop, 1000))))

    return count(dst, "fp") + count(src, "ft") + count(src, "fh")


def _hold(f: Forwarder, method: str, nth: int) -> tuple[threading.Event, threading.Event]:
    """Hold ``f`` at its ``nth`` call of ``method`` until the second event is set."""
    inner, calls = getattr(f, method), []
    at, go = threading.Event(), threading.Event()

    def held(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == nth:
            at.set()
            go.wait(30)
        return inner(*args)

    setattr(f, method, held)
    return at, go


# (where the run is held, which call; how many of the 10 sent, batch 5, were removed from the
# source before the purge and so arrive)
@pytest.mark.parametrize(
    ("where", "nth", "removed"),
    [
        ("_remove", 1, 0),  # the first batch installed, pending; nothing removed
        ("_publish", 1, 5),  # the first removed (its tombstone), the second leased ahead
        ("_remove", 2, 5),  # the first published, the second installed in that transaction
    ],
)
def test_a_purge_of_the_source_with_batches_out_forwards_what_was_removed_once(
    tmp_path: Path, where: str, nth: int, removed: int
) -> None:
    src, dst = _pair(tmp_path)
    fdbqueue.create_queue(dst, "jobs")
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(10)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=5, lease_seconds=60)
    at, go = _hold(a, where, nth)
    out: list[Any] = []
    thread = threading.Thread(target=lambda: out.append(a.run()))
    thread.start()
    assert at.wait(30)
    purged = fdbqueue.purge_queue(src, "jobs")  # every message of the source, leased or not
    assert purged == 10 - removed
    go.set()
    thread.join(30)
    assert not thread.is_alive() and out
    a.run()
    arrived = _ids_at(dst, "jobs")
    assert arrived == sent[:removed]  # what left the source with its tombstone, once; no more
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
    assert fdbqueue.queue_stats(dst, "jobs").ready == removed
    assert _in_transit(src, dst) == 0  # the purged batch's copies withdrawn


class Crash(Exception):
    """A forwarder dying at one of its steps (the step's transaction never runs)."""


@pytest.mark.parametrize(
    ("where", "nth"),
    [
        ("_install", 1),  # the first batch leased, nothing installed
        ("_remove", 1),  # installed, not removed
        ("_publish", 1),  # removed, the next leased ahead (recorded), neither published
        ("_remove", 2),  # the first published, the next installed with it
        ("_publish", 2),  # the second removed, nothing left to lease ahead
    ],
)
def test_a_namesake_finishes_a_run_killed_at_each_step_each_message_once(
    tmp_path: Path, where: str, nth: int
) -> None:
    src, dst = _pair(tmp_path)
    sent = Queue("jobs").enqueue_many(src, [b"m%d" % i for i in range(10)])
    a = Forwarder(src, "jobs", dst, "jobs", batch=5, lease_seconds=60, name="outbox-1")
    inner, calls = getattr(a, where), []

    def crash(*args: Any) -> Any:
        calls.append(1)
        if len(calls) == nth:
            raise Crash  # dies here, with its lease(s) out for another 60 s
        return inner(*args)

    setattr(a, where, crash)
    with pytest.raises(Crash):
        a.run()
    b = Forwarder(src, "jobs", dst, "jobs", batch=5, lease_seconds=60, name="outbox-1")
    b.run()  # takes the recorded batches over at once: no wait for the leases
    assert Counter(_ids_at(dst, "jobs")) == Counter(sent)  # each once
    left = fdbqueue.queue_stats(src, "jobs")
    assert (left.ready, left.inflight) == (0, 0)
    assert _in_transit(src, dst) == 0


def test_a_copy_becomes_the_item_the_named_tuple_makes() -> None:
    """``pending.as_item`` makes its Item without the NamedTuple's constructor: every field,
    in order (a field added to Item fails here, not in a publication)."""
    from fdbqueue.ops import pending
    from fdbqueue.types import ContentType, Item

    c = pending.Copy("m1", "ab.0", 123, ContentType.JSON.value, {"h": 1}, 7, None, None, False, 0, b"x", 5)
    it = pending.as_item(c, "src")
    want = Item("m1", it.rand, b"x", ContentType.JSON, 7, {"h": 1}, 0.0, None, None, fixed_id=True,
                origin="src", enqueued_us=123)  # fmt: skip
    assert it == want and type(it) is Item and len(it) == len(Item._fields)
