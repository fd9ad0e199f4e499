"""asyncio's worker: :class:`AsyncWorker`, many ``async`` handlers in flight on one event loop
with the Worker's lease-mode semantics (leases renewed while a handler runs, acks settled in
batches, a time limit, graceful and immediate stops).

Apart from :mod:`.queue` (the queue's coroutines and the awaiting of watches and steps, which
this runs on), as ``runtime/worker.py`` is apart from ``api/queue.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from fdbqueue.aio.queue import _off, wait_watch
from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database
from fdbqueue.errors import QueueError
from fdbqueue.ops import ratelimit, tracing
from fdbqueue.ops.settling import AfterAck, Settler, lease_settling
from fdbqueue.ops.waiting import watch_queue
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
from fdbqueue.types import Message, check_duration, check_flag

log = logging.getLogger("fdbqueue.runtime.worker")


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
