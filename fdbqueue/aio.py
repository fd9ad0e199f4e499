"""asyncio: ``AsyncQueue`` (every ``Queue`` method as a coroutine), ``AsyncWorker`` (many
``async`` handlers in flight on one event loop) and ``transactional`` for ``async`` functions
taking ``tr``.

One implementation serves both APIs: a coroutine given a Database runs the same ``Queue``
method in the event loop's thread pool (its own retried transaction there), so nothing of
the queue's logic is written twice. Waiting is where the two differ: a blocking ``dequeue``,
``lease`` or ``wait`` holds no thread while it waits - it awaits the queue's watch through the
watch's completion callback (``Watch.on_ready``: the bindings' ``Future.on_ready`` on
FoundationDB, the engine's notification on the local engines), looking again when it fires,
as the blocking calls do (``fdbqueue.ops.waiting``). Given a Transaction, a coroutine runs the
method at once in the event loop's thread, inside that transaction.

    q = aio.AsyncQueue("jobs")
    await q.enqueue(db, {"n": 1})
    m = await q.dequeue(db, timeout=5)
    await aio.AsyncWorker(db, "jobs", handle, concurrency=100).run()
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import signal
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction, Watch, adopt, is_transaction
from fdbqueue.errors import EngineError, QueueError
from fdbqueue.ops import journaling, ratelimit, tracing
from fdbqueue.ops.settling import AfterAck, Settler, lease_settling
from fdbqueue.ops.steps import Emit, Run, Steps, refused, refused_wait, resume
from fdbqueue.ops.txn import as_database
from fdbqueue.ops.waiting import wait_ready_steps, watch_queue
from fdbqueue.runtime.handling import (
    Backoff,
    Heartbeat,
    Queues,
    WorkerStats,
    _as_queues,
    check_handler,
    engine_failure,
    give_back,
    settle_failure,
    until_empty_wait,
    work_set_of,
)
from fdbqueue.runtime.hooks import ack_after, dead_hook, log_refused, nack_noting
from fdbqueue.runtime.registry import DEFAULT_INTERVAL, Registration, worker_counts
from fdbqueue.runtime.timelimit import check_time_limit, time_limit_reason
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.types import Item, JournalEntry, Message, SweepStats, check_duration, check_flag

__all__ = ["AsyncQueue", "AsyncWorker", "journal", "transactional", "wait_watch"]

log = logging.getLogger("fdbqueue.runtime.worker")
T = TypeVar("T")


async def _off(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the running loop's thread pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


async def wait_watch(watch: Watch, timeout: float | None) -> bool:
    """Await ``watch`` up to ``timeout`` seconds without a thread: True when it fired (or
    was refused by the database and a re-check interval passed), False on timeout. Raises
    the error it failed with."""
    loop = asyncio.get_running_loop()
    fired: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not fired.done():
            fired.set_result(None)

    def done() -> None:  # from the thread that completed the watch
        loop.call_soon_threadsafe(settle)

    watch.on_ready(done)
    try:
        await asyncio.wait_for(fired, timeout)
    except asyncio.TimeoutError:
        return False
    if refused(watch):  # 1032 too_many_watches: look again after a bounded interval
        pause, answer = refused_wait(timeout)
        await asyncio.sleep(pause)
        return answer
    watch.wait(0)  # raises what it failed with
    return True


async def _steps(steps: Steps[T], result: list[T]) -> AsyncIterator[Any]:
    """``fdbqueue.ops.steps.iterate`` with coroutines: each call in the loop's thread pool, each
    wait on the watches' callbacks (no thread held); yields what the steps emit and leaves
    their result in ``result`` (an async generator cannot return one)."""
    send: Any = None
    error: BaseException | None = None
    try:
        while True:
            step, done = resume(steps, send, error)
            if step is None:
                result.append(done)
                return
            send, error = None, None
            if isinstance(step, Emit):
                yield step.value
                continue
            try:
                if isinstance(step, Run):
                    send = await _off(step.fn)
                else:
                    send = await _wait_watches(step.watches, step.timeout)
            except BaseException as exc:  # thrown into the steps, which may handle it
                error = exc
    finally:
        steps.close()  # cancelled or stopped early: the steps cancel their watches


async def drive(steps: Steps[T]) -> T:
    """``fdbqueue.ops.steps.drive`` with coroutines: their result. Cancelling it cancels the
    steps' watches."""
    result: list[T] = []
    async for value in _steps(steps, result):
        raise TypeError(f"drive() cannot take an Emit ({value!r}): use iterate()")
    return result[0]


