"""The asyncio API on every engine: AsyncQueue's coroutines give what Queue's methods give; a
blocking dequeue or lease waits on the queue's watch without a thread of its own (fifty
waiters, a handful of threads) and wakes on an enqueue from elsewhere; ``aio.transactional``
commits or aborts an async function's writes with its queue operations; AsyncWorker runs many
async handlers at once with the Worker's semantics (Retry, Discard, heartbeats, max_messages,
stop)."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Database, Discard, Message, Queue, Retry, aio


def run(coro: object) -> object:
    return asyncio.run(coro)  # type: ignore[arg-type]


def test_async_queue_gives_what_queue_gives(db: Database) -> None:
    async def main() -> None:
        q = aio.AsyncQueue("jobs")
        a = await q.enqueue(db, {"n": 1}, headers={"k": "v"})
        ids = await q.enqueue_many(db, [b"x", "y"])
        assert await q.size(db) == 3 and not await q.empty(db)
        assert (await q.peek(db)).id == a  # type: ignore[union-attr]
        assert (await q.get(db, ids[1])).text() == "y"  # type: ignore[union-attr]
        assert (await q.nth(db, 1)).id == ids[0]  # type: ignore[union-attr]
        assert (
            [m.id async for m in q.browse(db, batch=2)]
            == [a, *ids]
            == [m.id for m in Queue("jobs").browse(db)]
        )
        m = await q.lease(db)
        assert m is not None and m.json() == {"n": 1} and m.headers["k"] == "v"
        m = await q.extend(db, m, 60.0)
        await q.ack(db, m)
        got = await q.lease_many(db, 2)
        assert [x.id for x in got] == ids
        assert await q.nack(db, got[0], delay=100.0) == "delayed"
        assert [x.id for x in await q.ack_many(db, got[1:])] == [ids[1]]
        assert await q.dequeue(db) is None  # the nacked one waits out its delay
        assert await q.delete(db, ids[0]) is True
        st = fdbqueue.queue_stats(db, "jobs")
        assert (st.ready, st.delayed, st.inflight, st.done) == (0, 0, 0, 2)
        await q.sweep(db)

    run(main())


def test_transactional_commits_or_aborts_the_writes_and_the_queue_operations(db: Database) -> None:
    q = aio.AsyncQueue("jobs")

    @aio.transactional
    async def place(tr: fdbqueue.Transaction, order: str, fail: bool) -> str:
        tr[b"orders/" + order.encode()] = b"placed"
        mid = await q.enqueue(tr, {"order": order})
        await asyncio.sleep(0)  # other coroutines may run; the transaction is this one's
        if fail:
            raise RuntimeError("no")
        return mid

    async def main() -> None:
        mid = await place(db, "a", False)
        with pytest.raises(RuntimeError):
            await place(db, "b", True)
        m = await q.dequeue(db)
        assert m is not None and m.id == mid and await q.dequeue(db) is None

    run(main())

    @fdbqueue.transactional
    def orders(tr: fdbqueue.Transaction) -> list[bytes]:
        return [kv.key for kv in tr.get_range(b"orders/", b"orders0")]

    assert orders(db) == [b"orders/a"]


def test_blocking_waiters_hold_no_thread_and_wake_on_enqueue(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    q = aio.AsyncQueue("jobs")
    fdbqueue.create_queue(db, "jobs")
    n = 50

    async def main() -> None:
        # A small thread pool: were a waiter to hold one of its threads while it waits, the
        # pool would be full and the call below would wait as long as they do.
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=4))
        waiters = [asyncio.ensure_future(q.dequeue(db, timeout=30)) for _ in range(n)]
        await asyncio.sleep(1.0)  # every waiter armed its watch and waits on it
        assert not any(w.done() for w in waiters)
        assert await asyncio.wait_for(loop.run_in_executor(None, int, "7"), 2.0) == 7
        started = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(
            None, lambda: Queue("jobs").enqueue_many(db, [f"m{i}" for i in range(n)])
        )
        got = await asyncio.gather(*waiters)
        assert sorted(m.text() for m in got if m) == sorted(f"m{i}" for i in range(n))
        assert time.monotonic() - started < 10
        t0 = time.monotonic()
        assert await q.dequeue(db, timeout=0.3) is None
        assert 0.25 <= time.monotonic() - t0 < 5
        assert await q.lease(db, timeout=0.2) is None
        fdbqueue.stop_queue(db, "jobs")
        with pytest.raises(fdbqueue.QueueStoppedError):
            await q.dequeue(db, timeout=0.2)  # still paused when the wait ends
        fdbqueue.start_queue(db, "jobs")
        waiter = asyncio.ensure_future(q.wait(db, timeout=10))
        await asyncio.sleep(0.2)
        Queue("jobs").enqueue(db, b"x")
        assert await waiter is True

    run(main())
    db.close()


def test_an_async_worker_runs_many_handlers_at_once(db: Database) -> None:
    Queue("jobs").enqueue_many(db, [str(i) for i in range(300)])
    running = [0, 0]  # now, most

    async def handle(m: Message) -> None:
        running[0] += 1
        running[1] = max(running[1], running[0])
        await asyncio.sleep(0.01)
        running[0] -= 1

    started = time.monotonic()
    stats = run(aio.AsyncWorker(db, "jobs", handle, concurrency=50).run(until_empty=True))
    took = time.monotonic() - started
    assert stats.processed == 300 and stats.failed == 0  # type: ignore[attr-defined]
    assert fdbqueue.queue_stats(db, "jobs").done == 300
    assert running[1] > 10  # many in flight at once, on one thread
    assert took < 300 * 0.01  # not one after another


def test_async_handlers_choose_retry_or_discard_and_failures_are_nacked(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=3)
    q = Queue("jobs")
    retry, discard, boom = (q.enqueue(db, t) for t in ("retry", "discard", "boom"))
    seen: dict[str, int] = {}

    async def handle(m: Message) -> None:
        seen[m.text()] = seen.get(m.text(), 0) + 1
        if m.text() == "retry" and m.deliveries == 1:
            raise Retry(delay=0.0)
        if m.text() == "discard":
            raise Discard("not ours")
        if m.text() == "boom":
            raise ValueError("bad")

    stats = run(aio.AsyncWorker(db, "jobs", handle, concurrency=4).run(until_empty=True))
    assert seen == {"retry": 2, "discard": 1, "boom": 3}
    assert (stats.processed, stats.retried, stats.discarded) == (1, 1, 1)  # type: ignore[attr-defined]
    dead = {m.id: m.reason for m in Queue("jobs.error").browse(db)}
    assert (
        set(dead) == {discard, boom} and dead[discard] == "not ours" and "ValueError: bad" in str(dead[boom])
    )
    assert retry not in dead


def test_a_long_async_handler_keeps_its_lease_and_max_messages_stops(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", lease_seconds=1.0)
    Queue("jobs").enqueue_many(db, [b"long", *[b"x"] * 20])
    deliveries: list[int] = []

    async def handle(m: Message) -> None:
        if m.payload == b"long":
            deliveries.append(m.deliveries)
            await asyncio.sleep(2.5)  # past two leases: the heartbeat renews it

    async def main() -> None:
        w = aio.AsyncWorker(db, "jobs", handle, concurrency=2)
        other = aio.AsyncWorker(db, "jobs", handle, concurrency=2)  # would take an expired lease
        stats = await w.run(max_messages=5)
        assert stats.processed + stats.failed >= 5
        await asyncio.gather(w.run(until_empty=True), other.run(until_empty=True))

    run(main())
    assert deliveries == [1]
    assert fdbqueue.queue_stats(db, "jobs").done == 21
    db.close()


def test_an_async_worker_refuses_a_plain_handler(db: Database) -> None:
    with pytest.raises(fdbqueue.QueueError, match="async def handler"):
        aio.AsyncWorker(db, "jobs", lambda m: None)  # type: ignore[arg-type,return-value]

    async def handle(m: Message) -> None:
        pass

    with pytest.raises(fdbqueue.QueueError, match="AsyncWorker serves named queues"):
        aio.AsyncWorker(db, "tenant.*", handle)
    with pytest.raises(fdbqueue.QueueError, match="concurrency must be"):
        aio.AsyncWorker(db, "jobs", handle, concurrency=0)


def test_following_the_journal_awaits_new_entries_without_a_thread(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    first = Queue("jobs").enqueue(db, b"a")

    async def follow(n: int) -> list[str]:
        got = []
        async for e in aio.journal(db, "jobs", follow=True, timeout=10):
            got.append(e.op)
            if len(got) == n:
                break
        return got

    async def main() -> None:
        loop = asyncio.get_running_loop()
        loop.set_default_executor(ThreadPoolExecutor(max_workers=4))
        followers = [asyncio.ensure_future(follow(3)) for _ in range(20)]
        await asyncio.sleep(1.0)
        assert not any(f.done() for f in followers)  # each saw the create and the enqueue
        assert await asyncio.wait_for(loop.run_in_executor(None, int, "7"), 2.0) == 7  # pool free
        await loop.run_in_executor(None, lambda: Queue("jobs").dequeue(db))
        assert await asyncio.gather(*followers) == [["create", "enqueue", "dequeue"]] * 20
        entries = [e async for e in aio.journal(db, "jobs", limit=2)]
        assert [(e.op, e.message_id) for e in entries] == [("create", None), ("enqueue", first)]
        t0 = time.monotonic()
        assert [
            e.op async for e in aio.journal(db, "jobs", since=entries[-1].version, follow=True, timeout=0.3)
        ] == ["dequeue"]
        assert time.monotonic() - t0 >= 0.25  # waited out the timeout with nothing new

    run(main())
    db.close()


_SIGNALLED = """
import asyncio, sys
import fdbqueue
from fdbqueue import aio
db = fdbqueue.open(sys.argv[1])
async def handle(m):
    print("started", flush=True)
    await asyncio.sleep(60)
