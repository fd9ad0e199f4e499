"""What a :class:`~fdbqueue.runtime.worker.Worker` holds and the steps both its modes share:
the turn over its queues, counting, sweeping, the idle wait on watches, and the settling of a
failed or timed-out delivery. The modes build on it: exactly once (``exactly_once.py``) and
lease mode (``worker.py``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, nullcontext
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.api.schedules import run_schedules as run_periodic_jobs
from fdbqueue.engines.contract import Database
from fdbqueue.errors import QueueError
from fdbqueue.ops import ratelimit
from fdbqueue.ops.settling import Settler
from fdbqueue.ops.waiting import QueueWatcher
from fdbqueue.runtime.fairness import WorkSet
from fdbqueue.runtime.handling import (
    Backoff,
    PrefetchBudget,
    WorkerStats,
    engine_failure,
    give_back,
    until_empty_wait,
)
from fdbqueue.runtime.hooks import DeadHook, nack_noting
from fdbqueue.runtime.registry import Registration, worker_counts
from fdbqueue.runtime.timelimit import time_limit_reason
from fdbqueue.store.rates import Rate, parse_rate
from fdbqueue.types import Message

log = logging.getLogger("fdbqueue.runtime.worker")  # one logger for the worker, whichever module


class WorkerBase:
    """The state of a worker (set by :class:`~fdbqueue.runtime.worker.Worker`'s constructor)
    and the steps both modes share."""

    db: Database
    workset: WorkSet | None  # a pattern or partitioned queue: fair turns
    queues: list[Queue]
    handler: Callable[..., Any]
    mode: str
    lease_seconds: float | None
    sweep_interval: float
    idle_timeout: float
    budget: PrefetchBudget
    stats: WorkerStats
    run_schedules: bool
    time_limit: float | None
    processes: int  # handlers in child processes (pool.py); 0: in threads
    backoff: Backoff
    _on_dead: DeadHook | None  # the handler's on_dead, written with a dead-lettering nack
    _settler: Settler[Queue] | None
    _exporter: Any  # metrics.Exporter while run() runs with a metrics_port
    _stop: threading.Event
    _lock: threading.Lock
    _waiting: threading.local  # each waiting thread's QueueWatcher
    _watchers: list[QueueWatcher]
    _turn: int
    _last_sweep: float
    _limit: int | None
    rate_limit: tuple[Rate, str | None] | None  # the worker's own limit and its bucket's name
    _held: float | None
    register: bool
    registry_interval: float
    _registry: Registration

    # -- rate limits and the registry (ops/ratelimit.py, runtime/registry.py) --------------------

    def _rate_limited(self) -> AbstractContextManager[None]:
        """Around a lease: the worker's own ``rate_limit`` applies to it too."""
        if self.rate_limit is None:
            return nullcontext()
        rate, key = self.rate_limit
        return ratelimit.extra(rate, key)

    def _note_throttle(self) -> None:
        """After a lease that got nothing: remember whether a rate limit held it back."""
        held = ratelimit.throttled()
        if held is not None:
            with self._lock:
                self._held = held if self._held is None else min(self._held, held)

    def _throttle_pause(self) -> bool:
        """Nothing leased because a rate limit held it back: wait for its next token (not on
        the queues' watches, which say messages are ready and would wake at once)."""
        with self._lock:
            held, self._held = self._held, None
        if held is None:
            return False
        self._flush_acks()
        self._stop.wait(min(held, max(self.idle_timeout, 0.001)))
        return True

    def _registration(self) -> Registration:
        names = [self.workset.name] if self.workset is not None else [q.name for q in self.queues]
        root = self.workset.root if self.workset is not None else self.queues[0].root
        return Registration(
            self.db,
            type(self).__name__,
            names,
            worker_counts(self.stats, self._lock),
            concurrency=getattr(self, "concurrency", 1),
            interval=self.registry_interval,
            enabled=self.register,
            root=root,
        )

    def stop(self) -> None:
        """Ask the worker to finish the message in hand and return from :meth:`run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def _flush_acks(self, *, close: bool = False) -> None:
        """Commit the acks waiting in the settler now (and stop its thread with ``close``)."""
        settler = self._settler
        if settler is None:
            return
        if close:
            self._settler = None
            settler.close()
        else:
            settler.flush()

    def _observe(self, q: Queue, began: float, outcome: str) -> None:
        """The handler's duration, for ``fdbqueue_handler_duration_seconds``."""
        if self._exporter is not None:
            self._exporter.durations.labels(q.name, outcome).observe(time.perf_counter() - began)

    def _release(self, q: Queue, m: Message) -> None:
        give_back(self.db, q, m, self.stats, log)

    def _rotation(self) -> Iterator[Queue]:
        """Every queue once, starting one further each round: fair between queues. A work
        set's turn: the queues with work now, starting after the one served last."""
        if self.workset is not None:
            try:
                yield from self.workset.rotation(self.db)
            except QueueError as exc:
                if not engine_failure(exc):
                    raise
                self.backoff.wait("reading the work index", exc, self._stop)
            return
        with self._lock:
            start = self._turn
            self._turn = (self._turn + 1) % len(self.queues)
        for i in range(len(self.queues)):
            yield self.queues[(start + i) % len(self.queues)]

    def _count(self, q: Queue, ok: bool, *, too_slow: bool = False, n: int = 1) -> bool:
        """Record ``n`` handled messages; True when the worker should stop (max_messages)."""
        with self._lock:
            if ok:
                self.stats.processed += n
                self.stats.per_queue[q.name] = self.stats.per_queue.get(q.name, 0) + n
            else:
                self.stats.failed += n
                self.stats.too_slow += too_slow
            self.budget.egress.add(n)
            done = self.stats.processed + self.stats.failed
            if self._limit is not None and done >= self._limit:
                self._stop.set()
                return True
        return False

    def _maybe_sweep(self) -> None:
        now = time.monotonic()
        if now - self._last_sweep < self.sweep_interval:
            return
        self._last_sweep = now
        if self.run_schedules:
            try:
                self.stats.scheduled += run_periodic_jobs(self.db)
            except QueueError as exc:
                log.warning("periodic jobs failed: %s", exc)
        queues = self.queues if self.workset is None else self.workset.take_recent()
        for q in queues:
            try:
                st = q.sweep(self.db)
                self.stats.swept += st.total()
            except QueueError as exc:
                if engine_failure(exc):
                    self.backoff.wait(f"sweep of {q.name!r}", exc, self._stop)
                    return
                log.warning("sweep of %r failed: %s", q.name, exc)

    def _idle(self, until_empty: bool) -> None:
        """Nothing was ready: ack what is done, sweep if due, then wait on the queues' watches."""
        self._flush_acks()
        self._maybe_sweep()
        try:
            if self.workset is not None:
                if until_empty and self.workset.drained(self.db):
                    self._stop.set()
                    return
                woke = self.workset.wait(self.db, self.idle_timeout, self._stop)
            else:
                timeout: float | None = self.idle_timeout
                if until_empty:
                    timeout = until_empty_wait(self.db, self.queues, self.idle_timeout)
                    if timeout is None:
                        self._stop.set()
                        return
                woke = self._watcher().wait(timeout, self._stop)
        except QueueError as exc:
            if not engine_failure(exc):
                raise
            self.backoff.wait("waiting on the queues", exc, self._stop)
            return
        with self._lock:
            self.stats.wakeups += woke

    def _watcher(self) -> QueueWatcher:
        """This thread's watcher: its watches outlive each idle wait (no rebuild per wait)."""
        watcher: QueueWatcher | None = getattr(self._waiting, "watcher", None)
        if watcher is None:
            watcher = self._waiting.watcher = QueueWatcher(self.db, [q.keys for q in self.queues])
            with self._lock:
                self._watchers.append(watcher)
        return watcher

    def _served(self, q: Queue, any_: bool, *, full: bool = False) -> None:
        """A work set's queue had its turn; one that gave nothing leaves the index (a failure
        to retire it only costs another visit); one that gave all that was asked (``full``)
        may hold more: another consumer is woken."""
        if self.workset is None:
            return
        self.workset.served(q, full)
        if not any_:
            try:
                self.workset.retire(self.db, q)
            except QueueError as exc:
                log.debug("could not retire %r from the work index: %s", q.name, exc)

    def _give_back(
        self, q: Queue, m: Message, reason: str, *, delay: float | None = None, discard: bool = False
    ) -> None:
        """Nack the leased ``m`` (its delivery is counted): back after ``delay`` (None: the
        queue's retry delay), or to the error queue at max_deliveries or with ``discard``."""
        try:
            nack_noting(self.db, q, m, reason=reason, delay=delay, discard=discard, on_dead=self._on_dead)
        except QueueError as err:  # the lease ran out meanwhile: the sweep counted it already
            log.warning("could not nack %s on %r: %s", m.id, q.name, err)

    def _tally(self, kind: str) -> None:
        with self._lock:
            self.stats.retried += kind == "retried"
            self.stats.discarded += kind == "discarded"

    def _timed_out(self, q: Queue, m: Message, began: float) -> str:
        """``m``'s handler ran past ``time_limit``: a failed delivery, logged and counted."""
        assert self.time_limit is not None
        log.warning(
            "handler on queue %r, message %s (delivery %d) ran past its time limit of %g s: %s",
            q.name,
            m.id,
            m.deliveries,
            self.time_limit,
            "its child process is killed and the message released as a failed delivery"
            if self.processes
            else "its thread is abandoned (Python cannot stop a thread) and the message released as a "
            "failed delivery"
            if self.mode == "lease"
            else "its transaction is aborted and the delivery counts as failed",
            extra={"queue": q.name, "message_id": m.id, "deliveries": m.deliveries},
        )
        self._observe(q, began, "timed_out")
        self._give_back(q, m, time_limit_reason(self.time_limit))
        with self._lock:
            self.stats.timed_out += 1
        return "failed"


def rate_limits(rate_limit: object, key: object) -> tuple[Rate, str | None] | None:
    """A worker's ``rate_limit`` and ``rate_limit_key``, checked: None when it has none."""
    if rate_limit is None:
        if key is not None:
            raise QueueError("rate_limit_key names the bucket of a rate_limit: give rate_limit too")
        return None
    if key is not None and (not isinstance(key, str) or not key):
        raise QueueError(f"rate_limit_key must be a non-empty str or None, got {key!r}")
    return parse_rate(rate_limit), key
