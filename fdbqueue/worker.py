"""Workers: run a handler over one or more queues, exactly once or in lease mode.

* ``mode="exactly_once"``: the dequeue and the handler's writes are one transaction; the
  handler is called as ``handler(tr, message)``. An exception aborts both: the message
  stays, and the abort counts as a failed delivery (poison messages reach the error queue,
  with the exception's text as the reason). The handler must finish within FoundationDB's
  5-second transaction limit: past it the commit fails (1007), which is logged, counted
  (``stats.too_slow``) and kept as the reason. On the embedded engine (one writer) these
  handlers run one at a time, whatever ``concurrency`` says.
* ``mode="lease"``: the handler is called as ``handler(message)`` outside any transaction;
  returning acks the message, raising nacks it with the exception as the reason.

Every handler failure is logged once with its traceback (``extra``: queue, message_id,
deliveries) and counted in ``stats.failed``. A handler of the wrong arity is refused at
construction. An idle worker waits on watches (no polling, no spurious wake-ups), bounded
by the queues' next deadlines. SIGTERM / SIGINT stop it gracefully: the message in hand is
finished and settled, prefetched ones are released (not counted as deliveries). In lease
mode the worker prefetches a batch; its size follows the measured ingress and egress rates
within bounds, as RabbitMQ's variable queue sizes its memory (``rabbit_variable_queue.erl``).
"""

from __future__ import annotations

import inspect
import logging
import random
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from fdbqueue.clock import db_now, seconds_of
from fdbqueue.config import check_duration
from fdbqueue.delivery import TOO_OLD_REASON, engine_fault, failure_reason, not_counted
from fdbqueue.engines.base import TRANSACTION_WINDOW_SECONDS, Database
from fdbqueue.errors import ClusterUnavailableError, EngineError, QueueError, StoreError
from fdbqueue.errors import HandlerSignatureError as HandlerSignatureError  # re-export
from fdbqueue.message import Message, fit_reason
from fdbqueue.queue import Queue
from fdbqueue.txn import run_once
from fdbqueue.waiting import QueueWatcher

log = logging.getLogger("fdbqueue.worker")

IO_BATCH = 64  # page in batches: not so large that the queue blocks, nor so small it thrashes
MODES = ("lease", "exactly_once")


class Rate:
    """An exponentially weighted events-per-second estimate."""

    def __init__(self, alpha: float = 0.3) -> None:
        self.alpha = alpha
        self.value = 0.0
        self._count = 0
        self._since = time.monotonic()

    def add(self, n: int = 1) -> None:
        self._count += n

    def tick(self) -> float:
        now = time.monotonic()
        dt = now - self._since
        if dt >= 0.05:
            sample = self._count / dt
            self.value = sample if self.value == 0 else self.alpha * sample + (1 - self.alpha) * self.value
            self._count, self._since = 0, now
        return self.value


class PrefetchBudget:
    """How many messages to hold in memory: (ingress + egress rate) x horizon, within bounds.

    RabbitMQ's variable queue sizes its RAM budget from measured rates the same way
    (``rabbit_variable_queue.erl``): enough to keep handlers busy for ``horizon`` seconds,
    no more, so that prefetched messages do not sit out their leases in memory.
    """

    def __init__(self, low: int = 1, high: int = 256, horizon: float = 0.5) -> None:
        if not 1 <= low <= high:
            raise QueueError(f"prefetch bounds must satisfy 1 <= low <= high, got {low}, {high}")
        self.low, self.high, self.horizon = low, high, horizon
        self.ingress = Rate()
        self.egress = Rate()

    @property
    def size(self) -> int:
        target = (self.ingress.tick() + self.egress.tick()) * self.horizon
        return max(self.low, min(self.high, int(target) + 1))


@dataclass
class WorkerStats:
    """What a worker did; ``prefetch`` and the rates are its latest estimates.

    ``failed`` counts every failed delivery (the handler raised, or its transaction could
    not commit); ``too_slow`` those of them whose exactly-once transaction outlived
    FoundationDB's 5-second limit (1007). ``str(stats)`` is :meth:`summary`.
    """

    processed: int = 0
    failed: int = 0
    too_slow: int = 0
    released: int = 0
    swept: int = 0
    wakeups: int = 0
    idle_wakeups: int = 0  # woke and found nothing: spurious wake-ups
    backoffs: int = 0  # waits while the engine failed (full disk, unreachable cluster ...)
    prefetch: int = 0
    ingress_rate: float = 0.0
    egress_rate: float = 0.0
    per_queue: dict[str, int] = field(default_factory=dict)

    def summary(self) -> str:
        """One line for people: counts, then rates rounded (e.g. for a CLI's final line)."""
        parts = [f"processed {self.processed}", f"failed {self.failed}"]
        if self.too_slow:
            parts.append(f"({self.too_slow} outlived the 5 s transaction limit)")
        if self.released:
            parts.append(f"released {self.released}")
        if self.swept:
            parts.append(f"swept {self.swept}")
        if len(self.per_queue) > 1:
            parts.append("per queue " + ", ".join(f"{k} {v}" for k, v in self.per_queue.items()))
        rates = [f"{k} {_rate(v)}/s" for k, v in (("in", self.ingress_rate), ("out", self.egress_rate)) if v]
        if rates:  # exactly-once workers measure no ingress (nothing is prefetched)
            parts.append(", ".join(rates))
        return "; ".join(parts)

    def __str__(self) -> str:
        return self.summary()


