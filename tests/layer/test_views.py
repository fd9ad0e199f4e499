"""Every view of a queue says the same thing, by database time, before any sweep.

A message whose TTL has passed is not ready (it is expired: moved aside by the next dequeue
or sweep); a delayed message that has come due is ready; a lease that has ended is not in
flight (it is ``lease_ended`` until a sweep or dequeue releases it). ``size``, ``empty``,
``peek``, ``nth``, ``queue_stats``, ``all_queue_stats``, ``browse``, ``fdbqueue list``, the
metrics and the dashboard's figures are compared on the same store with no sweep between the
change and the reads (database time is moved on with the layer's fake clock).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import cli
from fdbqueue.cli.queues import _cmd_list
from fdbqueue.engines.contract import Database
from fdbqueue.runtime.metrics import QueueCollector
from fdbqueue.store.clock import FakeClock, fake_clock
from fdbqueue.web.views import queue_detail
from tests.support.engines import engine_url

ENGINES = ["sqlite", "sim"]  # the embedded engine and FoundationDB's semantics


@pytest.fixture(params=ENGINES)
def url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    return engine_url(str(request.param), tmp_path)


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    try:
        yield database
    finally:
        database.close()


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with fake_clock() as c:
        yield c


def cli_list(db: Database, url: str, capsys: pytest.CaptureFixture[str]) -> dict[str, dict[str, Any]]:
    """``fdbqueue list --json``: run as a command on the embedded store, and on the in-process
    sim store (which another process cannot open) through the command's own function."""
    if url.startswith("sim:"):
        assert _cmd_list(db, argparse.Namespace(json=True)) == 0
    else:
        assert cli.main(["--url", url, "list", "--json"]) == 0
    return {row["name"]: row for row in json.loads(capsys.readouterr().out)}


def metric(db: Database, name: str, state: str) -> float:
    for family in QueueCollector(db).collect():
        if family.name == "fdbqueue_queue_messages":
            for s in family.samples:
                if s.labels == {"queue": name, "state": state}:
                    return float(s.value)
    raise AssertionError(f"no sample for {name} {state}")


def views(db: Database, url: str, capsys: pytest.CaptureFixture[str], name: str) -> dict[str, Any]:
    """What each view says of queue ``name``, read now, in separate transactions."""
    q = fdbqueue.Queue(name)
    st = fdbqueue.queue_stats(db, name)
    (every,) = [s for s in fdbqueue.all_queue_stats(db) if s.name == name]
    listed = cli_list(db, url, capsys)[name]
    dash = queue_detail(db, name)["stats"]
    peek = q.peek(db)
    return {
        "size": q.size(db),
        "empty": q.empty(db),
        "peek": None if peek is None else peek.payload,
        "nth": [m.payload for n in range(4) if (m := q.nth(db, n)) is not None],
        "browse": [m.payload for m in q.browse(db)],
        "stats": st,
        "all": every,
        "list": listed,
        "dashboard": dash,
        "metrics": {s: metric(db, name, s) for s in ("ready", "in_flight", "delayed")},
    }


def assert_agree(v: dict[str, Any], ready: list[bytes], *, inflight: int, delayed: int) -> None:
    n = len(ready)
    st = v["stats"]
    assert v["browse"] == ready, v["browse"]
    assert v["nth"] == ready[:4]
    assert v["peek"] == (ready[0] if ready else None)
    assert v["size"] == n and v["empty"] == (n == 0)
    assert (st.ready, st.inflight, st.delayed) == (n, inflight, delayed), st
    assert v["all"] == st
    assert {k: v["list"][k] for k in ("ready", "inflight", "delayed", "expired", "lease_ended")} == {
        "ready": n,
        "inflight": inflight,
        "delayed": delayed,
        "expired": st.expired,
        "lease_ended": st.lease_ended,
    }
    assert v["dashboard"] == dataclasses.asdict(st) | {
        "oldest_age": v["dashboard"]["oldest_age"]  # read at another moment: it grows
    }
    assert v["metrics"] == {"ready": n, "in_flight": inflight, "delayed": delayed}


def test_a_message_past_its_ttl_is_not_ready_in_any_view(
    db: Database, url: str, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"short", ttl=1.0)
    q.enqueue(db, b"long", ttl=60.0)
    q.enqueue(db, b"forever")
    assert_agree(views(db, url, capsys, "jobs"), [b"short", b"long", b"forever"], inflight=0, delayed=0)
    clock.advance(2.0)  # no sweep, no dequeue
    v = views(db, url, capsys, "jobs")
    assert_agree(v, [b"long", b"forever"], inflight=0, delayed=0)
    assert v["stats"].expired == 1
    assert v["stats"].exact
    # What a sweep then does agrees with what the views said.
    q.sweep(db)
    after = fdbqueue.queue_stats(db, "jobs")
    assert (after.ready, after.expired, after.delayed) == (2, 1, 0)


