"""A head kept between transactions (``fdbqueue/ops/head.py``) and counters written as read
(``delivery.count_known``), against real OS processes: a take or an ack whose transaction
holds the store lock past another process's window (taken over: its commit fails), a process
SIGKILLed inside such a transaction, and time moving under a kept run (a delay coming due, a
lease and a TTL running out) with no commit in between.

The children (``tests/support/kept_children.py``) run commands sent over a pipe on two
database handles each: the test decides the interleaving.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from tests.support.kept_children import NAME, Children_, command_children, ok, stored_counts
from tests.support.processes import real_clock

pytestmark = pytest.mark.usefixtures(real_clock.__name__)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Children_]:
    with command_children(tmp_path) as got:
        yield got


@pytest.mark.parametrize("take", ["dequeue", "lease"])
def test_a_take_whose_commit_fails_after_a_takeover_leaves_its_kept_head_to_the_other_process(
    procs: Children_, take: str
) -> None:
    """A takes its head from its kept run in a caller's transaction and holds the store lock
    past B's window: B takes the lock over and takes that same message; A's commit fails
    (transaction_too_old) and its retry takes the next one. Nothing twice, the counters exact
    (they were written as read by B, and by A's retry, never from A's failed attempt)."""
    _, (a, b, _c), db, _ = procs
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


def test_time_moving_under_a_kept_run_in_another_process(procs: Children_) -> None:
    """While A keeps a run: B's delayed priority message comes due, A's own lease of a kept
    record runs out, and a kept record's TTL passes, with no commit in between. A's takes: the
    due message first, the expired lease back at its place, the expired record never."""
    _, (a, b, _c), db, _ = procs
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


def test_an_ack_whose_commit_fails_after_a_takeover_writes_no_counter(procs: Children_) -> None:
    """A acks in a caller's transaction (its counters written as the values read) and holds the
    store lock past B's window; B takes it over and acks its own lease; A's commit fails and
    its retry acks again: in flight and done exact, not what A's first attempt read."""
    _, (a, b, _c), db, _ = procs
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
    procs: Children_, take: str
) -> None:
    """A takes from its kept run in a caller's transaction and is SIGKILLed before it commits;
    B takes that message, a new process takes the next: nothing lost or doubled, counters
    exact."""
    _, (a, b, _c), db, start = procs
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
