"""Rate limits: a queue's ``rate_limit`` and a Worker's bound what every consumer of the
database leases together, by a token bucket in the database split over shards
(``fdbqueue/ops/ratelimit.py``). Bounds are checked against database time (read versions),
never against a sleep: at most ``rate * elapsed + burst`` in any run, and a generous lower
bound (half the rate) so a busy machine does not fail them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue, QueueError, Worker
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now, fake_clock
from fdbqueue.store.layout import QueueKeys, RateKeys
from fdbqueue.store.rates import MAX_SHARDS, PER_SHARD_RATE, parse_rate

ENGINES = ["sim", "sqlite"]


@pytest.fixture(params=ENGINES)
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Any]:
    url = "sim://?seed=3&faults=0" if request.param == "sim" else f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    d = fdbqueue.open(url)
    yield d
    d.close()


def now(db: Any) -> int:
    return int(run_once(db, lambda t, _: db_now(t)))


# -- the text ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "per_second"),
    [("50/s", 50.0), ("1000/m", 1000 / 60), ("10/h", 10 / 3600), ("0.5/s", 0.5), ("7/d", 7 / 86400)],
)
def test_a_rate_parses(text: str, per_second: float) -> None:
    assert parse_rate(text).per_second == pytest.approx(per_second)


@pytest.mark.parametrize(
    "bad", ["50", "50/", "/s", "50/sec", "50 /s", " 50/s", "-5/s", "0/s", "5/x", "1e3/s", 50, None, "5/S"]
)
def test_a_malformed_rate_is_a_clear_error(bad: object) -> None:
    with pytest.raises(QueueError, match="rate_limit"):
        parse_rate(bad)


def test_shards_keep_each_key_within_its_write_rate() -> None:
    for text in ("1/s", "20/s", "100/s", "1000/s", "10000/s", "25600/s"):
        rate = parse_rate(text)
        assert rate.shard_rate <= PER_SHARD_RATE, text
        assert rate.shard_capacity >= 1
    assert parse_rate("100/s").shards == 4
    assert parse_rate("25600/s").shards == MAX_SHARDS


@pytest.mark.parametrize("text", ["25601/s", "1000000/s", "1536001/m", "100000000/h"])
def test_a_rate_above_what_the_shards_bear_is_refused_saying_the_bound(text: str) -> None:
    # MAX_SHARDS shards at PER_SHARD_RATE each: beyond, a shard's key is written more often
    # than the design bounds it (ops/ratelimit.py), so such a limit is refused, not stretched.
    with pytest.raises(QueueError, match=r"at most 25,600 a second"):
        parse_rate(text)


def test_the_setting_is_set_changed_and_cleared_like_the_others(db: Any) -> None:
    assert fdbqueue.create_queue(db, "emails", rate_limit="50/s").rate_limit == "50/s"
    assert fdbqueue.queue_config(db, "emails").rate_limit == "50/s"
    fdbqueue.create_queue(db, "emails", rate_limit="1000/m")
    assert fdbqueue.queue_config(db, "emails").rate_limit == "1000/m"
    fdbqueue.create_queue(db, "emails", rate_limit=None)
    assert fdbqueue.queue_config(db, "emails").rate_limit is None
    with pytest.raises(QueueError, match="not a rate"):
        fdbqueue.create_queue(db, "emails", rate_limit="fast")
    assert fdbqueue.queue_config(db, "emails").rate_limit is None  # refused: nothing changed


# -- the bucket, on a clock that moves only when told ------------------------------------------


def test_leases_take_at_most_the_rate_in_database_time(db: Any) -> None:
    with fake_clock() as clock:
        fdbqueue.create_queue(db, "emails", rate_limit="20/s")
        q = Queue("emails")
        q.enqueue_many(db, [b"x"] * 200)
        first = q.lease_many(db, 100)
        assert len(first) == 2  # the burst: a tenth of a second's worth, two tokens
        assert q.lease_many(db, 100) == []  # held back: no time has passed
        got = 0
        for _ in range(50):  # five seconds in steps of a tenth
            clock.advance(0.1)
            got += len(q.lease_many(db, 100))
        assert got == 100  # 20 a second, to the token
        assert q.size(db) == 200 - 102  # the rest stayed ready


def test_tokens_a_lease_cannot_use_are_not_spent(db: Any) -> None:
    with fake_clock() as clock:
        fdbqueue.create_queue(db, "emails", rate_limit="20/s")
        q = Queue("emails")
        assert q.lease_many(db, 10) == []  # nothing ready: no token spent
        q.enqueue_many(db, [b"x"] * 5)
        assert len(q.lease_many(db, 10)) == 2
        clock.advance(0.05)
        assert len(q.lease_many(db, 10)) == 1


def test_a_cleared_limit_no_longer_holds_leases_back(db: Any) -> None:
    with fake_clock():
        fdbqueue.create_queue(db, "emails", rate_limit="1/h")
        q = Queue("emails")
        q.enqueue_many(db, [b"x"] * 5)
        assert len(q.lease_many(db, 5)) == 1
        assert q.lease_many(db, 5) == []
        fdbqueue.create_queue(db, "emails", rate_limit=None)
        assert len(q.lease_many(db, 5)) == 4


def test_a_blocking_lease_waits_for_a_token_not_for_its_timeout(db: Any) -> None:
    fdbqueue.create_queue(db, "emails", rate_limit="20/s")
    q = Queue("emails")
    q.enqueue_many(db, [b"x"] * 10)
    assert len(q.lease_many(db, 10)) == 2
    begun = now(db)
    m = q.lease(db, timeout=30.0)  # the next token comes within 1/20 s
    assert m is not None
    assert (now(db) - begun) / 1e6 < 10.0  # long before the timeout


# -- workers, in real time, counted in database time -------------------------------------------


def run_for(workers: list[Worker], seconds: float) -> None:
    threads = [threading.Thread(target=w.run) for w in workers]
    for t in threads:
        t.start()
    threading.Event().wait(seconds)
    for w in workers:
        w.stop()
    for t in threads:
        t.join(30)


def test_a_worker_with_four_threads_handles_about_the_rate(db: Any) -> None:
    fdbqueue.create_queue(db, "emails", rate_limit="20/s")
    Queue("emails").enqueue_many(db, [b"x"] * 500)
    w = Worker(db, "emails", lambda m: None, concurrency=4)
    begun = now(db)
    run_for([w], 2.5)
    elapsed = (now(db) - begun) / 1e6
    handled = w.stats.processed
    assert handled <= 20 * elapsed + 2, (handled, elapsed)  # the rate and the burst, never more
    assert handled >= 0.5 * 20 * 2.5, (handled, elapsed)


def test_two_workers_share_the_limit(db: Any) -> None:
    fdbqueue.create_queue(db, "emails", rate_limit="20/s")
    Queue("emails").enqueue_many(db, [b"x"] * 500)
    ws = [Worker(db, "emails", lambda m: None, concurrency=2) for _ in range(2)]
    begun = now(db)
    run_for(ws, 2.5)
    elapsed = (now(db) - begun) / 1e6
    handled = sum(w.stats.processed for w in ws)
    assert handled <= 20 * elapsed + 2, (handled, elapsed)
    assert handled >= 0.5 * 20 * 2.5, (handled, elapsed)
    assert all(w.stats.processed > 0 for w in ws)  # both took their turns


def test_an_exactly_once_worker_keeps_the_limit(db: Any) -> None:
    fdbqueue.create_queue(db, "emails", rate_limit="20/s")
    Queue("emails").enqueue_many(db, [b"x"] * 500)
    w = Worker(db, "emails", lambda tr, m: None, mode="exactly_once", concurrency=2)
    begun = now(db)
    run_for([w], 2.0)
    elapsed = (now(db) - begun) / 1e6
    assert 0.5 * 20 * 2.0 <= w.stats.processed <= 20 * elapsed + 2, (w.stats.processed, elapsed)


def test_a_workers_own_rate_limit_is_shared_by_name_across_queues(db: Any) -> None:
    for name in ("a", "b"):
        Queue(name).enqueue_many(db, [b"x"] * 300)
    ws = [
        Worker(db, name, lambda m: None, concurrency=2, rate_limit="20/s", rate_limit_key="smtp")
        for name in ("a", "b")
    ]
    begun = now(db)
    run_for(ws, 2.0)
    elapsed = (now(db) - begun) / 1e6
    handled = sum(w.stats.processed for w in ws)
    assert 0.5 * 20 * 2.0 <= handled <= 20 * elapsed + 2, (handled, elapsed)
    shards = run_once(db, lambda t, _: t.get_range(*RateKeys.named("smtp").range()))
    assert len(shards) == 1  # one bucket, named, outside either queue


def test_a_workers_own_rate_limit_is_per_queue_without_a_name(db: Any) -> None:
    with fake_clock():
        Queue("a").enqueue_many(db, [b"x"] * 10)
        w = Worker(db, "a", lambda m: None, rate_limit="10/s")
        w.run(max_messages=1)
        assert w.stats.processed == 1  # the burst of 10/s is one token
        shards = run_once(db, lambda t, _: t.get_range(*RateKeys.named("a").range()))
        assert len(shards) == 1
        own = run_once(db, lambda t, _: t.get_range(*RateKeys.of_queue(QueueKeys.make("a")).range()))
        assert own == []  # the queue has no limit of its own


def test_a_rate_limit_key_needs_a_rate() -> None:
    db = fdbqueue.open("memory://")
    with pytest.raises(QueueError, match="rate_limit_key"):
        Worker(db, "a", lambda m: None, rate_limit_key="smtp")
    with pytest.raises(QueueError, match="not a rate"):
        Worker(db, "a", lambda m: None, rate_limit="lots")


def test_an_async_worker_and_a_dispatcher_keep_the_limit(db: Any) -> None:
    import asyncio

    from fdbqueue import Dispatcher, aio

    fdbqueue.create_queue(db, "emails", rate_limit="20/s")
    Queue("emails").enqueue_many(db, [b"x"] * 500)

    async def handler(m: fdbqueue.Message) -> None:
        return None

    aw = aio.AsyncWorker(db, "emails", handler, concurrency=4)

    async def for_a_while() -> None:
        task = asyncio.ensure_future(aw.run())
        await asyncio.sleep(1.5)
        aw.stop()
        await task

    begun = now(db)
    asyncio.run(for_a_while())
    d = Dispatcher(db, ["emails"], max_concurrent=4)
    d.add_consumer(lambda m: None, capacity=4)
    run = threading.Thread(target=d.run)
    run.start()
    threading.Event().wait(1.5)
    d.stop()
    run.join(30)
    elapsed = (now(db) - begun) / 1e6
    handled = aw.stats.processed + d.stats.acked
    assert 0.5 * 20 * 3.0 <= handled <= 20 * elapsed + 2, (aw.stats.processed, d.stats.acked, elapsed)
    assert aw.stats.processed > 0 and d.stats.acked > 0


def test_a_named_bucket_is_taken_from_in_a_callers_transaction(db: Any) -> None:
    """What the task API builds per-task limits on: ``ratelimit.take`` in any transaction,
    the same bucket a Worker's ``rate_limit_key`` names; an aborted transaction spends nothing."""
    from fdbqueue.ops import ratelimit

    with fake_clock() as clock:
        tr = db.create_transaction()
        assert ratelimit.take(tr, "send_email", "20/s", 5) == (2, 0.0)
        tr.cancel()  # aborted: the tokens are still there
        assert run_once(db, lambda t, _: ratelimit.take(t, "send_email", "20/s", 5)) == (2, 0.0)
        got, wait = run_once(db, lambda t, _: ratelimit.take(t, "send_email", "20/s", 5))
        assert got == 0 and wait == pytest.approx(0.05, abs=1e-3)  # versions a commit moved aside
        clock.advance(wait)
        assert run_once(db, lambda t, _: ratelimit.take(t, "send_email", "20/s", 5))[0] == 1


