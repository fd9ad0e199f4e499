"""The push model: a dispatcher leases messages and calls consumers with them.

When a dispatch round starts is the ``schedule``:

* ``"each"``     - at once for every message, while load control allows;
* ``"idle"``     - only when no handler is running: one message at a time;
* ``"length"``   - when the queues hold at least ``length`` ready messages; the round drains them;
* ``"interval"`` - every ``interval`` seconds while a queue is non-empty; the round drains them.

Load control: at most ``max_concurrent`` handlers run at once. Consumers have a
``priority`` and a ``capacity``: a message goes to the highest-priority consumer with a free
slot, and among equals to the one served least recently, so equal consumers share fairly.
Several queues are leased from in rotation, so each gets its turn. A consumer is called as
``handler(message)`` (refused at ``add_consumer`` when it cannot be); returning acks the
message, raising nacks it with the exception as the reason, logged once with its traceback.
"""

from __future__ import annotations

import itertools
import logging
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database
from fdbqueue.errors import QueueError
from fdbqueue.ops import ratelimit, tracing
from fdbqueue.ops.waiting import QueueWatcher
from fdbqueue.runtime.fairness import FAIR_SHARE, WorkSet
from fdbqueue.runtime.handling import (
    Backoff,
    Queues,
    _as_queues,
    check_handler,
    engine_failure,
    settle_failure,
    until_empty_wait,
    work_set_of,
)
from fdbqueue.runtime.registry import DEFAULT_INTERVAL, Registration
from fdbqueue.types import Message, check_duration, check_flag

log = logging.getLogger("fdbqueue.runtime.dispatcher")

SCHEDULES = ("each", "idle", "length", "interval")


@dataclass
class Consumer:
    """A handler registered with a dispatcher, with its priority and capacity (free slots)."""

    handler: Callable[[Message], Any]
    priority: int = 0
    capacity: int = 1
    name: str = ""
    running: int = 0
    served: int = 0
    failed: int = 0
    last_served: int = 0  # dispatch sequence number: the fairness tie-breaker


