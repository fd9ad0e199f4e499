"""Workers: run a handler over one or more queues, exactly once or in lease mode.

* ``mode="exactly_once"`` (or ``"exactly-once"``): the message's removal and the handler's
  writes are one transaction; the handler is called as ``handler(tr, message)``. Each call is
  first claimed in a transaction of its own (a short lease: the delivery is counted before
  the handler runs), so an exception aborts the handler's transaction and the failed
  delivery stays counted: a message that keeps failing is called at most ``max_deliveries``
  times however many workers run at once (a transaction the engine runs again after a
  conflict repeats the same delivery), then reaches the error queue with the exception's
  text as the reason. The handler
  must finish within FoundationDB's 5-second transaction limit: past it the commit fails
  (1007), which is logged, counted (``stats.too_slow``) and kept as the reason. On the
  embedded engine (one writer) these handlers run one at a time, whatever ``concurrency`` says.
* ``mode="lease"``: the handler is called as ``handler(message)`` outside any transaction;
  returning acks the message, raising nacks it with the exception as the reason.
* ``time_limit=S``: a lease-mode call past S seconds is given up: its lease is no longer
  renewed and the message is nacked as a failed delivery (reason ``"time_limit: ..."``; the
  error queue at max_deliveries); Python cannot stop a thread, so the call's thread is
  abandoned, its late result ignored (its receipt is stale), and the slot goes on with the
  next message; at most ``2 * concurrency`` abandoned threads live at once (past that a slot
  waits for one to end). In exactly-once mode the call runs in the worker's thread, inside its transaction:
  one that returns after S seconds has its transaction aborted and counts as failed (the
  5-second transaction limit applies anyway).

Every handler failure is logged once with its traceback (``extra``: queue, message_id,
deliveries) and counted in ``stats.failed``. A handler of the wrong arity is refused at
construction. An idle worker waits on watches (no polling, no spurious wake-ups), bounded
by the queues' next deadlines. SIGTERM / SIGINT stop it gracefully: the message in hand is
finished and settled, prefetched ones are released (not counted as deliveries). In lease
mode the worker prefetches a batch; its size follows the measured ingress and egress rates
within bounds, as RabbitMQ's variable queue sizes its memory (``rabbit_variable_queue.erl``).
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.api.schedules import run_schedules as run_periodic_jobs
from fdbqueue.engines.contract import TRANSACTION_WINDOW_SECONDS, Database
from fdbqueue.errors import EngineError, QueueError, StopNow
from fdbqueue.errors import HandlerSignatureError as HandlerSignatureError  # re-export
from fdbqueue.ops import tracing
from fdbqueue.ops.delivery import TOO_OLD_REASON, LeaseError
from fdbqueue.ops.settling import Settler, lease_settling
from fdbqueue.ops.txn import run_once
from fdbqueue.ops.waiting import QueueWatcher
from fdbqueue.runtime.fairness import FAIR_SHARE
from fdbqueue.runtime.handling import MODES as MODES  # re-export
from fdbqueue.runtime.handling import (
    Backoff,
    Heartbeat,
    PrefetchBudget,
    Queues,
    TimeLimit,
    _as_queues,
    check_handler,
    check_time_limit,
    engine_failure,
    give_back,
    judge,
    settle_failure,
    time_limit_reason,
    until_empty_wait,
    work_set_of,
)
from fdbqueue.runtime.handling import WorkerStats as WorkerStats  # re-export
from fdbqueue.runtime.handling import normalise_mode as normalise_mode  # re-export
from fdbqueue.runtime.handling import wait_any as wait_any  # re-export
from fdbqueue.store.clock import db_now, seconds_of
from fdbqueue.store.config import check_duration
from fdbqueue.store.record import Message
from fdbqueue.types import check_flag

log = logging.getLogger("fdbqueue.runtime.worker")

SETTLE_BATCH = 256  # acks a batch holds at most before it commits without waiting
IO_BATCH = 64  # page in batches: not so large that the queue blocks, nor so small it thrashes
# How long an exactly-once claim hides its message: past FoundationDB's 5-second transaction
# window (the handler's transaction cannot outlive it) with room for the wait for a writer and
# the nack after a failure. A worker that dies holding a claim delays its message this long.
CLAIM_SECONDS = 2 * TRANSACTION_WINDOW_SECONDS


class Worker:
    """Run ``handler`` over ``queues`` until stopped (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        queues: Queues,
        handler: Callable[..., Any],
        *,
        mode: str = "lease",
        concurrency: int = 1,
        lease_seconds: float | None = None,
        sweep_interval: float = 5.0,
        idle_timeout: float = 1.0,
        prefetch: tuple[int, int] = (1, 256),
        heartbeat: bool = True,
        shutdown_timeout: float | None = None,
        metrics_port: int | None = None,
        run_schedules: bool = False,
        settle_linger: float = 0.005,
        time_limit: float | None = None,
    ) -> None:
        mode = normalise_mode(mode)
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise QueueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if mode == "exactly_once":
            how = "exactly_once handlers are called as handler(tr, message), inside the transaction"
            check_handler(handler, 2, how)
        else:
            how = "lease handlers are called as handler(message), outside any transaction"
            check_handler(handler, 1, how + " (handler(tr, message) is mode='exactly_once')")
        self.db = db
        self.workset = work_set_of(queues)  # a pattern or partitioned queue: fair turns
        self.queues = [] if self.workset is not None else _as_queues(queues)
        self.handler = handler
        self.mode = mode
        self.concurrency = concurrency
        self.lease_seconds = (
            None if lease_seconds is None else check_duration("lease_seconds", lease_seconds, positive=True)
        )
        self.sweep_interval = check_duration("sweep_interval", sweep_interval)
        self.idle_timeout = check_duration("idle_timeout", idle_timeout)
        self.budget = PrefetchBudget(*prefetch)
        self.stats = WorkerStats(per_queue={q.name: 0 for q in self.queues})
        self.heartbeat = check_flag("heartbeat", heartbeat)
        self.shutdown_timeout = (
            None if shutdown_timeout is None else check_duration("shutdown_timeout", shutdown_timeout)
        )
        self._beat = Heartbeat(db, self.stats, log)
        port = metrics_port
        if port is not None and (type(port) is not int or not 0 <= port <= 65535):  # bool is no port
            raise QueueError(f"metrics_port must be an int from 0 to 65535 or None, got {metrics_port!r}")
        self.metrics_port = metrics_port  # 0 takes a free port: run() puts the one taken here
        self.run_schedules = check_flag("run_schedules", run_schedules)  # periodic jobs too, at sweeps
        # Lease mode acks in batches: a finished message waits up to settle_linger for others
        # (or for the next lease, in the same transaction); 0 acks each at once.
        self.settle_linger = check_duration("settle_linger", settle_linger)
        self._settler: Settler[Queue] | None = None
        # Handler calls past time_limit are abandoned (lease mode): see TimeLimit.
        self.time_limit = check_time_limit(time_limit)
        self._limiter: TimeLimit | None = None
        self._exporter: Any = None  # metrics.Exporter while run() runs with a metrics_port
        self._forced = False  # stopped at once (StopNow): handler threads are not waited for
        self.backoff = Backoff(log)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._waiting = threading.local()  # each waiting thread's QueueWatcher
        self._watchers: list[QueueWatcher] = []
        self._turn = 0
        self._last_sweep = 0.0
        self._limit: int | None = None

    # -- control -------------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask the worker to finish the message in hand and return from :meth:`run`."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def run(
        self, *, max_messages: int | None = None, until_empty: bool = False, install_signals: bool = False
    ) -> WorkerStats:
        """Process messages until :meth:`stop`, SIGTERM/SIGINT (with ``install_signals``),
        ``max_messages`` handled, or - with ``until_empty`` - nothing is ready or delayed."""
        self._limit = max_messages
        self._stop.clear()
        self._forced = False
        if self.metrics_port is not None and self._exporter is None:
            from fdbqueue.runtime.metrics import serve

            self._exporter = serve(self.db, self.metrics_port, "0.0.0.0")  # scraped from elsewhere
            self.metrics_port = self._exporter.port
            log.info("fdbqueue: worker metrics on http://0.0.0.0:%d/metrics", self.metrics_port)
        previous: dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, self._on_signal)
        try:
            if self.mode == "exactly_once":
                self._run_threads(lambda: self._exactly_once_loop(until_empty))
            else:
                if self.settle_linger > 0:
                    self._settler = Settler(self.db, self.settle_linger, SETTLE_BATCH, self._settled)
                if self.time_limit is not None:
                    self._limiter = TimeLimit(self.time_limit, 2 * self.concurrency, log)
                self._run_lease(until_empty)
        except StopNow:
            self._forced = True
            self._stop.set()
            for q, m in self._beat.held():  # in hand in other threads: back, not counted
                self._release(q, m)
            log.warning("worker stopped at once: the messages in hand went back to their queues")
        finally:
            self._flush_acks(close=True)
            if self._limiter is not None:
                self._limiter.close()
                self._limiter = None
            self._beat.close()
            self._beat = Heartbeat(self.db, self.stats, log)
            if self._exporter is not None:
                self._exporter.close()
                self._exporter = None
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            with self._lock:
                watchers, self._watchers = self._watchers, []
                self._waiting = threading.local()  # a later run starts with fresh watchers
            for watcher in watchers:
                watcher.close()
        self.stats.prefetch = self.budget.size
        self.stats.backoffs = self.backoff.count
        self.stats.ingress_rate = self.budget.ingress.tick()
        self.stats.egress_rate = self.budget.egress.tick()
        return self.stats

    def _on_signal(self, signum: int, _frame: Any) -> None:
        """SIGTERM/SIGINT: the first stops gracefully (bounded by ``shutdown_timeout``), a
        second stops at once."""
        if self.stopping:
            raise StopNow
        self.stop()
        if self.shutdown_timeout is not None:
            # The same signal again when the grace period ends, sent to the main thread:
            # there it interrupts a blocking call (EINTR) and Python runs its handlers.
            main = threading.main_thread().ident or 0
            timer = threading.Timer(self.shutdown_timeout, signal.pthread_kill, (main, signum))
            timer.daemon = True
            timer.start()

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

    def _stop_at_limit(self) -> None:
        """``max_messages``: counting the handled messages whose acks are still batched."""
        settler = self._settler
        if self._limit is None or settler is None:
            return
        with self._lock:
            handled = self.stats.processed + self.stats.failed
        if handled + settler.unsettled() >= self._limit:
            self._stop.set()

    def _settled(self, q: Queue, acked: int, lost: list[Message]) -> None:
        """A batch of acks committed; ``lost``: messages whose lease had gone before it did."""
        if acked:
            self._count(q, True, n=acked)  # a batch counted under the lock once, not per message
        for m in lost:
            with self._lock:
                self.stats.ack_lost += 1
            log.warning(
                "could not ack %s on %r: its lease had gone; it will be delivered again", m.id, q.name
            )

    def _observe(self, q: Queue, began: float, outcome: str) -> None:
        """The handler's duration, for ``fdbqueue_handler_duration_seconds``."""
        if self._exporter is not None:
            self._exporter.durations.labels(q.name, outcome).observe(time.perf_counter() - began)

    def _release(self, q: Queue, m: Message) -> None:
        give_back(self.db, q, m, self.stats, log)

    def _run_threads(self, loop: Callable[[], None]) -> None:
        threads = [threading.Thread(target=loop, daemon=True) for _ in range(self.concurrency - 1)]
        for t in threads:
            t.start()
        loop()
        for t in threads:
            t.join()

    # -- shared --------------------------------------------------------------------------------

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

    # -- exactly once --------------------------------------------------------------------------

    def _exactly_once_loop(self, until_empty: bool) -> None:
        while not self.stopping:
            progressed = False
            for q in self._rotation():
                if self.stopping:
                    return
                try:
                    outcome = self._exactly_once_step(q)
                except QueueError as exc:  # not the handler's: the dequeue itself failed
                    if engine_failure(exc):
                        self.backoff.wait(f"dequeue from {q.name!r}", exc, self._stop)
                    elif self.workset is not None:
                        self.workset.avoid(self.db, q, exc)
                    else:
                        log.warning("could not dequeue from %r: %s", q.name, exc)
                    continue
                if outcome == "skip":
                    continue  # backed off in the step, or the claim lost: nothing counted
                self._served(q, outcome is not None)
                self.backoff.reset()
                if outcome is not None:
                    progressed = True
                    if self._count(q, outcome == "ok", too_slow=outcome == "too_slow"):
                        return
            if not progressed:
                self._idle(until_empty)

    def _exactly_once_step(self, q: Queue) -> str | None:
        """Claim the next message of ``q``, then run the handler and remove the message in
        one transaction, retried as ``@transactional`` retries (a conflict runs both again).

        The claim is a short lease taken in a transaction of its own: it counts the delivery
        before the handler runs, and hides the message from the other workers meanwhile. The
        handler's transaction aborts when it fails, so a count written there would be undone;
        one written after it (as an in-transaction ``dequeue`` does) let concurrent workers
        each take the same message as its first delivery. A claim that the handler's
        transaction does not settle ends as a failure (a nack with the reason), as a release
        when the engine failed (not counted), or, if this process dies, when the claim runs
        out (counted).

        Returns None when nothing was ready, ``"ok"`` when it committed, ``"failed"`` when
        the handler raised, ran past ``time_limit`` or its transaction could not commit,
        ``"too_slow"`` when the transaction outlived the 5-second limit (1007), ``"skip"``
        when nothing is counted here (the engine failed: backed off; or the claim was lost).
        """
        m = q.lease(self.db, self.lease_seconds or CLAIM_SECONDS)
        if m is None:
            return None
        tr = self.db.create_transaction()
        unknown = False  # an attempt ended in commit_unknown_result: it may have landed
        try:
            while True:
                begun = db_now(tr)
                try:
                    try:
                        q.ack(tr, m)  # the message goes when, and only if, tr commits
                    except LeaseError:
                        if unknown:
                            return "ok"  # the attempt that ended unknown committed
                        log.warning("the claim on %s of %r ran out before its handler began", m.id, q.name)
                        return "skip"
                    began = time.perf_counter()
                    tracing.run(q.name, m.id, m.headers, self.handler, tr, m)
                    if self.time_limit is not None and time.perf_counter() - began > self.time_limit:
                        tr.cancel()
                        return self._timed_out(q, m, began)
                    self._observe(q, began, "ok")
                    tr.commit()
                    return "ok"
                except EngineError as exc:
                    if exc.code == 1007:
                        # Ended first: measuring takes a transaction, which must not nest
                        # inside this one (the embedded engine's single writer).
                        tr.cancel()
                        if not self._outlived(begun):  # within the window (a recovery): again
                            tr.reset()
                            continue
                        log.warning(
                            "handler on queue %r, message %s (delivery %d) outlived FoundationDB's "
                            "5-second transaction limit (1007 transaction_too_old): its writes were "
                            "not committed and the delivery counts as failed; keep exactly-once "
                            "handlers well under 5 s, or use mode='lease'",
                            q.name,
                            m.id,
                            m.deliveries,
                            extra={"queue": q.name, "message_id": m.id, "deliveries": m.deliveries},
                        )
                        self._give_back(q, m, TOO_OLD_REASON)
                        return "too_slow"
                    if exc.retryable:
                        unknown = unknown or exc.maybe_committed
                        try:
                            tr.on_error(exc)
                            continue
                        except EngineError as final:  # out of retries
                            exc = final
                    if engine_failure(exc):
                        return self._engine_failed(tr, q, m, exc)
                    return self._failed(tr, q, m, exc)
                except StopNow:
                    tr.cancel()
                    self._release(q, m)  # back where it was, the delivery not counted
                    raise
                except Exception as exc:
                    if engine_failure(exc):  # the commit, or the handler's own reads and writes
                        return self._engine_failed(tr, q, m, exc)
                    return self._failed(tr, q, m, exc)  # a failure, or a Retry or Discard
        finally:
            tr.cancel()

    def _engine_failed(self, tr: Any, q: Queue, m: Message, exc: BaseException) -> str:
        """The engine failed around ``m``'s handling: abort, give the claim back without
        counting the delivery, then back off."""
        tr.cancel()
        self._release(q, m)
        self.backoff.wait(f"exactly-once handling of {m.id} on {q.name!r}", exc, self._stop)
        return "skip"

    def _failed(self, tr: Any, q: Queue, m: Message, exc: BaseException) -> str:
        """The handler (or its commit) failed on ``m``: abort, then settle the claim as
        :func:`judge` says (the delivery is counted already)."""
        tr.cancel()
        outcome = judge(exc, q, m, log)
        self._give_back(q, m, outcome.reason, delay=outcome.delay, discard=outcome.discard)
        self._tally(outcome.kind)
        return "failed"

    def _timed_out(self, q: Queue, m: Message, began: float) -> str:
        """``m``'s handler ran past ``time_limit``: a failed delivery, logged and counted."""
        assert self.time_limit is not None
        log.warning(
            "handler on queue %r, message %s (delivery %d) ran past its time limit of %g s: %s",
            q.name,
            m.id,
            m.deliveries,
            self.time_limit,
            "its thread is abandoned (Python cannot stop a thread) and the message released as a "
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

    def _give_back(
        self, q: Queue, m: Message, reason: str, *, delay: float | None = None, discard: bool = False
    ) -> None:
        """Nack the leased ``m`` (its delivery is counted): back after ``delay`` (None: the
        queue's retry delay), or to the error queue at max_deliveries or with ``discard``."""
        try:
            q.nack(self.db, m, delay=delay, reason=reason, discard=discard)
        except QueueError as err:  # the lease ran out meanwhile: the sweep counted it already
            log.warning("could not nack %s on %r: %s", m.id, q.name, err)

    def _tally(self, kind: str) -> None:
        with self._lock:
            self.stats.retried += kind == "retried"
            self.stats.discarded += kind == "discarded"

    def _outlived(self, begun: int) -> bool:
        """True when the transaction that read at version ``begun`` is now past the
        5-second window, by database time (a fresh read version)."""
        now = run_once(self.db, lambda t, _: db_now(t))
        return seconds_of(now - begun) > TRANSACTION_WINDOW_SECONDS

    # -- lease mode ----------------------------------------------------------------------------

    def _run_lease(self, until_empty: bool) -> None:
        if self.concurrency == 1:
            self._lease_loop(until_empty)
            return
        buffer: deque[tuple[Queue, Message]] = deque()
        lock = threading.Lock()
        # Two conditions on one lock, each notified only for its own waiters: handlers wait
        # for work, the fetcher for room (or for everything to settle).
        work = threading.Condition(lock)
        room = threading.Condition(lock)
        busy = [0]

        def low_water() -> int:
            # Refill at half the budget, not at every free slot: a lease transaction per
            # handled message would double the commits (and fsyncs) per message.
            return max(self.concurrency, self.budget.size // 2)

        def handle_loop() -> None:
            while True:
                with lock:
                    while not buffer and not self.stopping:
                        work.wait(0.25)
                    if self.stopping:
                        return
                    q, m = buffer.popleft()
                    busy[0] += 1
                    if len(buffer) == low_water():
                        room.notify()
                try:
                    self._handle_leased(q, m)
                finally:
                    with lock:
                        busy[0] -= 1
                        if not buffer and not busy[0]:
                            room.notify()

        handlers = [threading.Thread(target=handle_loop, daemon=True) for _ in range(self.concurrency)]
        for t in handlers:
            t.start()
        try:
            while not self.stopping:
                with lock:
                    if len(buffer) > low_water():
                        room.wait(0.05)
                        continue
                    want = self.budget.size - len(buffer)
                got = self._fetch(want)
                if got:
                    with lock:
                        buffer.extend(got)
                        work.notify(len(got))
                    continue
                with lock:
                    idle = not buffer and busy[0] == 0
                if idle:
                    self._idle(until_empty)
                else:
                    with lock:
                        room.wait(0.05)
        except StopNow:
            self._forced = True
            raise
        finally:
            self._stop.set()
            with lock:
                work.notify_all()
            if not self._forced:  # at once: handlers still running are not waited for
                for t in handlers:
                    t.join()
            self._release_unstarted(buffer)

    def _lease_loop(self, until_empty: bool) -> None:
        """One handler: fetch a batch, handle it in this thread, fetch again.

        A fetching thread beside a single handler buys no overlap under the GIL, and the
        two take turns at the embedded engine's single writer: this is about twice as fast.
        """
        buffer: deque[tuple[Queue, Message]] = deque()
        try:
            while not self.stopping:
                if not buffer:
                    buffer.extend(self._fetch(self.budget.size))
                    if not buffer:
                        self._idle(until_empty)
                    continue
                q, m = buffer.popleft()
                self._handle_leased(q, m)
        finally:
            self._release_unstarted(buffer)

    def _release_unstarted(self, buffer: deque[tuple[Queue, Message]]) -> None:
        for q, m in buffer:  # prefetched, never started: back without counting a delivery
            self._release(q, m)
        buffer.clear()

    def _served(self, q: Queue, any_: bool) -> None:
        """A work set's queue had its turn; one that gave nothing leaves the index (a failure
        to retire it only costs another visit)."""
        if self.workset is None:
            return
        self.workset.served(q)
        if not any_:
            try:
                self.workset.retire(self.db, q)
            except QueueError as exc:
                log.debug("could not retire %r from the work index: %s", q.name, exc)

    def _fetch(self, want: int) -> list[tuple[Queue, Message]]:
        got: list[tuple[Queue, Message]] = []
        turn = list(self._rotation())
        # A work set's fair share: a bounded batch from each queue of the turn (QuiCK).
        share = IO_BATCH if self.workset is None else max(FAIR_SHARE, want // max(1, len(turn)))
        for q in turn:
            n = min(want - len(got), IO_BATCH, share)
            if n <= 0 or self.stopping:
                break
            try:
                leased = self._lease(q, n)
            except QueueError as exc:
                if self.workset is not None and not engine_failure(exc):
                    self.workset.avoid(self.db, q, exc)  # paused, or not ours to dequeue
                    continue
                if not engine_failure(exc):
                    raise
                self.backoff.wait(f"lease from {q.name!r}", exc, self._stop)
                return got
            got.extend((q, m) for m in leased)
            self._served(q, bool(leased))
        self.backoff.reset()
        self.budget.ingress.add(len(got))
        return got

    def _lease(self, q: Queue, n: int) -> list[Message]:
        """Lease up to ``n`` of ``q``; the acks waiting in the settler commit in the same
        transaction (one commit for a batch's acks and the next batch's leases)."""
        return lease_settling(self.db, self._settler, q, n, self.lease_seconds)

    def _handle_leased(self, q: Queue, m: Message) -> None:
        lease = self.lease_seconds
        if m.lease_deadline is not None:
            left = m.lease_deadline - time.time()
            lease = self.lease_seconds or max(1.0, 2 * left)
            if left < lease / 2:  # sat in the prefetch buffer: renew before starting
                try:
                    m = q.extend(self.db, m, lease)
                except QueueError:
                    return  # lost while waiting: the sweep hands it out again
        if self.heartbeat and lease is not None:
            self._beat.hold(q, m, lease)
        began = time.perf_counter()
        try:
            if self._limiter is None:
                tracing.run(q.name, m.id, m.headers, self.handler, m)
            elif not self._limiter.run(self._stop, tracing.run, q.name, m.id, m.headers, self.handler, m)[0]:
                self._beat.drop(m)  # renewed no more: past its limit the message is released
                self._timed_out(q, m, began)
                self._count(q, False)
                return
        except StopNow:
            self._beat.drop(m)
            self._release(q, m)  # stopped at once: back, the delivery not counted
            raise
        except Exception as exc:
            self._beat.drop(m)
            if engine_failure(exc):  # the handler's own use of a failing store
                self._release(q, m)  # back without counting a delivery
                self.backoff.wait(f"handler on {m.id} of {q.name!r}", exc, self._stop)
                return
            kind = settle_failure(self.db, q, m, exc, log)
            self._observe(q, began, kind)
            self._tally(kind)
            self._count(q, False)
            return
        self._beat.drop(m)
        self._observe(q, began, "ok")
        if self._settler is not None:  # acked with others, within settle_linger
            self._settler.add(q, m)
            self._stop_at_limit()
            return
        try:
            q.ack(self.db, m)
        except QueueError as err:
            if engine_failure(err):  # the lease runs out and the message comes back
                self.backoff.wait(f"ack of {m.id} on {q.name!r}", err, self._stop)
            else:
                log.warning("could not ack %s: %s", m.id, err)
            return
        self._count(q, True)