def test_a_named_bucket_is_taken_from_given_a_database_too(db: Any) -> None:
    """``tr`` a Database runs its own transaction, as every call of the API (it raised
    AttributeError: no get_read_version); a bad ``n`` or name is a QueueError."""
    from fdbqueue.ops import ratelimit

    with fake_clock():
        assert ratelimit.take(db, "send_email", "20/s", 5) == (2, 0.0)
        assert ratelimit.take(db, "send_email", "20/s", 5)[0] == 0
        for bad_n in (0, -1, 1.5, True, "2"):
            with pytest.raises(QueueError, match="n must be an int >= 1"):
                ratelimit.take(db, "send_email", "20/s", bad_n)  # type: ignore[arg-type]
        for bad_name in ("", 5, None):
            with pytest.raises(QueueError, match="name must be a non-empty str"):
                ratelimit.take(db, bad_name, "20/s")  # type: ignore[arg-type]


def test_the_limit_holds_through_conflicts_and_unknown_commits() -> None:
    """On the sim with faults: not_committed (1020) and commit_unknown_result (1021) retried
    by the lease's loop never hand out more than the bucket holds."""
    db = fdbqueue.open("sim://?seed=11&faults=0.2")
    with fake_clock() as clock:
        fdbqueue.create_queue(db, "emails", rate_limit="20/s")
        q = Queue("emails")
        q.enqueue_many(db, [b"x"] * 300)
        got = 0
        for _ in range(50):
            clock.advance(0.1)
            got += len(q.lease_many(db, 100))
        assert 90 <= got <= 20 * 5 + 2, got  # a commit that did not land spends nothing


