"""What workers and dispatchers share: the queues they serve (named, a pattern or a
partitioned queue), handler checks and failure reports, the back-off while the engine fails,
the prefetch budget and the statistics. (A handler's time limit, a machine of threads of its
own, is :mod:`.timelimit`.)"""

from __future__ import annotations

import inspect
import logging
import random
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fdbqueue.api.admin import is_pattern
from fdbqueue.api.queue import Queue
from fdbqueue.api.routing import PartitionedQueue
from fdbqueue.engines.contract import Database
from fdbqueue.errors import (
    ClusterUnavailableError,
    Discard,
    EngineError,
    HandlerSignatureError,
    QueueError,
    RemoteFailure,
    Retry,
    StoreError,
)
from fdbqueue.ops.aborts import engine_fault
from fdbqueue.ops.waiting import QueueWatcher
from fdbqueue.runtime.fairness import WorkSet
from fdbqueue.runtime.hooks import DeadHook, nack_noting
from fdbqueue.store.record import fit_reason
from fdbqueue.types import Message


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
    retried: int = 0  # of the failed: the handler raised Retry
    discarded: int = 0  # of the failed: the handler raised Discard
    timed_out: int = 0  # of the failed: the handler ran past time_limit
    extended: int = 0  # leases renewed while a handler ran (heartbeat)
    scheduled: int = 0  # periodic jobs' ticks enqueued (run_schedules=True)
    released: int = 0
    ack_lost: int = 0  # handled, but the lease had gone before the (batched) ack committed
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
        verdicts = ((self.retried, "retried"), (self.discarded, "discarded"), (self.timed_out, "timed out"))
        chosen = [f"{n} {what}" for n, what in verdicts if n]
        failed = f"failed {self.failed}" + (f" ({', '.join(chosen)})" if chosen else "")
        parts = [f"processed {self.processed}", failed]
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


MODES = ("lease", "exactly_once")


def normalise_mode(mode: object) -> str:
    """A worker's mode, either spelling (``"exactly-once"`` as on the command line, or
    ``"exactly_once"``): one of :data:`MODES`."""
    name = mode.replace("-", "_") if isinstance(mode, str) else mode
    if name not in MODES:
        raise QueueError(f"mode must be one of {MODES} (or 'exactly-once'), got {mode!r}")
    return str(name)


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
    """A handler's exception as a failure reason (the nack reason, the dead letter's reason);
    one raised in a child process keeps its own type's name."""
    name = exc.type_name if isinstance(exc, RemoteFailure) else type(exc).__name__
    return fit_reason(f"{name}: {exc}"[:500])


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


@dataclass(frozen=True)
class Outcome:
    """What a handler's exception asks for: ``kind`` is ``retried`` (``Retry``), ``discarded``
    (``Discard``) or ``failed`` (anything else); how the failed delivery is settled."""

    kind: str
    reason: str
    delay: float | None = None
    discard: bool = False


def judge(exc: BaseException, q: Queue, m: Message, logger: logging.Logger) -> Outcome:
    """The outcome ``exc`` asks for on ``m``, logged once: a ``Retry`` at INFO, a ``Discard`` at
    WARNING, anything else as a failure with its traceback (:func:`log_failure`)."""
    extra = {"queue": q.name, "message_id": m.id, "deliveries": m.deliveries}
    if isinstance(exc, Retry):
        logger.info("handler asked to retry %s of %r: %s", m.id, q.name, exc.reason, extra=extra)
        return Outcome("retried", fit_reason(exc.reason), exc.delay)
    if isinstance(exc, Discard):
        logger.warning("handler discarded %s of %r: %s", m.id, q.name, exc.reason, extra=extra)
        return Outcome("discarded", fit_reason(exc.reason), discard=True)
    log_failure(logger, q, m, exc)
    return Outcome("failed", failure_text(exc))


def settle_failure(
    db: Database,
    q: Queue,
    m: Message,
    exc: BaseException,
    logger: logging.Logger,
    on_dead: DeadHook | None = None,
) -> str:
    """Settle the leased ``m`` whose handler raised ``exc`` as :func:`judge` says (a nack;
    ``on_dead`` written with it when it dead-letters ``m``); returns the outcome's kind."""
    outcome = judge(exc, q, m, logger)
    try:
        nack_noting(
            db, q, m, reason=outcome.reason, delay=outcome.delay, discard=outcome.discard, on_dead=on_dead
        )
    except QueueError as err:
        logger.warning("could not nack %s: %s", m.id, err)
    return outcome.kind


def give_back(db: Database, q: Queue, m: Message, stats: WorkerStats, logger: logging.Logger) -> None:
    """Release a leased message its worker never finished (stopping, or the engine failed):
    back to its place at once, the delivery not counted."""
    try:
        q.release(db, m)
        stats.released += 1
    except QueueError as exc:
        logger.warning("could not release %s: %s", m.id, exc)