def test_every_message_expired_leaves_the_queue_empty_in_every_view(
    db: Database, url: str, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    q = fdbqueue.Queue("jobs")
    for i in range(3):
        q.enqueue(db, f"m{i}", ttl=1.0)
    clock.advance(2.0)
    v = views(db, url, capsys, "jobs")
    assert_agree(v, [], inflight=0, delayed=0)
    assert v["stats"].expired == 3
    assert q.dequeue(db) is None  # what the views said


def test_a_delayed_message_that_came_due_is_ready_in_every_view(
    db: Database, url: str, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"now")
    q.enqueue(db, b"soon", delay=1.0)
    q.enqueue(db, b"later", delay=60.0)
    q.enqueue(db, b"gone", delay=1.0, ttl=1.5)  # due, but its TTL passes too: expired
    assert_agree(views(db, url, capsys, "jobs"), [b"now"], inflight=0, delayed=3)
    clock.advance(2.0)
    v = views(db, url, capsys, "jobs")
    assert_agree(v, [b"now", b"soon"], inflight=0, delayed=1)
    assert v["stats"].expired == 1
    q.sweep(db)
    after = fdbqueue.queue_stats(db, "jobs")
    assert (after.ready, after.delayed, after.expired) == (2, 1, 1)


def test_a_lease_that_ended_is_not_in_flight_in_any_view(
    db: Database, url: str, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"a")
    q.enqueue(db, b"b")
    q.enqueue(db, b"c")
    held = q.lease(db, lease_seconds=1.0)
    kept = q.lease(db, lease_seconds=60.0)
    assert held is not None and kept is not None
    assert_agree(views(db, url, capsys, "jobs"), [b"c"], inflight=2, delayed=0)
    clock.advance(2.0)
    v = views(db, url, capsys, "jobs")
    assert_agree(v, [b"c"], inflight=1, delayed=0)
    assert v["stats"].lease_ended == 1
    assert v["list"]["lease_ended"] == 1
    assert metric(db, "jobs", "lease_ended") == 1
    q.sweep(db)  # the sweep releases it: back to its place, ready
    after = fdbqueue.queue_stats(db, "jobs")
    assert (after.ready, after.inflight, after.lease_ended) == (2, 1, 0)


def test_peek_and_nth_see_past_expired_and_due_messages_in_a_callers_transaction(
    db: Database, clock: FakeClock
) -> None:
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"x1", ttl=1.0, priority=5)
    q.enqueue(db, b"a", priority=1)
    q.enqueue(db, b"x2", ttl=1.0, priority=1)
    q.enqueue(db, b"b", priority=1)
    q.enqueue(db, b"d", delay=1.0, priority=1)  # due: the tail of priority 1
    q.enqueue(db, b"c")
    clock.advance(2.0)

    @fdbqueue.transactional
    def read(tr: Any) -> tuple[Any, ...]:
        return (
            q.size(tr),
            q.empty(tr),
            [m.payload for n in range(6) if (m := q.nth(tr, n)) is not None],
            [m.payload for m in q.browse(tr)],
        )

    size, empty, nth, browsed = read(db)
    assert browsed == [b"a", b"b", b"d", b"c"]
    assert nth == browsed and size == 4 and not empty
    assert [q.dequeue(db).payload for _ in range(4)] == browsed  # type: ignore[union-attr]
    assert q.dequeue(db) is None


def test_the_oldest_ready_message_includes_a_delayed_one_that_came_due(
    db: Database, url: str, clock: FakeClock, capsys: pytest.CaptureFixture[str]
) -> None:
    """A due delayed message is ready in every view, so it is the oldest ready message too:
    its age from its enqueue time, as a sweep would leave it (stats, list, metrics)."""
    q = fdbqueue.Queue("dly")
    q.enqueue(db, b"later", delay=1.0)
    assert fdbqueue.queue_stats(db, "dly").oldest_age is None  # not due: nothing ready
    clock.advance(3.0)  # no sweep, no dequeue
    st = fdbqueue.queue_stats(db, "dly")
    assert st.ready == 1
    assert st.oldest_age == pytest.approx(3.0, abs=0.01), st
    assert cli_list(db, url, capsys)["dly"]["oldest_age"] == pytest.approx(3.0, abs=0.01)
    ages = [
        s.value
        for family in QueueCollector(db).collect()
        if family.name == "fdbqueue_queue_oldest_message_age_seconds"
        for s in family.samples
        if s.labels == {"queue": "dly"}
    ]
    assert ages == [pytest.approx(3.0, abs=0.01)]
    q.sweep(db)  # what a sweep then leaves agrees
    assert fdbqueue.queue_stats(db, "dly").oldest_age == pytest.approx(st.oldest_age, abs=0.01)
    # A ready message enqueued later than the due one is younger: the due one is the oldest.
    q2 = fdbqueue.Queue("mixed")
    q2.enqueue(db, b"first", delay=1.0)
    clock.advance(2.0)
    q2.enqueue(db, b"second")
    assert fdbqueue.queue_stats(db, "mixed").oldest_age == pytest.approx(2.0, abs=0.01)