@dataclass
class DispatcherStats:
    """What a dispatcher did: ``nacked`` counts every consumer failure (each also logged)."""

    dispatched: int = 0
    acked: int = 0
    nacked: int = 0
    rounds: int = 0
    max_running: int = 0
    per_consumer: dict[str, int] = field(default_factory=dict)
    per_queue: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for people (``str(stats)``): counts, then the share of each consumer."""
        parts = [f"dispatched {self.dispatched}", f"acked {self.acked}", f"nacked {self.nacked}"]
        parts.append(f"rounds {self.rounds}, at most {self.max_running} running")
        if len(self.per_consumer) > 1:
            parts.append("per consumer " + ", ".join(f"{k} {v}" for k, v in self.per_consumer.items()))
        return "; ".join(parts)

    def __str__(self) -> str:
        return self.summary()


class Dispatcher:
    """Push messages from ``queues`` to registered consumers (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        queues: Queues,
        *,
        schedule: str = "each",
        max_concurrent: int = 4,
        length: int = 100,
        interval: float = 1.0,
        lease_seconds: float | None = None,
        sweep_interval: float = 5.0,
        idle_timeout: float = 1.0,
        register: bool = True,
        registry_interval: float = DEFAULT_INTERVAL,
    ) -> None:
        if schedule not in SCHEDULES:
            raise QueueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        for name, value in (("max_concurrent", max_concurrent), ("length", length)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise QueueError(f"{name} must be an int >= 1, got {value!r}")
        interval = check_duration("interval", interval, positive=True)
        self.db = db
        self.workset = work_set_of(queues)  # a pattern or partitioned queue: fair turns
        self.queues = [] if self.workset is not None else _as_queues(queues)
        self.schedule = schedule
        self.max_concurrent = 1 if schedule == "idle" else max_concurrent
        self.length = length
        self.interval = interval
        self.lease_seconds = (
            None if lease_seconds is None else check_duration("lease_seconds", lease_seconds, positive=True)
        )
        self.sweep_interval = check_duration("sweep_interval", sweep_interval)
        self.idle_timeout = check_duration("idle_timeout", idle_timeout)
        self.consumers: list[Consumer] = []
        self.stats = DispatcherStats(per_queue={q.name: 0 for q in self.queues})
        self.backoff = Backoff(log)
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._watcher: QueueWatcher | None = None
        self._running = 0
        self._seq = itertools.count(1)
        self._turn = 0
        self._round = schedule in ("each", "idle")
        self._last_round = 0.0
        self._last_sweep = 0.0
        self._limit: int | None = None
        self._held: float | None = None  # seconds until a rate limit grants a token
        self.register = check_flag("register", register)  # shown by fdbqueue.workers(db)
        self.registry_interval = check_duration("registry_interval", registry_interval, positive=True)
        self._registry = self._registration()

    def _registration(self) -> Registration:
        names = [self.workset.name] if self.workset is not None else [q.name for q in self.queues]
        root = self.workset.root if self.workset is not None else self.queues[0].root

        def counts() -> tuple[int, int]:
            with self._cond:
                return self.stats.acked + self.stats.nacked, self.stats.nacked

        return Registration(
            self.db,
            "Dispatcher",
            names,
            counts,
            concurrency=self.max_concurrent,
            interval=self.registry_interval,
            enabled=self.register,
            root=root,
        )

    def add_consumer(
        self,
        handler: Callable[[Message], Any],
        *,
        priority: int = 0,
        capacity: int = 1,
        name: str | None = None,
    ) -> Consumer:
        """Register ``handler``; higher ``priority`` is served first while it has free capacity."""
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise QueueError(f"capacity must be an int >= 1, got {capacity!r}")
        check_handler(handler, 1, "consumers are called as handler(message), outside any transaction")
        c = Consumer(handler, priority, capacity, name or f"consumer-{len(self.consumers) + 1}")
        with self._cond:
            self.consumers.append(c)
            self.stats.per_consumer[c.name] = 0
        return c

    def stop(self) -> None:
        self._stop.set()
        with self._cond:
            self._cond.notify_all()

    # -- choosing --------------------------------------------------------------------------

    def _free_slots(self) -> int:
        free = sum(c.capacity - c.running for c in self.consumers)
        return max(0, min(free, self.max_concurrent - self._running))

    def _pick(self) -> Consumer:
        """Highest priority with a free slot; among equals the least recently served."""
        free = [c for c in self.consumers if c.running < c.capacity]
        return max(free, key=lambda c: (c.priority, -c.last_served))

    def _served_queues(self) -> list[Queue]:
        """The queues to look at now: the named ones, or a work set's queues with work."""
        return self.queues if self.workset is None else self.workset.rotation(self.db)

    def _should_dispatch(self) -> bool:
        if self._round:
            return True
        if self.schedule == "length":
            ready = sum(q.size(self.db) for q in self._served_queues())
            self._round = ready >= self.length
        elif self.schedule == "interval" and time.monotonic() - self._last_round >= self.interval:
            self._round = not all(q.empty(self.db) for q in self._served_queues())
            self._last_round = time.monotonic()
        if self._round:
            self.stats.rounds += 1
        return self._round

    # -- running -----------------------------------------------------------------------------

    def run(
        self, *, max_messages: int | None = None, until_empty: bool = False, install_signals: bool = False
    ) -> DispatcherStats:
        """Dispatch until :meth:`stop` (or SIGTERM/SIGINT), ``max_messages``, or - with
        ``until_empty`` - no handler runs and no queue holds a message ready, delayed or
        leased. Draining under ``schedule="length"``, fewer than ``length`` messages left
        with nothing new for ``idle_timeout`` are taken by a last, shorter round."""
        if not self.consumers:
            raise QueueError("add a consumer before running the dispatcher")
        self._limit = max_messages
        previous: dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop())
        pool = ThreadPoolExecutor(max_workers=self.max_concurrent, thread_name_prefix="fdbqueue-dispatch")
        self._registry = self._registration()
        try:
            self._registry.start()
            self._loop(pool, until_empty)
        finally:
            self._stop.set()
            pool.shutdown(wait=True)
            self._registry.close()
            if self._watcher is not None:
                self._watcher.close()
                self._watcher = None
            if self.workset is not None:
                self.workset.leave(self.db)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return self.stats

    def _loop(self, pool: ThreadPoolExecutor, until_empty: bool) -> None:
        while not self._stop.is_set():
            try:
                if self._turn_once(pool, until_empty):
                    return
            except QueueError as exc:
                if not engine_failure(exc):
                    raise
                # The engine fails (a full disk, an unreachable cluster): no message's fault.
                self.backoff.wait("dispatching", exc, self._stop)

    def _turn_once(self, pool: ThreadPoolExecutor, until_empty: bool) -> bool:
        """One turn of the dispatch loop; True when the dispatcher is done."""
        with self._cond:
            slots = self._free_slots()
            if self._limit is not None:
                slots = min(slots, self._limit - self.stats.dispatched)
                if slots <= 0 and self._running == 0:
                    return True
            if slots <= 0:
                # Checked and waited under one lock: a handler's end (it notifies) is not missed.
                self._cond.wait(0.1)
                return False
        if self._should_dispatch():
            got = self._lease(slots)
            if got:
                for q, m in got:
                    self._submit(pool, q, m)
                return False
            held, self._held = self._held, None
            if held is not None:  # ready, but a rate limit holds them back: until a token
                self._stop.wait(min(held, max(self.idle_timeout, 0.001)))
                return False
            if self.schedule in ("length", "interval"):
                self._round = False  # drained: the round is over
        # Nothing to dispatch now, whatever the reason (no round due, or none ready). Every
        # path that does not dispatch comes here, so that the end of the last running
        # handler is always followed by the until_empty check: a round's last lease often
        # comes back empty while a handler still runs, and the next turn finds no round due.
        with self._cond:
            if self._running > 0:
                self._cond.wait(0.1)  # checked and waited under one lock: no lost notify
                return False
        self._maybe_sweep()
        timeout = self.interval if self.schedule == "interval" else self.idle_timeout
        if until_empty and self.workset is not None:
            if self.workset.drained(self.db):
                return True
        elif until_empty:
            wait = until_empty_wait(self.db, self.queues, timeout)
            if wait is None:
                return True
            timeout = wait
        news = self._wait(timeout)
        if until_empty and not news and self.schedule == "length" and not self._round:
            # Draining: fewer than ``length`` are left and no more came for idle_timeout;
            # a last, shorter round takes them rather than waiting for a round forever.
            self._round = True
            self.stats.rounds += 1
        return False

    def _wait(self, timeout: float) -> bool:
        """Wait for the next interval, or for news on the queues' watches (True) or ``timeout``."""
        if self.schedule == "interval" and not self._round:
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - self._last_round)))
            return False
        if self.workset is not None:  # one watch on the work index, however many queues
            return self.workset.wait(self.db, timeout, self._stop)
        if self._watcher is None:  # kept across waits: its watches outlive each one
            # Under "length" ready messages are left waiting for a round: watch for new ones.
            keys = [q.keys for q in self.queues]
            self._watcher = QueueWatcher(self.db, keys, changes_only=self.schedule == "length")
        return self._watcher.wait(timeout, self._stop)

    def _lease(self, slots: int) -> list[tuple[Queue, Message]]:
        if self.workset is not None:
            return self._lease_fairly(self.workset, slots)
        got: list[tuple[Queue, Message]] = []
        for i in range(len(self.queues)):
            q = self.queues[(self._turn + i) % len(self.queues)]
            if len(got) >= slots:
                break
            leased = q.lease_many(self.db, slots - len(got), self.lease_seconds)
            got.extend((q, m) for m in leased)
            held = None if leased else ratelimit.throttled()
            if held is not None:
                self._held = held if self._held is None else min(self._held, held)
        self.backoff.reset()
        self._turn = (self._turn + 1) % len(self.queues)
        return got

    def _lease_fairly(self, ws: WorkSet, slots: int) -> list[tuple[Queue, Message]]:
        """A turn over the work set's queues with work: a bounded share from each."""
        got: list[tuple[Queue, Message]] = []
        turn = ws.rotation(self.db)
        share = max(FAIR_SHARE, slots // max(1, len(turn)))
        for q in turn:
            n = min(slots - len(got), share)
            if n <= 0:
                break
            try:
                leased = q.lease_many(self.db, n, self.lease_seconds)
            except QueueError as exc:
                if engine_failure(exc):
                    raise
                ws.avoid(self.db, q, exc)  # paused, or not ours to dequeue
                continue
            got.extend((q, m) for m in leased)
            ws.served(q, len(leased) >= n)
            if not leased:
                try:
                    ws.retire(self.db, q)
                except QueueError as exc:
                    log.debug("could not retire %r from the work index: %s", q.name, exc)
        self.backoff.reset()
        return got

    def _submit(self, pool: ThreadPoolExecutor, q: Queue, m: Message) -> None:
        with self._cond:
            c = self._pick()
            c.running += 1
            c.last_served = next(self._seq)
            self._running += 1
            self.stats.dispatched += 1
            self.stats.max_running = max(self.stats.max_running, self._running)
        pool.submit(self._call, c, q, m)

    def _call(self, c: Consumer, q: Queue, m: Message) -> None:
        ok = True
        self._registry.begin(q.name, m.id)
        try:
            tracing.run(q.name, m.id, m.headers, c.handler, m)
        except Exception as exc:
            ok = False
            if engine_failure(exc):  # the handler's own use of a failing store: not counted
                log.warning("consumer %s on %s: the engine failed: %s; released", c.name, m.id, exc)
                try:
                    q.release(self.db, m)
                except QueueError as err:
                    log.warning("could not release %s: %s", m.id, err)
            else:
                settle_failure(self.db, q, m, exc, log)  # Retry, Discard, or a logged failure
        if ok:
            try:
                q.ack(self.db, m)
            except QueueError as err:
                ok = False
                log.warning("could not ack %s: %s", m.id, err)
        self._registry.end(m.id)
        with self._cond:
            c.running -= 1
            self._running -= 1
            if ok:
                c.served += 1
                self.stats.acked += 1
                self.stats.per_consumer[c.name] += 1
                self.stats.per_queue[q.name] = self.stats.per_queue.get(q.name, 0) + 1
            else:
                c.failed += 1
                self.stats.nacked += 1
            self._cond.notify_all()

    def _maybe_sweep(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep >= self.sweep_interval:
            self._last_sweep = now
            queues = self.queues if self.workset is None else self.workset.take_recent()
            for q in queues:
                q.sweep(self.db)