async def iterate(steps: Steps[None]) -> AsyncIterator[Any]:
    """``fdbqueue.ops.steps.iterate`` with coroutines: yields what the steps emit."""
    async for value in _steps(steps, []):
        yield value


async def _wait_watches(watches: list[Watch], timeout: float | None) -> bool:
    """``fdbqueue.ops.steps.wait_watches``, awaited."""
    if len(watches) == 1:
        return await wait_watch(watches[0], timeout)
    return await _first(watches, timeout)


class AsyncQueue:
    """``Queue`` with coroutines. ``tr`` is a Database (the call runs in the loop's thread
    pool, in its own retried transaction) or a Transaction (runs now, in it)."""

    def __init__(self, name: str | Queue, *, root: tuple[Any, ...] | None = None) -> None:
        if isinstance(name, Queue):
            self.queue = name
        else:
            self.queue = Queue(name) if root is None else Queue(name, root=root)
        self.name = self.queue.name
        self.keys = self.queue.keys

    def __repr__(self) -> str:
        return f"AsyncQueue({self.name!r})"

    async def _run(self, method: Callable[..., T], tr: Transaction | Database, *args: Any, **kw: Any) -> T:
        tr = adopt(tr)
        if is_transaction(tr):
            return method(tr, *args, **kw)  # inside the caller's transaction: at once
        return await _off(method, tr, *args, **kw)

    async def enqueue(self, tr: Transaction | Database, payload: object, **kw: Any) -> str:
        """:meth:`Queue.enqueue`."""
        return await self._run(self.queue.enqueue, tr, payload, **kw)

    async def enqueue_many(
        self, tr: Transaction | Database, payloads: Sequence[Item], **kw: Any
    ) -> list[str]:
        """:meth:`Queue.enqueue_many`."""
        return await self._run(self.queue.enqueue_many, tr, payloads, **kw)

    async def deduplicated(self, tr: Transaction | Database, dedup_key: str) -> str | None:
        return await self._run(self.queue.deduplicated, tr, dedup_key)

    async def dequeue(
        self,
        tr: Transaction | Database,
        *,
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
        fallback: bool = False,
    ) -> Message | None:
        """:meth:`Queue.dequeue`; a blocking one (``timeout``) awaits the queue's watch."""
        if timeout is None or is_transaction(adopt(tr)):
            return await self._run(self.queue.dequeue, tr, timeout=timeout, where=where, fallback=fallback)
        return await drive(self.queue.dequeue_steps(as_database(tr), timeout, where, fallback))

    async def lease(
        self, tr: Transaction | Database, lease_seconds: float | None = None, *, timeout: float | None = None
    ) -> Message | None:
        """:meth:`Queue.lease`; a blocking one (``timeout``) awaits the queue's watch."""
        got = await self.lease_many(tr, 1, lease_seconds, timeout=timeout)
        return got[0] if got else None

    async def lease_many(
        self,
        tr: Transaction | Database,
        n: int,
        lease_seconds: float | None = None,
        *,
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[Message]:
        """:meth:`Queue.lease_many`; a blocking one (``timeout``) awaits the queue's watch."""
        if timeout is None or is_transaction(adopt(tr)):
            return await self._run(self.queue.lease_many, tr, n, lease_seconds, timeout=timeout, where=where)
        steps = self.queue.lease_steps(as_database(tr), n, lease_seconds, timeout, where)
        return await drive(steps) or []

    async def wait(self, db: Database, timeout: float | None = None) -> bool:
        """:meth:`Queue.wait`: until a message may be ready (True) or ``timeout`` passes
        (False), holding no thread."""
        if is_transaction(db) or not hasattr(db, "create_transaction"):
            raise QueueError("wait() needs a Database: a watch arms only when its transaction commits")
        if timeout is not None:
            timeout = check_duration("timeout", timeout)
        return await drive(wait_ready_steps(db, self.keys, timeout))

    async def ack(self, tr: Transaction | Database, m: Message) -> None:
        await self._run(self.queue.ack, tr, m)

    async def ack_many(self, tr: Transaction | Database, messages: Sequence[Message]) -> list[Message]:
        return await self._run(self.queue.ack_many, tr, messages)

    async def nack(self, tr: Transaction | Database, m: Message, **kw: Any) -> str:
        return await self._run(self.queue.nack, tr, m, **kw)

    async def nack_many(
        self, tr: Transaction | Database, messages: Sequence[Message], **kw: Any
    ) -> list[str | None]:
        return await self._run(self.queue.nack_many, tr, messages, **kw)

    async def release(self, tr: Transaction | Database, m: Message) -> None:
        await self._run(self.queue.release, tr, m)

    async def extend(self, tr: Transaction | Database, m: Message, lease_seconds: float) -> Message:
        return await self._run(self.queue.extend, tr, m, lease_seconds)

    async def sweep(self, tr: Transaction | Database, *, limit: int = 100) -> SweepStats:
        return await self._run(self.queue.sweep, tr, limit=limit)

    async def peek(self, tr: Transaction | Database) -> Message | None:
        return await self._run(self.queue.peek, tr)

    async def get(self, tr: Transaction | Database, msg_id: str) -> Message | None:
        return await self._run(self.queue.get, tr, msg_id)

    async def nth(self, tr: Transaction | Database, n: int) -> Message | None:
        return await self._run(self.queue.nth, tr, n)

    async def size(self, tr: Transaction | Database) -> int:
        return await self._run(self.queue.size, tr)

    async def empty(self, tr: Transaction | Database) -> bool:
        return await self._run(self.queue.empty, tr)

    async def delete(self, tr: Transaction | Database, msg_id: str) -> bool:
        return await self._run(self.queue.delete, tr, msg_id)

    async def browse(
        self, tr: Transaction | Database, *, limit: int | None = None, batch: int = 100
    ) -> AsyncIterator[Message]:
        """:meth:`Queue.browse` as an async iterator: a batch at a time from the thread pool."""
        it = self.queue.browse(tr, limit=limit, batch=batch)
        direct = is_transaction(adopt(tr))
        while True:
            take = functools.partial(_take, it, batch)
            page = take() if direct else await _off(take)
            for m in page:
                yield m
            if len(page) < batch:
                return


def _take(it: Iterator[T], n: int) -> list[T]:
    return list(itertools.islice(it, n))


async def journal(
    db: Database,
    queue: str | None,
    *,
    since: bytes | str | None = None,
    limit: int | None = None,
    follow: bool = False,
    timeout: float | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> AsyncIterator[JournalEntry]:
    """``fdbqueue.journal`` as an async iterator: pages read in the thread pool; with
    ``follow`` it then awaits the journal's watches (no thread held) and yields new entries as
    they commit, until ``timeout`` seconds pass without one (None: for ever)."""
    steps = journaling.journal_steps(
        db, queue, since=since, limit=limit, follow=follow, timeout=timeout, root=root
    )
    async for e in iterate(steps):
        yield e


async def _first(watches: list[Watch], timeout: float | None) -> bool:
    """Await the first of ``watches`` to fire or fail (True), or ``timeout`` (False)."""
    waits = [asyncio.ensure_future(wait_watch(w, timeout)) for w in watches]
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return any(not f.cancelled() and (f.exception() is not None or f.result()) for f in done)
    finally:
        for f in waits:
            f.cancel()


def transactional(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """For ``async def f(tr, ...)``: given a Database, runs ``f`` in a transaction of its own
    and commits it, retrying on retryable errors (FoundationDB's retry loop, as
    ``fdbqueue.transactional``); given a Transaction, awaits ``f`` inside it.

    The transaction lives in the event loop's thread: use ``tr`` (and AsyncQueue calls given
    ``tr``) inside ``f``, not calls given the Database, which would wait for the same store's
    writer (the embedded engine has one) from another thread while ``f`` holds it.
    """

    @functools.wraps(fn)
    async def run(tr: Transaction | Database, *args: Any, **kwargs: Any) -> T:
        tr = adopt(tr)
        if is_transaction(tr):
            return await fn(tr, *args, **kwargs)
        t = as_database(tr).create_transaction()
        try:
            while True:
                try:
                    result = await fn(t, *args, **kwargs)
                    t.commit()
                    return result
                except EngineError as exc:
                    t.on_error(exc)  # retryable: backs off and resets; else raises
        finally:
            t.cancel()

    return run


class AsyncWorker:
    """Run ``async def handler(message)`` over ``queues`` with up to ``concurrency`` handlers
    in flight on this event loop, with the Worker's lease-mode semantics: leases renewed while
    a handler runs (``heartbeat``), a return acks (in batches, ``settle_linger``), an exception
    nacks (``Retry`` / ``Discard`` say how), SIGTERM / SIGINT stop gracefully and a second (or
    ``shutdown_timeout``) at once, putting the messages in hand back. Lease mode is
    at-least-once. ``queues``: a name, a Queue, or a list of them. ``time_limit=S``: a
    handler still running after S seconds is cancelled (``CancelledError`` inside it) and
    its message nacked as a failed delivery (reason ``"time_limit: ..."``)."""

    def __init__(
        self,
        db: Database,
        queues: Queues,
        handler: Callable[[Message], Awaitable[Any]],
        *,
        concurrency: int = 10,
        lease_seconds: float | None = None,
        heartbeat: bool = True,
        settle_linger: float = 0.005,
        idle_timeout: float = 1.0,
        shutdown_timeout: float | None = None,
        time_limit: float | None = None,
        register: bool = True,
        registry_interval: float = DEFAULT_INTERVAL,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise QueueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        self.time_limit = check_time_limit(time_limit)
        self.register = check_flag("register", register)  # shown by fdbqueue.workers(db)
        self.registry_interval = check_duration("registry_interval", registry_interval, positive=True)
        if not asyncio.iscoroutinefunction(handler) and not asyncio.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - an object with an async __call__
        ):
            raise QueueError("AsyncWorker handlers are async functions: async def handler(message)")
        check_handler(handler, 1, "AsyncWorker handlers are called as await handler(message)")
        if work_set_of(queues) is not None:
            raise QueueError(
                "AsyncWorker serves named queues; for a pattern or a PartitionedQueue (fair turns "
                "over a work set) use Worker"
            )
        self.db = db
        self.queues = _as_queues(queues)
        self.handler = handler
        self._on_dead = dead_hook(handler)  # e.g. a task's failure result, with the dead letter
        self.concurrency = concurrency
        self.lease_seconds = None if lease_seconds is None else check_duration("lease_seconds", lease_seconds)
        self.heartbeat = check_flag("heartbeat", heartbeat)
        self.settle_linger = check_duration("settle_linger", settle_linger)
        self.idle_timeout = check_duration("idle_timeout", idle_timeout)
        self.shutdown_timeout = (
            None if shutdown_timeout is None else check_duration("shutdown_timeout", shutdown_timeout)
        )
        self.stats = WorkerStats(per_queue={q.name: 0 for q in self.queues})
        self.backoff = Backoff(log)
        self._stop = asyncio.Event()
        self._halt = threading.Event()  # set with _stop: ends a back-off in the thread pool
        self._lock = threading.Lock()  # stats settled from the settler's and the pool's threads
        self._forced = False
        self._limit: int | None = None
        self._turn = 0
        self._slots = asyncio.Semaphore(concurrency)
        self._registry = self._registration()
        self._held: float | None = None  # seconds until a rate limit grants a token

    def _registration(self) -> Registration:
        return Registration(
            self.db,
            "AsyncWorker",
            [q.name for q in self.queues],
            worker_counts(self.stats, self._lock),
            concurrency=self.concurrency,
            interval=self.registry_interval,
            enabled=self.register,
            root=self.queues[0].root,
        )

    def stop(self) -> None:
        """Finish the handlers in flight, lease no more, and return from :meth:`run`."""
        self._stop.set()
        self._halt.set()

    async def run(
        self, *, max_messages: int | None = None, until_empty: bool = False, install_signals: bool = False
    ) -> WorkerStats:
        """Handle messages until :meth:`stop`, a signal (``install_signals``), ``max_messages``
        handled, or - ``until_empty`` - nothing ready, delayed or leased is left."""
        self._stop = asyncio.Event()
        self._halt.clear()
        self._forced = False
        self._limit = max_messages
        loop = asyncio.get_running_loop()
        beat = Heartbeat(self.db, self.stats, log)
        self._registry = self._registration()
        await _off(self._registry.start)
        settler = (
            None
            if self.settle_linger == 0
            else Settler(self.db, self.settle_linger, 256, self._settled, self._on_dead, self._after_refused)
        )
        tasks: dict[asyncio.Task[None], tuple[Queue, Message]] = {}
        installed = []
        if install_signals:
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._on_signal, tasks)
                installed.append(sig)
        try:
            # Up to twice `concurrency` leased, at most `concurrency` handlers running: the next
            # batch is leased while the last runs, so a handler slot never waits for a lease.
            held = 2 * self.concurrency
            half = max(1, self.concurrency // 2)
            room = asyncio.Event()  # set when finished handlers leave room to refill
            self._slots = asyncio.Semaphore(self.concurrency)

            def finished(task: asyncio.Task[None]) -> None:
                done = tasks.pop(task, None)
                if done is not None:
                    self._registry.end(done[1].id)  # no longer in hand, however it ended
                if len(tasks) <= held - half:
                    room.set()

            while not self._stop.is_set():
                free = held - len(tasks)
                if free < half and tasks:  # refill at half, not at every freed slot
                    room.clear()
                    await room.wait()
                    continue
                got = await self._fetch(free, settler)
                for q, m in got:
                    task = asyncio.ensure_future(self._handle(q, m, beat, settler))
                    tasks[task] = (q, m)
                    task.add_done_callback(finished)
                if got:
                    continue
                if tasks:
                    room.clear()
                    if tasks:
                        await asyncio.wait(set(tasks), return_when=asyncio.FIRST_COMPLETED)
                    continue
                wait, self._held = self._held, None
                if wait is not None:  # ready, but a rate limit holds them back: until a token
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), min(wait, max(self.idle_timeout, 0.001)))
                    continue
                if settler is not None:
                    await _off(settler.flush)
                timeout = self.idle_timeout
                if until_empty:
                    left = await _off(until_empty_wait, self.db, self.queues, self.idle_timeout)
                    if left is None:
                        break
                    timeout = left
                await self._idle(timeout)
        finally:
            for sig in installed:
                loop.remove_signal_handler(sig)
            if tasks:
                if self._forced:
                    for task in list(tasks):
                        task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
            if settler is not None:
                await _off(settler.close)
            beat.close()
            await _off(self._registry.close)
        self.stats.backoffs = self.backoff.count
        return self.stats

    def _on_signal(self, tasks: dict[asyncio.Task[None], tuple[Queue, Message]]) -> None:
        if self._stop.is_set():
            self._forced = True
            for task in list(tasks):
                task.cancel()  # at once: each puts its message back (not counted)
            return
        self.stop()
        if self.shutdown_timeout is not None:
            asyncio.get_running_loop().call_later(self.shutdown_timeout, self._on_signal, tasks)

    async def _fetch(self, want: int, settler: Settler[Queue] | None) -> list[tuple[Queue, Message]]:
        got: list[tuple[Queue, Message]] = []
        n = len(self.queues)
        for i in range(n):
            q = self.queues[(self._turn + i) % n]
            if want - len(got) <= 0:
                break
            try:
                leased, held = await _off(
                    _lease_noting, self.db, settler, q, min(256, want - len(got)), self.lease_seconds
                )
            except QueueError as exc:
                if not engine_failure(exc):
                    raise
                await _off(self.backoff.wait, f"lease from {q.name!r}", exc, self._halt)
                return got
            got.extend((q, m) for m in leased)
            if held is not None:
                self._held = held if self._held is None else min(self._held, held)
        self._turn += 1
        self.backoff.reset()
        return got

    async def _idle(self, timeout: float) -> None:
        """Nothing ready: await the first of the queues' watches, up to ``timeout``."""
        watches = [await _off(watch_queue, self.db, q.keys) for q in self.queues]
        try:
            waits = [asyncio.ensure_future(wait_watch(w, timeout)) for w in watches]
            stop = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait([*waits, stop], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            for f in [*waits, stop]:
                f.cancel()
        finally:
            for w in watches:
                w.cancel()

    async def _handle(self, q: Queue, m: Message, beat: Heartbeat, settler: Settler[Queue] | None) -> None:
        lease = self.lease_seconds or (
            None if m.lease_deadline is None else max(1.0, m.lease_deadline - time.time())
        )
        if self.heartbeat and lease is not None:
            beat.hold(q, m, lease)
        self._registry.begin(q.name, m.id)
        try:
            async with self._slots:
                if self._stop.is_set():  # stopping: a message not started goes back
                    raise asyncio.CancelledError
                with tracing.span(q.name, m.id, m.headers):  # the enqueuer's trace, with OpenTelemetry
                    ran, value = await self._call(m)
                    if not ran:
                        beat.drop(m)  # renewed no more: released as a failed delivery
                        await _off(self._timed_out, q, m)
                        self._at_limit(settler)
                        return
        except asyncio.CancelledError:
            beat.drop(m)
            await asyncio.shield(_off(self._release, q, m))  # stopped at once: back, not counted
            raise
        except Exception as exc:
            beat.drop(m)
            if engine_failure(exc):
                await _off(self._release, q, m)
                return
            kind = await _off(settle_failure, self.db, q, m, exc, log, self._on_dead)
            with self._lock:
                self.stats.failed += 1
                self.stats.retried += kind == "retried"
                self.stats.discarded += kind == "discarded"
            self._at_limit(settler)
            return
        beat.drop(m)
        after = value if isinstance(value, AfterAck) else None  # writes to commit with the ack
        if settler is not None:
            settler.add(q, m, after)
            self._at_limit(settler)
            return
        try:
            refused = await _off(ack_after, self.db, q, m, after, self._on_dead)
        except QueueError as err:
            log.warning("could not ack %s: %s", m.id, err)
            return
        if refused is not None:
            self._after_refused(q, m, refused)
            return
        self._settled(q, 1, [])

    async def _call(self, m: Message) -> tuple[bool, Any]:
        """Await the handler on ``m``: (True, what it returned), or (False, None) if it ran past
        ``time_limit`` (then cancelled)."""
        if self.time_limit is None:
            return True, await self.handler(m)
        call = asyncio.ensure_future(self.handler(m))
        try:
            done, _ = await asyncio.wait({call}, timeout=self.time_limit)
        except asyncio.CancelledError:
            call.cancel()  # stopped at once: the handler with it
            raise
        if done:
            return True, call.result()  # its exception, if it raised
        call.cancel()  # not awaited: a handler that ignores cancelling cannot hold the slot
        call.add_done_callback(lambda t: t.cancelled() or t.exception())  # retrieved: not logged
        return False, None

    def _timed_out(self, q: Queue, m: Message) -> None:
        assert self.time_limit is not None
        log.warning(
            "handler on queue %r, message %s (delivery %d) ran past its time limit of %g s: "
            "cancelled, and the message released as a failed delivery",
            q.name,
            m.id,
            m.deliveries,
            self.time_limit,
            extra={"queue": q.name, "message_id": m.id, "deliveries": m.deliveries},
        )
        try:
            nack_noting(self.db, q, m, reason=time_limit_reason(self.time_limit), on_dead=self._on_dead)
        except QueueError as err:
            log.warning("could not nack %s on %r: %s", m.id, q.name, err)
        with self._lock:
            self.stats.failed += 1
            self.stats.timed_out += 1

    def _release(self, q: Queue, m: Message) -> None:
        give_back(self.db, q, m, self.stats, log)

    def _at_limit(self, settler: Settler[Queue] | None) -> None:
        if self._limit is None:
            return
        with self._lock:
            handled = self.stats.processed + self.stats.failed
        handled += 0 if settler is None else settler.unsettled()
        if handled >= self._limit:
            self.stop()

    def _after_refused(self, q: Queue, m: Message, reason: str) -> None:
        """What ``m``'s handler asked to commit with its ack was refused: dead-lettered."""
        log_refused(log, q, m, reason)
        with self._lock:
            self.stats.failed += 1
            self.stats.discarded += 1

    def _settled(self, q: Queue, acked: int, lost: list[Message]) -> None:
        with self._lock:  # from the settler's thread, the pool's, or the loop's
            self.stats.processed += acked
            self.stats.per_queue[q.name] = self.stats.per_queue.get(q.name, 0) + acked
            self.stats.ack_lost += len(lost)
        for m in lost:
            log.warning("could not ack %s on %r: its lease had gone; delivered again", m.id, q.name)


def _lease_noting(
    db: Database, settler: Settler[Queue] | None, q: Queue, n: int, lease_seconds: float | None
) -> tuple[list[Message], float | None]:
    """``lease_settling``, and when it got nothing whether a rate limit held it back (read in
    the thread that leased: ``ratelimit.throttled`` is per thread)."""
    leased = lease_settling(db, settler, q, n, lease_seconds)
    return leased, None if leased else ratelimit.throttled()