class Heartbeat:
    """Renews the leases of the messages whose handlers are running, each at about a third
    of its lease, so that a long job is not handed to a second worker (Sidekiq Pro's and
    River's heartbeats; SQS's ``ChangeMessageVisibility`` loop). One thread for a worker."""

    def __init__(self, db: Database, stats: WorkerStats, logger: logging.Logger) -> None:
        self.db = db
        self.stats = stats
        self.log = logger
        self._held: dict[str, list[Any]] = {}  # id -> [queue, message, lease, next renewal]
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._wake_at = 0.0  # when the thread wakes next on its own

    def hold(self, q: Queue, m: Message, lease: float) -> None:
        due = time.monotonic() + lease / 3
        with self._cond:
            self._held[m.id] = [q, m, lease, due]
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fdbqueue-heartbeat", daemon=True)
                self._thread.start()
            if due < self._wake_at:  # only then: waking the thread for every message costs
                self._cond.notify()  # a thread switch each (a fifth of a short handler's rate)

    def drop(self, m: Message) -> None:
        with self._cond:
            self._held.pop(m.id, None)

    def held(self) -> list[tuple[Queue, Message]]:
        with self._cond:
            return [(h[0], h[1]) for h in self._held.values()]

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._held.clear()
            self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                idle = False
                while not self._closed:
                    now = time.monotonic()
                    due = [(k, h) for k, h in self._held.items() if h[3] <= now]
                    if due:
                        break
                    if not self._held and idle:  # nothing held for a moment: an idle worker
                        self._thread = None  # keeps no thread for it (hold starts another)
                        return
                    idle = not self._held
                    nxt = min((h[3] for h in self._held.values()), default=now + 0.2)
                    self._wake_at = max(now + 0.01, nxt)
                    self._cond.wait(self._wake_at - now)
                if self._closed:
                    return
                for _, h in due:
                    h[3] = time.monotonic() + h[2] / 3  # not again before its next turn
            for key, (q, m, lease, _) in due:
                try:
                    renewed = q.extend(self.db, m, lease)
                except QueueError as exc:
                    with self._cond:
                        still = self._held.pop(key, None) is not None
                    if still:  # not settled meanwhile: the lease is lost
                        self.log.warning("could not renew the lease of %s on %r: %s", m.id, q.name, exc)
                    continue
                with self._cond:
                    if key in self._held:
                        self._held[key][1] = renewed
                        self.stats.extended += 1


def engine_failure(exc: BaseException) -> bool:
    """Whether ``exc`` is the engine failing rather than a message or its handler.

    A store that cannot write (a full disk, an I/O error: :class:`StoreError`), a cluster
    that cannot be reached, or an engine error the engines report for either or for load
    (:func:`fdbqueue.ops.aborts.engine_fault`; a retryable one that outlasted its retries).
    Never counted as a failed delivery: a worker backs off (:class:`Backoff`) and tries
    again, and the message keeps its deliveries.
    """
    if isinstance(exc, (StoreError, ClusterUnavailableError)):
        return True
    if isinstance(exc, RemoteFailure):  # judged in the child, where the exception was raised
        return exc.engine
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


Queues = Queue | str | PartitionedQueue | Iterable[Queue | str]


def work_set_of(queues: Queues) -> WorkSet | None:
    """The work set a pattern or a PartitionedQueue stands for (None: named queues)."""
    if isinstance(queues, PartitionedQueue) or is_pattern(queues):
        return WorkSet(queues)  # type: ignore[arg-type]
    return None


def _as_queues(queues: Queues) -> list[Queue]:
    items: Iterable[Any] = [queues] if isinstance(queues, (Queue, str, PartitionedQueue)) else queues
    if isinstance(items, (bytes, Mapping)) or not isinstance(items, Iterable):
        raise QueueError(f"queues must be a name, a Queue, a pattern or a list of them, got {queues!r}")
    out = []
    for q in items:
        if isinstance(q, PartitionedQueue) or is_pattern(q):
            raise QueueError(f"give a pattern or a PartitionedQueue alone, not in a list: {q!r}")
        if not isinstance(q, (Queue, str)):
            raise QueueError(f"queues must be names or Queues, got {q!r} in {queues!r}")
        out.append(q if isinstance(q, Queue) else Queue(q))
    if not out:
        raise QueueError("a worker needs at least one queue")
    return out


# While the only messages left are leased by others, a consumer running until empty looks
# again this often: the ack that settles the last of them changes no watched key (acks do
# not ring the queue's bell, or every idle worker would wake at every ack).
LEASES_OUT_RECHECK = 0.05


def held(db: Database, queues: Sequence[Queue]) -> tuple[int, int, int]:
    """The messages ``queues`` hold: (ready, delayed, in flight), summed."""
    from fdbqueue.api.admin import queue_stats
    from fdbqueue.errors import QueueNotFoundError

    ready = delayed = leased = 0
    for q in queues:
        try:
            st = queue_stats(db, q.name, root=q.root)
        except QueueNotFoundError:
            continue  # never created: empty
        ready, delayed, leased = ready + st.ready, delayed + st.delayed, leased + st.inflight
    return ready, delayed, leased


def until_empty_wait(db: Database, queues: Sequence[Queue], idle_timeout: float) -> float | None:
    """For a consumer running until empty that found nothing to take: None when no queue
    holds a message ready, delayed or in flight (stop), else how long to wait before looking
    again: a delayed retry or another worker's lease may still bring a message back
    (``LEASES_OUT_RECHECK`` when all that is left is leased elsewhere)."""
    ready, delayed, leased = held(db, queues)
    if not (ready or delayed or leased):
        return None
    return idle_timeout if ready or delayed else min(idle_timeout, LEASES_OUT_RECHECK)


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