def test_one_consumer_reaches_a_high_rate_spread_over_many_shards(db: Any) -> None:
    """1,000/s is 40 shards and a take reads 8 of them: it takes from as many as it needs,
    so one consumer alone still gets the rate (tokens left in shards it did not draw stay)."""
    with fake_clock() as clock:
        fdbqueue.create_queue(db, "emails", rate_limit="1000/s")
        q = Queue("emails")
        for _ in range(2):
            q.enqueue_many(db, [b"x"] * 1000)
        got = 0
        for _ in range(100):  # one second in steps of a hundredth
            clock.advance(0.01)
            while n := len(q.lease_many(db, 256)):
                got += n
        assert 900 <= got <= 1000 + 100, got  # the rate, and at most the burst above it


CHILD = """
import sys, threading, fdbqueue
db = fdbqueue.open(sys.argv[1])
w = fdbqueue.Worker(db, "emails", lambda m: None, concurrency=2)
threading.Timer(float(sys.argv[2]), w.stop).start()
print(w.run().processed)
"""


def test_worker_processes_share_the_limit(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    from tests.support import ROOT

    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "emails", rate_limit="20/s")
    Queue("emails").enqueue_many(db, [b"x"] * 500)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    begun = now(db)
    children = [
        subprocess.Popen(
            [sys.executable, "-c", CHILD, url, "2.5"], env=env, stdout=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    counts = [int(c.communicate(timeout=120)[0].strip()) for c in children]
    elapsed = (now(db) - begun) / 1e6  # the children's start-up included: an upper bound looser
    assert all(c.returncode == 0 for c in children)
    assert 0.5 * 20 * 2.5 <= sum(counts) <= 20 * elapsed + 2, (counts, elapsed)
    assert sum(counts) == fdbqueue.queue_stats(db, "emails").done
    db.close()