def _rate(value: float) -> str:
    """A rate rounded for reading: 3 significant digits at most, no exponent."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}" if value >= 0.001 else "0"


def check_handler(handler: Callable[..., Any], nargs: int, how: str) -> None:
    """Refuse ``handler`` when its signature cannot take ``nargs`` positional arguments.

    ``how`` says how it is called, for the message. A callable whose signature Python
    cannot inspect (some builtins) is accepted.
    """
    if not callable(handler):
        raise HandlerSignatureError(f"handler must be callable, got {type(handler).__name__}")
    try:
        sig = inspect.signature(handler)
    except (TypeError, ValueError):
        return
    try:
        sig.bind(*[None] * nargs)
    except TypeError as exc:
        name = getattr(handler, "__qualname__", type(handler).__name__)
        raise HandlerSignatureError(f"{how}; {name}{sig} cannot be called so: {exc}") from None


def failure_text(exc: BaseException) -> str:
    """A handler's exception as a failure reason (the nack reason, the dead letter's reason)."""
    return fit_reason(f"{type(exc).__name__}: {exc}"[:500])


def log_failure(logger: logging.Logger, q: Queue, m: Message, exc: BaseException) -> None:
    """Log a handler's failure once, with its traceback; ``extra`` carries queue, id, deliveries."""
    logger.error(
        "handler failed on queue %r, message %s (delivery %d): %s",
        q.name,
        m.id,
        m.deliveries,
        failure_text(exc),
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"queue": q.name, "message_id": m.id, "deliveries": m.deliveries},
    )


