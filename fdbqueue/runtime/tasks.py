"""Running tasks: the handler a worker calls on a task message, and the worker of an app.

:class:`TaskRunner` is a lease-mode handler: it decodes the message (``api/tasks.py`` has its
format), finds the task, calls the function outside any transaction and returns a
:class:`TaskDone` - the result to keep and the chained tasks to enqueue - which the Worker
writes in the transaction that acks the message (``ops.settling.AfterAck``), so the next task
of a chain is enqueued exactly when, and only if, this one is settled as done. A failure is
the Worker's usual nack; when it dead-letters the message, :meth:`TaskRunner.on_dead` writes
the failure (type and text) as the task's result in that same transaction. Nothing is
enqueued for a task that failed.

Lease mode is at-least-once: a worker that dies after the function returned and before the
ack committed runs the task again (its result and its chain are still written once, with the
one ack that lands). A task that must not run twice writes through the exactly-once Worker
(``mode="exactly_once"``) instead.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from typing import Any, NoReturn

from fdbqueue.api.admin import create_queue, queue_config
from fdbqueue.api.task_results import encode_value, failure_of, sweep_results, write_result
from fdbqueue.api.tasks import (
    Task,
    TaskRegistry,
    bind_arguments,
    enqueue_signature,
    signature_from_json,
)
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import (
    Discard,
    QueueError,
    QueueNotFoundError,
    Retry,
    TaskArgumentsError,
    TaskTimeLimitExceeded,
    UnknownTaskError,
)
from fdbqueue.ops.settling import AfterAck
from fdbqueue.runtime.handling import failure_text
from fdbqueue.runtime.timelimit import time_limit_reason
from fdbqueue.store.config import QueueConfig
from fdbqueue.types import Message

log = logging.getLogger("fdbqueue.runtime.worker")

RESULT_SWEEP_EVERY = 60.0  # seconds between a runner's sweeps of expired results


@dataclass(frozen=True)
class TaskDone(AfterAck):
    """What commits with a task message's ack: its result (JSON) and its chained tasks.
    Plain data, so that it can come back from a child process."""

    root: tuple[Any, ...]
    queue: str
    message_id: str
    result_ttl: float | None
    value: bytes | None
    then: tuple[dict[str, Any], ...]

    def write(self, tr: Transaction) -> None:
        if self.result_ttl is not None:
            write_result(tr, self.root, self.message_id, self.queue, self.result_ttl, value=self.value)
        for sig in self.then:
            enqueue_signature(tr, signature_from_json(sig))


def _decode(app: TaskRegistry, m: Message) -> tuple[dict[str, Any], Task]:
    """The message's call and its task; Discard (the error queue, with the reason) when it is
    not a task message, names a task this app does not know, carries arguments that do not
    bind to its function's signature, or is past its task's ``max_deliveries``."""
    data, task = _decode_call(app, m)
    if task.max_deliveries is not None and m.deliveries > task.max_deliveries:
        # Its last run failed where the runner could not see it (past the worker's time limit,
        # a child or a worker that died): "at most this many runs" holds, not run again.
        last = m.extra.get("last_error")
        reason = last if isinstance(last, str) and last else "out of deliveries"
        log.error(
            "task %s is past its max_deliveries (%d), message %s: dead-lettered without running (%s)",
            task.name,
            task.max_deliveries,
            m.id,
            reason,
            extra={"queue": m.queue, "message_id": m.id, "deliveries": m.deliveries},
        )
        raise Discard(reason)
    return data, task


def _decode_call(app: TaskRegistry, m: Message) -> tuple[dict[str, Any], Task]:
    try:
        data = json.loads(m.payload)
        name = data["task"]
        if not isinstance(name, str) or not isinstance(data.get("args", []), list):
            raise ValueError("bad fields")
        if not isinstance(data.get("kwargs", {}), dict):
            raise ValueError("bad kwargs")
        ttl = data.get("result")
        if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float)) or not ttl > 0):
            raise ValueError(f"result must be a number of seconds above 0, got {ttl!r}")
        # What is written with the ack is decoded now: a malformed chain fails here, at once,
        # not in the batched ack (where it would take the other acks of the batch with it).
        if not isinstance(data.get("then", []), list):
            raise ValueError("then must be a list of signatures")
        todo = [signature_from_json(sig) for sig in data.get("then", [])]
        while todo:
            sig = todo.pop()
            hash((sig.queue, sig.root))  # a handle is cached by them
            todo.extend(sig.options.then)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise Discard(f"not a task message ({type(exc).__name__}: {exc})") from None
    try:
        task = app.get(name)
        # Arguments that do not bind (a hand-made message, a task whose signature changed) fail
        # the same way at every delivery: to the error queue now, not max_deliveries runs later.
        args, kwargs = tuple(data.get("args", ())), data.get("kwargs", {})
        bind_arguments(
            task.name, task.signature, args, kwargs, check_json=False, leading=int(task.exactly_once)
        )
    except (UnknownTaskError, TaskArgumentsError) as exc:
        raise Discard(failure_text(exc)) from None
    return data, task


class TaskRunner:
    """The lease-mode handler of an app's worker (see the module docstring)."""

    def __init__(self, app: TaskRegistry, db: Database, worker_time_limit: float | None = None) -> None:
        self.app = app
        self.db = db
        self.worker_time_limit = worker_time_limit
        self._swept = time.monotonic()

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled by reference to its tasks (a worker's child process imports their modules
        and runs its own app's runner; what the run returns, :class:`TaskDone`, is plain data
        the parent writes with the ack)."""
        return _runner_in_child, (type(self), tuple(self.app.tasks.values()), self.worker_time_limit)

    def __call__(self, m: Message) -> TaskDone | None:
        data, task = _decode(self.app, m)
        if task.exactly_once:  # its function needs the acking transaction
            raise Discard(f"task {task.name} is exactly_once: run it on an exactly-once worker")
        self._maybe_sweep()
        began = time.perf_counter()
        try:
            if task.is_async:  # met by a thread worker: run on an event loop of its own
                import asyncio  # here: `import fdbqueue` imports no asyncio

                value = asyncio.run(task.fn(*data.get("args", ()), **data.get("kwargs", {})))
            else:
                value = task.fn(*data.get("args", ()), **data.get("kwargs", {}))
        except Exception as exc:
            self._fail(task, m, exc)
        return self._done(task, m, data, value, began)

    def on_dead(self, tr: Transaction, m: Message, reason: str) -> None:
        """``m`` goes to its error queue in ``tr``: its failure becomes its result."""
        try:
            data = json.loads(m.payload)
        except ValueError:
            return
        ttl = data.get("result") if isinstance(data, dict) else None
        if isinstance(ttl, (int, float)) and not isinstance(ttl, bool):
            write_result(tr, self.app.root, m.id, m.queue, float(ttl), failure=failure_of(reason))

    def _fail(self, task: Task, m: Message, exc: Exception) -> NoReturn:
        """Raise what a run that raised ``exc`` fails with (:meth:`_failed`): ``exc`` itself, or
        its replacement with ``exc`` as the cause."""
        failure = self._failed(task, m, exc)
        if failure is exc:
            raise exc
        raise failure from exc

    def _failed(self, task: Task, m: Message, exc: Exception) -> BaseException:
        """The exception to raise for a failed run: the task's own ``max_deliveries`` reached
        sends it to the error queue now (the queue's own setting applies as ever)."""
        if isinstance(exc, Discard):  # the task's own: its failure reads as type Discard
            return Discard(f"Discard: {exc.reason}")
        if isinstance(exc, Retry):
            return exc
        if task.max_deliveries is not None and m.deliveries >= task.max_deliveries:
            log.error(
                "task %s failed on its last delivery (%d of max_deliveries %d), message %s: %s",
                task.name,
                m.deliveries,
                task.max_deliveries,
                m.id,
                failure_text(exc),
                exc_info=(type(exc), exc, exc.__traceback__),
                extra={"queue": m.queue, "message_id": m.id, "deliveries": m.deliveries},
            )
            return Discard(failure_text(exc))
        return exc

    def _done(
        self, task: Task, m: Message, data: dict[str, Any], value: Any, began: float
    ) -> TaskDone | None:
        limit = task.time_limit
        shorter = limit is not None and (self.worker_time_limit is None or limit < self.worker_time_limit)
        if shorter and limit is not None and time.perf_counter() - began > limit:  # the worker's is longer
            exc = TaskTimeLimitExceeded(time_limit_reason(limit))
            raise self._failed(task, m, exc)
        ttl = data.get("result")
        then = tuple(data.get("then", ()))
        if ttl is None and not then:
            return None  # a plain ack, batched with the others
        raw = None
        if ttl is not None:
            try:
                raw = encode_value(value)
            except TaskArgumentsError as exc:  # the same every time: no use retrying it
                raise Discard(failure_text(exc)) from None
        return TaskDone(self.app.root, m.queue, m.id, None if ttl is None else float(ttl), raw, then)

    def _maybe_sweep(self) -> None:
        """Clear expired results about once a minute (its own short transaction)."""
        now = time.monotonic()
        if now - self._swept < RESULT_SWEEP_EVERY:
            return
        self._swept = now
        try:
            sweep_results(self.db, self.app.root)
        except QueueError as exc:
            log.warning("could not sweep expired task results: %s", exc)


def _runner_in_child(kind: type[TaskRunner], tasks: tuple[Task, ...], limit: float | None) -> TaskRunner:
    """A runner rebuilt in a child process from its tasks: it sweeps no results there (the
    parent does, in its own process)."""
    if not tasks:
        raise QueueError("a task runner with no task cannot be rebuilt")
    app = tasks[0].app
    runner = kind(app, app.db, limit)
    runner._swept = float("inf")
    return runner


class ExactlyOnceTaskRunner(TaskRunner):
    """The handler of an exactly-once worker (``@app.task(exactly_once=True)``): the function
    runs as ``fn(tr, ...)`` in the transaction that removes its message, and its result and
    chain are written there too: all of it commits once, or none of it."""

    def __call__(self, tr: Transaction, m: Message) -> None:  # type: ignore[override]
        data, task = _decode(self.app, m)
        if not task.exactly_once:  # its function takes no transaction
            raise Discard(f"task {task.name} is not exactly_once: run it on a lease-mode worker")
        if time.monotonic() - self._swept >= RESULT_SWEEP_EVERY:
            # Once this transaction has ended: a transaction of its own, never nested in it.
            tr.on_finish(lambda _error: self._maybe_sweep())
        began = time.perf_counter()
        try:
            value = task.fn(tr, *data.get("args", ()), **data.get("kwargs", {}))
        except Exception as exc:
            self._fail(task, m, exc)
        done = self._done(task, m, data, value, began)
        if done is not None:
            done.write(tr)


class AsyncTaskRunner(TaskRunner):
    """The handler of an app's AsyncWorker: ``async def`` tasks are awaited on its loop, plain
    functions run in a thread of the loop's pool."""

    async def __call__(self, m: Message) -> TaskDone | None:  # type: ignore[override]
        import asyncio

        data, task = _decode(self.app, m)
        if time.monotonic() - self._swept >= RESULT_SWEEP_EVERY:
            await asyncio.to_thread(self._maybe_sweep)
        began = time.perf_counter()
        args, kwargs = data.get("args", ()), data.get("kwargs", {})
        try:
            if task.is_async:
                value = await task.fn(*args, **kwargs)
            else:
                value = await asyncio.to_thread(task.fn, *args, **kwargs)
        except Exception as exc:
            self._fail(task, m, exc)
        return self._done(task, m, data, value, began)


def prepare_queues(app: TaskRegistry, db: Database) -> None:
    """Create the app's queues, each with max_deliveries at least the highest of its tasks'
    (a queue's own setting dead-letters first; a task's lower one is the runner's), and with
    its tasks' rate limit where queues have one (``create_queue(..., rate_limit=)``): a rate
    limit is the queue's, shared by every worker, so the tasks of a queue share one."""
    wanted: dict[str, dict[str, Any]] = {name: {} for name in app.queues}
    rates: dict[str, set[str | None]] = {name: set() for name in app.queues}
    for t in app.tasks.values():
        if t.max_deliveries is not None:
            have = wanted[t.queue].get("max_deliveries", 0)
            wanted[t.queue]["max_deliveries"] = max(have, t.max_deliveries)
        rates[t.queue].add(t.rate_limit)
    queue_rates = "rate_limit" in QueueConfig.__dataclass_fields__
    for name, found in rates.items():
        if found == {None}:
            continue
        if len(found) > 1:
            raise QueueError(
                f"the tasks of queue {name!r} ask for different rate limits ({sorted(map(str, found))}): "
                "a rate limit is its queue's; give each rate-limited task a queue of its own"
            )
        if queue_rates:
            wanted[name]["rate_limit"] = next(iter(found))
        else:
            log.warning("queue %r: this version has no queue rate limits; %s is not enforced", name, found)
    for name in app.queues:
        try:
            cfg = queue_config(db, name, root=app.root)
        except QueueNotFoundError:
            create_queue(db, name, root=app.root, **wanted[name])
            continue
        change = {
            k: v
            for k, v in wanted[name].items()
            if (k == "max_deliveries" and cfg.max_deliveries < v)
            or (k != "max_deliveries" and getattr(cfg, k) != v)
        }
        if change:
            log.info("queue %r: %s set for its tasks", name, change)
            create_queue(db, name, root=app.root, **change)


def worker_time_limit(app: TaskRegistry, time_limit: float | None) -> float | None:
    """The worker's time limit: the one given, else the longest of the tasks' (a task with a
    shorter one fails when it returns past it)."""
    if time_limit is not None:
        return time_limit
    limits = [t.time_limit for t in app.tasks.values() if t.time_limit is not None]
    return max(limits) if limits else None