stats = asyncio.run(aio.AsyncWorker(db, "jobs", handle, concurrency=3).run(install_signals=True))
print("released", stats.released, flush=True)
"""


@pytest.mark.slow
def test_a_second_sigterm_stops_an_async_worker_at_once_and_puts_the_messages_back(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    Queue("jobs").enqueue_many(db, [b"a", b"b", b"c", b"d"])
    proc = subprocess.Popen([sys.executable, "-c", _SIGNALLED, url], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        for _ in range(3):
            assert proc.stdout.readline().strip() == "started"
        proc.send_signal(signal.SIGTERM)  # graceful: would wait for the handlers
        time.sleep(0.5)
        assert proc.poll() is None
        started = time.monotonic()
        proc.send_signal(signal.SIGTERM)  # at once
        assert proc.wait(timeout=30) == 0 and time.monotonic() - started < 10
        assert proc.stdout.read().split() == ["released", "4"]  # 3 running, 1 leased ahead
    finally:
        if proc.poll() is None:
            proc.kill()
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.ready, st.inflight, st.done) == (4, 0, 0)
    assert {m.deliveries for m in Queue("jobs").browse(db)} == {0}  # not counted as deliveries
    db.close()


def test_an_async_worker_until_empty_ends_soon_after_another_workers_last_ack(db: Database) -> None:
    """As the thread Worker: while only another worker's lease is out it looks again often
    (an ack wakes no watch), not after ``idle_timeout``."""
    q = Queue("jobs")
    q.enqueue(db, b"held")
    held = q.lease(db)
    assert held is not None

    async def handle(m: Message) -> None:
        pass

    async def main() -> float:
        worker = aio.AsyncWorker(db, q, handle)
        assert worker.idle_timeout == 1.0
        run = asyncio.ensure_future(worker.run(until_empty=True))
        await asyncio.sleep(0.3)
        assert not run.done(), "it stopped while a lease was still out"
        acked = time.monotonic()
        await aio.AsyncQueue(q).ack(db, held)
        await asyncio.wait_for(run, 5)
        return time.monotonic() - acked

    took = run(main())
    assert isinstance(took, float) and took < 0.4, f"stopped {took:.2f} s after the last ack"