def engine_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the engine failing rather than a message or its handler.

    A store that cannot write (a full disk, an I/O error: :class:`StoreError`), a cluster
    that cannot be reached, or an engine error the engines report for either or for load
    (:func:`fdbqueue.delivery.engine_fault`; a retryable one that outlasted its retries).
    Never counted as a failed delivery: a worker backs off (:class:`Backoff`) and tries
    again, and the message keeps its deliveries.
    """
    if isinstance(exc, (StoreError, ClusterUnavailableError)):
        return True
    return isinstance(exc, EngineError) and engine_fault(exc)


class Backoff:
    """Exponential back-off while the engine fails: ``first`` seconds doubling to ``cap``.

    Each wait is drawn from the upper half of the current delay (jitter: workers that
    failed together do not all retry together); the failure is logged once per back-off
    period. :meth:`reset` after any success. Shared by a worker's threads.
    """

    def __init__(self, logger: logging.Logger, first: float = 0.05, cap: float = 5.0) -> None:
        self.log = logger
        self.first = first
        self.cap = cap
        self.delay = 0.0
        self.count = 0  # back-offs so far
        self._logged = 0.0  # monotonic time of the last log line
        self._lock = threading.Lock()

    def wait(self, what: str, exc: BaseException, stop: threading.Event) -> None:
        """The engine failed doing ``what``: log (once per period), then sleep unless stopped."""
        with self._lock:
            self.delay = self.first if self.delay == 0 else min(self.cap, self.delay * 2)
            delay = self.delay
            self.count += 1
            now = time.monotonic()
            say = now - self._logged >= delay
            if say:
                self._logged = now
        if say:
            self.log.warning(
                "%s failed: %s: %s; the engine is failing, not the message: backing off %.2f s "
                "(at most %.0f s between tries), no delivery counted",
                what,
                type(exc).__name__,
                exc,
                delay,
                self.cap,
            )
        stop.wait(delay * random.uniform(0.5, 1.0))

    def reset(self) -> None:
        if self.delay:
            with self._lock:
                self.delay = 0.0


def _as_queues(queues: Queue | str | Iterable[Queue | str]) -> list[Queue]:
    items: Iterable[Queue | str] = [queues] if isinstance(queues, (Queue, str)) else queues
    out = [q if isinstance(q, Queue) else Queue(q) for q in items]
    if not out:
        raise QueueError("a worker needs at least one queue")
    return out


def drained(db: Database, queues: Sequence[Queue]) -> bool:
    """True when no queue holds a message that is ready, delayed or in flight (leased).

    What ``run(until_empty=True)`` waits for: a delayed retry or another worker's lease
    may still bring a message back.
    """
    from fdbqueue.admin import queue_stats
    from fdbqueue.config import QueueNotFoundError

    for q in queues:
        try:
            st = queue_stats(db, q.name, root=q.root)
        except QueueNotFoundError:
            continue  # never created: empty
        if st.ready or st.delayed or st.inflight:
            return False
    return True


def wait_any(db: Database, queues: Sequence[Queue], timeout: float | None, stop: threading.Event) -> bool:
    """Wait until any queue may have a message ready, ``timeout`` passes or ``stop`` is set.

    A one-off wait: a waiter that waits again and again keeps a :class:`QueueWatcher`
    instead, so that its watches outlive each wait.
    """
    watcher = QueueWatcher(db, [q.keys for q in queues])
    try:
        return watcher.wait(timeout, stop)
    finally:
        watcher.close()


class Worker:
    """Run ``handler`` over ``queues`` until stopped (see the module docstring)."""

    def __init__(
        self,
        db: Database,
        queues: Queue | str | Iterable[Queue | str],
        handler: Callable[..., Any],
        *,
        mode: str = "lease",
        concurrency: int = 1,
        lease_seconds: float | None = None,
        sweep_interval: float = 5.0,
        idle_timeout: float = 1.0,
        prefetch: tuple[int, int] = (1, 256),
    ) -> None:
        if mode not in MODES:
            raise QueueError(f"mode must be one of {MODES}, got {mode!r}")
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise QueueError(f"concurrency must be an int >= 1, got {concurrency!r}")
        if mode == "exactly_once":
            how = "exactly_once handlers are called as handler(tr, message), inside the transaction"
            check_handler(handler, 2, how)
        else:
            how = "lease handlers are called as handler(message), outside any transaction"
            check_handler(handler, 1, how + " (handler(tr, message) is mode='exactly_once')")
        self.db = db
        self.queues = _as_queues(queues)
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
        previous: dict[signal.Signals, Any] = {}
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                previous[sig] = signal.signal(sig, lambda *_: self.stop())
        try:
            if self.mode == "exactly_once":
                self._run_threads(lambda: self._exactly_once_loop(until_empty))
            else:
                self._run_lease(until_empty)
        finally:
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

    def _run_threads(self, loop: Callable[[], None]) -> None:
        threads = [threading.Thread(target=loop, daemon=True) for _ in range(self.concurrency - 1)]
        for t in threads:
            t.start()
        loop()
        for t in threads:
            t.join()

    # -- shared --------------------------------------------------------------------------------

    def _rotation(self) -> Iterator[Queue]:
        """Every queue once, starting one further each round: fair between queues."""
        with self._lock:
            start = self._turn
            self._turn = (self._turn + 1) % len(self.queues)
        for i in range(len(self.queues)):
            yield self.queues[(start + i) % len(self.queues)]

    def _count(self, q: Queue, ok: bool, *, too_slow: bool = False) -> bool:
        """Record one handled message; True when the worker should stop (max_messages)."""
        with self._lock:
            if ok:
                self.stats.processed += 1
                self.stats.per_queue[q.name] += 1
            else:
                self.stats.failed += 1
                self.stats.too_slow += too_slow
            self.budget.egress.add()
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
        for q in self.queues:
            try:
                st = q.sweep(self.db)
                self.stats.swept += st.total()
            except QueueError as exc:
                if engine_failure(exc):
                    self.backoff.wait(f"sweep of {q.name!r}", exc, self._stop)
                    return
                log.warning("sweep of %r failed: %s", q.name, exc)

    def _idle(self, until_empty: bool) -> None:
        """Nothing was ready: sweep if due, then wait on the queues' watches."""
        self._maybe_sweep()
        try:
            if until_empty and drained(self.db, self.queues):
                self._stop.set()
                return
            woke = self._watcher().wait(self.idle_timeout, self._stop)
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
                    else:
                        log.warning("could not dequeue from %r: %s", q.name, exc)
                    continue
                if outcome == "engine":
                    continue  # backed off in the step: nothing counted
                self.backoff.reset()
                if outcome is not None:
                    progressed = True
                    if self._count(q, outcome == "ok", too_slow=outcome == "too_slow"):
                        return
            if not progressed:
                self._idle(until_empty)

    def _exactly_once_step(self, q: Queue) -> str | None:
        """Dequeue from ``q`` and run the handler in one transaction, retried as
        ``@transactional`` retries (a conflict runs both again).

        Returns None when nothing was ready, ``"ok"`` when it committed, ``"failed"`` when
        the handler raised or the transaction could not commit, ``"engine"`` when the engine
        failed (:func:`engine_failure`: not counted against the message, after a back-off
        here), ``"too_slow"`` when the
        transaction outlived the 5-second limit (1007): running it again as it is would only
        fail again, so the failed delivery is counted and the message goes back to its queue
        (the error queue after max_deliveries, with a reason that says why).
        """
        tr = self.db.create_transaction()
        try:
            while True:
                m: Message | None = None
                begun = 0
                try:
                    m = q.dequeue(tr)
                    if m is not None:
                        begun = db_now(tr)  # its read version: free, the dequeue read
                        self.handler(tr, m)
                    tr.commit()
                    return None if m is None else "ok"
                except EngineError as exc:
                    if m is None:
                        tr.on_error(exc)  # the dequeue's own: retried, or raised to the loop
                        continue
                    if exc.code == 1007:
                        # Ended first: measuring takes a transaction, which must not nest
                        # inside this one (the embedded engine's single writer).
                        self._abort(tr, m, TOO_OLD_REASON)
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
                        return "too_slow"
                    if exc.retryable:
                        try:
                            tr.on_error(exc)
                            continue
                        except EngineError as final:  # out of retries
                            exc = final
                    if engine_failure(exc):
                        return self._engine_failed(tr, q, m, exc)
                    log_failure(log, q, m, exc)
                    self._abort(tr, m, failure_text(exc))
                    return "failed"
                except Exception as exc:
                    if m is None:
                        raise
                    if engine_failure(exc):  # the commit, or the handler's own reads and writes
                        return self._engine_failed(tr, q, m, exc)
                    log_failure(log, q, m, exc)
                    self._abort(tr, m, failure_text(exc))
                    return "failed"
        finally:
            tr.cancel()

    def _engine_failed(self, tr: Any, q: Queue, m: Message, exc: BaseException) -> str:
        """The engine failed around ``m``'s handling: abort without counting the delivery
        (the message stays where it was), then back off."""
        with not_counted(m):
            tr.cancel()
        self.backoff.wait(f"exactly-once handling of {m.id} on {q.name!r}", exc, self._stop)
        return "engine"

    @staticmethod
    def _abort(tr: Any, m: Message, reason: str) -> None:
        """Abort the attempt that dequeued ``m``; its failed delivery keeps ``reason``
        (unless the attempt had already ended, when the error it ended with says why)."""
        with failure_reason(m, reason):
            tr.cancel()

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
        finally:
            self._stop.set()
            with lock:
                work.notify_all()
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
            try:
                q.release(self.db, m)
                self.stats.released += 1
            except QueueError as exc:
                log.warning("could not release %s: %s", m.id, exc)

    def _fetch(self, want: int) -> list[tuple[Queue, Message]]:
        got: list[tuple[Queue, Message]] = []
        for q in self._rotation():
            n = min(want - len(got), IO_BATCH)
            if n <= 0 or self.stopping:
                break
            try:
                got.extend((q, m) for m in q.lease_many(self.db, n, self.lease_seconds))
            except QueueError as exc:
                if not engine_failure(exc):
                    raise
                self.backoff.wait(f"lease from {q.name!r}", exc, self._stop)
                return got
        self.backoff.reset()
        self.budget.ingress.add(len(got))
        return got

    def _handle_leased(self, q: Queue, m: Message) -> None:
        if m.lease_deadline is not None:
            left = m.lease_deadline - time.time()
            lease = self.lease_seconds or max(1.0, 2 * left)
            if left < lease / 2:  # sat in the prefetch buffer: renew before starting
                try:
                    m = q.extend(self.db, m, lease)
                except QueueError:
                    return  # lost while waiting: the sweep hands it out again
        try:
            self.handler(m)
        except Exception as exc:
            if engine_failure(exc):  # the handler's own use of a failing store
                try:
                    q.release(self.db, m)  # back without counting a delivery
                except QueueError as err:
                    log.warning("could not release %s: %s", m.id, err)
                self.backoff.wait(f"handler on {m.id} of {q.name!r}", exc, self._stop)
                return
            log_failure(log, q, m, exc)
            try:
                q.nack(self.db, m, reason=failure_text(exc))
            except QueueError as err:
                log.warning("could not nack %s: %s", m.id, err)
            self._count(q, False)
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
