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
  next message. At most ``2 * concurrency`` calls, running or abandoned, live at once, and
  the worker leases a message only when a call may start (never one for a slot that cannot
  run it). When abandoned threads take every place (a handler that ignores its time limit)
  it holds no message - others take them - and waits for one to end, logging what to do;
  with ``until_empty`` it returns once the queues hold nothing. In exactly-once mode the call
  runs in the worker's thread, inside its transaction:
  one that returns after S seconds has its transaction aborted and counts as failed (the
  5-second transaction limit applies anyway).
* ``processes=N`` (lease mode): handlers run in ``N`` child processes, one call at a time
  each, while this process leases, renews and settles (``fdbqueue/runtime/pool.py``: the
  handler must be picklable; a ``Retry``, ``Discard`` or exception crosses back as an
  outcome and is settled as here). ``time_limit`` then kills the child past the limit;
  ``max_tasks_per_child`` and ``max_memory_per_child`` (bytes, or ``"512MB"``) replace
  children; a message whose child dies is a failed delivery, never lost.

Every handler failure is logged once with its traceback (``extra``: queue, message_id,
deliveries) and counted in ``stats.failed``. A handler of the wrong arity is refused at
construction. An idle worker waits on watches (no polling, no spurious wake-ups), bounded
by the queues' next deadlines. SIGTERM / SIGINT stop it gracefully: the message in hand is
finished and settled, prefetched ones are released (not counted as deliveries). In lease
mode the worker prefetches a batch; its size follows the measured ingress and egress rates
within bounds, as RabbitMQ's variable queue sizes its memory (``rabbit_variable_queue.erl``).
"""

from __future__ import annotations

import signal
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database
from fdbqueue.errors import QueueError, StopNow
from fdbqueue.ops import tracing
from fdbqueue.ops.settling import AfterAck, Settler, lease_settling
from fdbqueue.runtime.exactly_once import ExactlyOnce
from fdbqueue.runtime.fairness import FAIR_SHARE
from fdbqueue.runtime.handling import (
    Backoff,
    Heartbeat,
    PrefetchBudget,
    Queues,
    WorkerStats,
    _as_queues,
    check_handler,
    engine_failure,
    normalise_mode,
    settle_failure,
    until_empty_wait,
    work_set_of,
)
from fdbqueue.runtime.hooks import ack_after, dead_hook, log_refused
from fdbqueue.runtime.pool import OK, TIMED_OUT, UNAVAILABLE, ProcessPool, check_processes, pool_settings
from fdbqueue.runtime.registry import DEFAULT_INTERVAL
from fdbqueue.runtime.timelimit import TimeLimit, check_time_limit
from fdbqueue.runtime.worker_base import log, rate_limits
from fdbqueue.types import Message, check_duration, check_flag

SETTLE_BATCH = 256  # acks a batch holds at most before it commits without waiting
IO_BATCH = 64  # page in batches: not so large that the queue blocks, nor so small it thrashes
STALL_LOG_EVERY = 60.0  # seconds between the log lines of a worker stalled by abandoned threads


class Worker(ExactlyOnce):
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
        processes: int = 0,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | str | None = None,
        rate_limit: str | None = None,
        rate_limit_key: str | None = None,
        register: bool = True,
        registry_interval: float = DEFAULT_INTERVAL,
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
        self.processes = check_processes(processes)
        self._pool_settings = pool_settings(
            self.processes, mode, concurrency, handler, max_tasks_per_child, max_memory_per_child
        )
        concurrency = self.processes or concurrency  # a handler slot per child
        self.db = db
        self.workset = work_set_of(queues)  # a pattern or partitioned queue: fair turns
        self.queues = [] if self.workset is not None else _as_queues(queues)
        self.handler = handler
        self._on_dead = dead_hook(handler)  # e.g. a task's failure result, with the dead letter
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
        self._pool: ProcessPool | None = None  # while run() runs with processes
        self._stall_logged = float("-inf")  # monotonic time of the last stall warning
        self._exporter = None  # metrics.Exporter while run() runs with a metrics_port
        self._forced = False  # stopped at once (StopNow): handler threads are not waited for
        self.backoff = Backoff(log)
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._waiting = threading.local()  # each waiting thread's QueueWatcher
        self._watchers = []
        self._turn = 0
        self._last_sweep = 0.0
        self._limit = None
        # rate_limit: this worker's leases also take from a bucket shared by every worker
        # that names it (ops/ratelimit.py); the registry: who runs, shown by workers(db).
        self.rate_limit = rate_limits(rate_limit, rate_limit_key)
        self._held: float | None = None  # seconds until a rate limit grants a token
        self.register = check_flag("register", register)
        self.registry_interval = check_duration("registry_interval", registry_interval, positive=True)
        self._registry = self._registration()

    # -- control -------------------------------------------------------------------------------

    def run(
        self, *, max_messages: int | None = None, until_empty: bool = False, install_signals: bool = False
    ) -> WorkerStats:
        """Process messages until :meth:`stop`, SIGTERM/SIGINT (with ``install_signals``),
        ``max_messages`` handled, or - with ``until_empty`` - nothing is ready or delayed."""
        self._limit = max_messages
        self._stop.clear()
        self._stall_logged = float("-inf")
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
        self._registry = self._registration()
        try:
            self._registry.start()
            if self.mode == "exactly_once":
                self._run_threads(lambda: self._exactly_once_loop(until_empty))
            else:
                if self.settle_linger > 0:
                    self._settler = Settler(
                        self.db,
                        self.settle_linger,
                        SETTLE_BATCH,
                        self._settled,
                        self._on_dead,
                        self._after_refused,
                    )
                if self._pool_settings is not None:  # before any lease: a handler that
                    self._pool = ProcessPool(  # cannot load in a child is an error here
                        self._pool_settings, time_limit=self.time_limit, logger=log
                    )
                    self._pool.start()
                elif self.time_limit is not None:
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
            if self._pool is not None:  # idle children exit; at once: all are killed
                self._pool.close(kill=self._forced)
                self._pool = None
            if self._limiter is not None:
                self._limiter.close()
                self._limiter = None
            self._beat.close()
            self._beat = Heartbeat(self.db, self.stats, log)
            self._registry.close()
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
            if self.workset is not None:
                self.workset.leave(self.db)
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

    def _after_refused(self, q: Queue, m: Message, reason: str) -> None:
        """``m``'s handler returned, but what it asked to commit with the ack was refused (a
        chain into a queue not this worker's to enqueue on...): dead-lettered, a failure."""
        log_refused(log, q, m, reason)
        self._tally("discarded")
        self._count(q, False)

    def _run_threads(self, loop: Callable[[], None]) -> None:
        threads = [threading.Thread(target=loop, daemon=True) for _ in range(self.concurrency - 1)]
        for t in threads:
            t.start()
        loop()
        for t in threads:
            t.join()

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
                    with self._registry.handling(q.name, m.id):
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
                    if self._limiter is not None:  # no message leased for a call that cannot start
                        want = min(want, self._limiter.free() - len(buffer))
                if want <= 0:
                    if self._limiter is not None and self._limiter.stalled:
                        self._stall(until_empty)
                    else:
                        with lock:
                            room.wait(0.05)
                    continue
                got = self._fetch(want)
                if got:
                    with lock:
                        buffer.extend(got)
                        work.notify(len(got))
                    continue
                if self._throttle_pause():  # messages ready, held back by a rate limit
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
            try:
                if not self._forced:  # at once: handlers still running are not waited for
                    for t in handlers:
                        t.join()
            finally:  # also when stopped at once while waiting here (StopNow in a join)
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
                    want = self.budget.size
                    if self._limiter is not None:  # no message leased for a call that cannot start
                        want = min(want, self._limiter.free())
                        if want == 0:  # no call runs here: abandoned threads take every place
                            self._stall(until_empty)
                            continue
                    buffer.extend(self._fetch(want))
                    if not buffer and not self._throttle_pause():
                        self._idle(until_empty)
                    continue
                q, m = buffer.popleft()
                with self._registry.handling(q.name, m.id):
                    self._handle_leased(q, m)
        finally:
            self._release_unstarted(buffer)

    def _release_unstarted(self, buffer: deque[tuple[Queue, Message]]) -> None:
        for q, m in buffer:  # prefetched, never started: back without counting a delivery
            self._release(q, m)
        buffer.clear()

    def _stall(self, until_empty: bool) -> None:
        """Abandoned threads take every place for a handler call (a handler that ignores its
        time limit): hold no message (nothing is leased; others take them), commit the acks
        waiting, say what to do (every ``STALL_LOG_EVERY`` seconds), and wait a while for a
        place. With ``until_empty``, stop once the queues hold nothing, as :meth:`_idle` does."""
        limiter = self._limiter
        assert limiter is not None
        self._flush_acks()
        now = time.monotonic()
        if now - self._stall_logged >= STALL_LOG_EVERY:
            self._stall_logged = now
            log.warning("%s", limiter.stall_advice())
        if until_empty:
            try:
                if self.workset is not None:
                    empty = self.workset.drained(self.db)
                else:
                    empty = until_empty_wait(self.db, self.queues, self.idle_timeout) is None
            except QueueError as exc:
                if not engine_failure(exc):
                    raise
                self.backoff.wait("waiting on the queues", exc, self._stop)
                return
            if empty:
                self._stop.set()
                return
        limiter.wait(self._stop, max(0.05, self.idle_timeout))

    def _fetch(self, want: int) -> list[tuple[Queue, Message]]:
        got: list[tuple[Queue, Message]] = []
        turn = list(self._rotation())
        # A work set's fair share: a bounded batch from each queue of the turn (QuiCK).
        share = IO_BATCH if self.workset is None else max(FAIR_SHARE, want // max(1, len(turn)))
        ws = self.workset
        unretired: list[Queue] = []  # found empty this turn, left in the index for now
        for i, q in enumerate(turn):
            n = min(want - len(got), IO_BATCH, share)
            if n <= 0 or self.stopping:
                break
            # QuiCK's vesting: a queue found empty is retired (in the empty lease's own
            # transaction) only once it was empty at this consumer's last visit too, or when
            # the turn ends with nothing: a queue its producers are feeding stays in the index,
            # so its retire does not race their enqueues (a conflict each) and its producers
            # write no entry and wake no sleeper.
            retire = ws is not None and (ws.vesting(q) or (i == len(turn) - 1 and not got))
            try:
                tries = [0]
                leased = self._lease(q, n, retire, tries)
            except QueueError as exc:
                if self.workset is not None and not engine_failure(exc):
                    self.workset.avoid(self.db, q, exc)  # paused, or not ours to dequeue
                    continue
                if not engine_failure(exc):
                    raise
                self.backoff.wait(f"lease from {q.name!r}", exc, self._stop)
                return got
            got.extend((q, m) for m in leased)
            if not leased:
                self._note_throttle()
            if ws is not None:
                ws.visited(q, bool(leased) or retire)
                if not leased and not retire:
                    unretired.append(q)
            # An empty lease retired the queue in its own transaction (``_lease``).
            self._served(q, True, full=n >= FAIR_SHARE and len(leased) >= n)
            if ws is not None and tries[0] > 1:
                ws.jostle()  # met another consumer on this queue: part ways
        if ws is not None and unretired and not got and not self.stopping:
            ws.retire_all(self.db, unretired)  # about to idle: nothing of its own left indexed
        self.backoff.reset()
        self.budget.ingress.add(len(got))
        return got

    def _lease(self, q: Queue, n: int, retire: bool = True, tries: list[int] | None = None) -> list[Message]:
        """Lease up to ``n`` of ``q``; the acks waiting in the settler commit in the same
        transaction (one commit for a batch's acks and the next batch's leases); a work
        set's queue that gives nothing leaves the work index in that transaction too, and
        one that gives is claimed by this consumer for a moment (``workindex.claim``)."""
        ws = self.workset
        with self._rate_limited():
            if ws is None:
                return lease_settling(self.db, self._settler, q, n, self.lease_seconds)
            return lease_settling(
                self.db,
                self._settler,
                q,
                n,
                self.lease_seconds,
                retire=retire,
                claim=ws.token,
                contended=q.name in ws.contended,
                owned=q.name in ws.owned,
                tries=tries,
            )

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
            if self._pool is not None:
                called, value = self._pool.call(q, m, self._stop)
                if called != OK:
                    self._beat.drop(m)
                    if called == TIMED_OUT:  # the child was killed: a failed delivery
                        self._timed_out(q, m, began)
                        self._count(q, False)
                    elif called == UNAVAILABLE:  # it never reached a child: back, not counted
                        self._release(q, m)
                    return  # CLOSED: stopped at once, the message released by run()
            elif self._limiter is None:
                value = tracing.run(q.name, m.id, m.headers, self.handler, m)
            elif not self._limiter.reserve():  # abandoned threads took the places meanwhile:
                self._beat.drop(m)  # held by no one here, so others may take it at once
                self._release(q, m)
                return
            else:
                ran, value = self._limiter.run(
                    self._stop, tracing.run, q.name, m.id, m.headers, self.handler, m
                )
                if not ran:
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
            kind = settle_failure(self.db, q, m, exc, log, self._on_dead)
            self._observe(q, began, kind)
            self._tally(kind)
            self._count(q, False)
            return
        self._beat.drop(m)
        self._observe(q, began, "ok")
        after = value if isinstance(value, AfterAck) else None  # writes to commit with the ack
        if self._settler is not None:  # acked with others, within settle_linger
            self._settler.add(q, m, after)
            self._stop_at_limit()
            return
        try:
            refused = ack_after(self.db, q, m, after, self._on_dead)
        except QueueError as err:
            if engine_failure(err):  # the lease runs out and the message comes back
                self.backoff.wait(f"ack of {m.id} on {q.name!r}", err, self._stop)
            else:
                log.warning("could not ack %s: %s", m.id, err)
            return
        if refused is not None:
            self._after_refused(q, m, refused)
            return
        self._count(q, True)
