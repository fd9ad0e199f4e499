"""Tasks: named functions whose calls are deferred as messages, and their results.

``TaskRegistry`` is what a :class:`fdbqueue.Tasks` app holds: its task functions by name, the
``defer`` of a call (its arguments checked against the function's signature and encoded as
JSON, then enqueued in the caller's transaction or in one of its own), signatures for chains
(``task.s(...)``) and results (``store_result=True``: kept with a TTL under
``layout.TaskResultKeys``, waited for on a watch). What runs the tasks is in
``fdbqueue.runtime.tasks``.

A task message's payload is JSON: ``{"task": name, "args": [...], "kwargs": {...}}``, plus
``"then": [signature, ...]`` (tasks to enqueue in the transaction that acks this one) and
``"result": ttl`` (keep the return value that many seconds) when asked for. A signature is
self-contained (name, queue, arguments, options), so a worker that runs a chain needs no
registry entry for the next task to enqueue it.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import json
import pickle
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.api.task_results import DEFAULT_RESULT_TTL, result, sweep_results, write_pending
from fdbqueue.engines import open_database
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import (
    InvalidPayloadError,
    QueueError,
    TaskArgumentsError,
    UnknownTaskError,
)
from fdbqueue.ops.privileges import check
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.txn import as_database
from fdbqueue.store.layout import DEFAULT_ROOT, validate_queue_name
from fdbqueue.store.rates import parse_rate
from fdbqueue.types import check_duration

DEFAULT_QUEUE = "tasks"  # the queue of a task that names none


def check_rate_limit(rate: object) -> str | None:
    """``"50/s"``, ``"1000/m"``, ``"10/h"`` or ``"7/d"`` (or None): refused here when the
    task's queue would refuse it (``create_queue(..., rate_limit=)``, one parser for both)."""
    if rate is None:
        return None
    return parse_rate(rate).text


def _json_check(what: str, value: object) -> None:
    try:
        json.dumps(value, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise TaskArgumentsError(f"{what} must be JSON-serialisable: {type(exc).__name__}: {exc}") from None


def bind_arguments(
    name: str,
    sig: inspect.Signature | None,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    *,
    check_json: bool = True,
    leading: int = 0,
) -> None:
    """Refuse arguments that do not bind to ``sig`` or (``check_json``) that JSON cannot carry (a
    defer leaves that to the enqueue, which encodes them once)."""
    if sig is not None:
        try:
            sig.bind(*(None,) * leading, *args, **kwargs)  # leading: a transaction, given by the worker
        except TypeError as exc:
            raise TaskArgumentsError(f"task {name!r}{sig} cannot be called so: {exc}") from None
    if check_json:
        _json_check(f"the arguments of task {name!r}", [list(args), dict(kwargs)])


@dataclass(frozen=True)
class Options:
    """How one deferred call is enqueued (``Task.configure``)."""

    delay: float = 0.0
    priority: int = 0
    dedup_key: str | None = None
    then: tuple[Signature, ...] = ()

    @staticmethod
    def make(
        delay: float = 0.0,
        priority: int = 0,
        dedup_key: str | None = None,
        then: Signature | Sequence[Signature] | None = None,
    ) -> Options:
        delay = check_duration("delay", delay)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise QueueError(f"priority must be an int, not {type(priority).__name__}")
        if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key):
            raise QueueError("dedup_key must be a non-empty str or None")
        chain: tuple[Signature, ...]
        if then is None:
            chain = ()
        elif isinstance(then, Signature):
            chain = (then,)
        elif isinstance(then, (list, tuple)) and all(isinstance(s, Signature) for s in then):
            chain = tuple(then)
        else:
            raise QueueError(f"then must be a signature (task.s(...)) or a list of them, got {then!r}")
        return Options(delay, priority, dedup_key, chain)


@dataclass(frozen=True)
class Signature:
    """A task call to make later (``task.s(...)``): its arguments were checked when it was
    made. ``then=`` enqueues it in the transaction that acks the first task."""

    task: str
    queue: str
    root: tuple[Any, ...]
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    options: Options = field(default_factory=Options)
    result_ttl: float | None = None  # the task keeps its result this long (store_result)

    def to_json(self) -> dict[str, Any]:
        o = self.options
        out: dict[str, Any] = {"task": self.task, "queue": self.queue, "args": list(self.args)}
        if self.kwargs:
            out["kwargs"] = dict(self.kwargs)
        if list(self.root) != list(DEFAULT_ROOT):
            out["root"] = list(self.root)
        if o.delay:
            out["delay"] = o.delay
        if o.priority:
            out["priority"] = o.priority
        if o.dedup_key is not None:
            out["dedup_key"] = o.dedup_key
        if o.then:
            out["then"] = [s.to_json() for s in o.then]
        if self.result_ttl is not None:
            out["result"] = self.result_ttl
        return out


def task_payload(sig: Signature) -> dict[str, Any]:
    """The message payload of a deferred call."""
    out: dict[str, Any] = {"task": sig.task, "args": list(sig.args)}
    if sig.kwargs:
        out["kwargs"] = dict(sig.kwargs)
    if sig.options.then:
        out["then"] = [s.to_json() for s in sig.options.then]
    if sig.result_ttl is not None:
        out["result"] = sig.result_ttl
    return out


@functools.lru_cache(maxsize=256)
def _queue(name: str, root: tuple[Any, ...]) -> Queue:
    """One handle a queue name: its keys are packed once, not at every defer."""
    return Queue(name, root=root)


def enqueue_signature(tr: Transaction | Database, sig: Signature) -> str:
    """Enqueue ``sig``'s call; returns the message id. In a transaction it composes with the
    caller's writes; given a Database, one transaction of its own, exactly once across
    commit_unknown_result. With a result to keep, a "pending" record is written with it.
    A chain (``then``) into a queue the principal may not enqueue on is refused here
    (AccessDeniedError, nothing written), not left to fail when this call's message is acked."""
    q = _queue(sig.queue, sig.root)
    payload = task_payload(sig)
    o = sig.options
    chained = _chained_queues(o.then)

    def enqueue(t: Transaction | Database) -> str:
        try:
            return q.enqueue(t, payload, priority=o.priority, delay=o.delay, dedup_key=o.dedup_key)
        except InvalidPayloadError as exc:
            raise TaskArgumentsError(f"task {sig.task!r}: {exc}") from None

    if sig.result_ttl is None and not chained:
        return enqueue(tr)

    def body(t: Transaction) -> str:
        for cq in chained:  # the guard keys only, before anything is written
            check(t, cq.keys, "enqueue")
        mid = enqueue(t)
        if sig.result_ttl is not None:
            write_pending(t, sig.root, mid, sig.queue, sig.task, sig.options.delay)
        return mid

    return run_once_confirmed(tr, q.keys, body)  # the caller's transaction, or one of its own


def _chained_queues(then: Sequence[Signature]) -> list[Queue]:
    """The queues of a chain's tasks, at every depth, each once."""
    out: dict[tuple[str, tuple[Any, ...]], Queue] = {}
    todo = list(then)
    while todo:
        s = todo.pop()
        out.setdefault((s.queue, tuple(s.root)), _queue(s.queue, tuple(s.root)))
        todo.extend(s.options.then)
    return list(out.values())


def signature_from_json(data: Mapping[str, Any]) -> Signature:
    """A signature as a chained task's payload carries it (:meth:`Signature.to_json`)."""
    then = tuple(signature_from_json(s) for s in data.get("then", ()))
    options = Options(
        float(data.get("delay", 0.0)), int(data.get("priority", 0)), data.get("dedup_key"), then
    )
    result = data.get("result")
    return Signature(
        str(data["task"]),
        str(data["queue"]),
        tuple(data.get("root", DEFAULT_ROOT)),
        tuple(data.get("args", ())),
        dict(data.get("kwargs", {})),
        options,
        None if result is None else float(result),
    )


# -- the registry ----------------------------------------------------------------------------------


class Task:
    """A registered task function (``@app.task``). Calling it runs the function here, now;
    :meth:`defer` enqueues the call for a worker."""

    def __init__(
        self,
        app: TaskRegistry,
        fn: Callable[..., Any],
        name: str,
        queue: str,
        max_deliveries: int | None,
        time_limit: float | None,
        rate_limit: str | None,
        store_result: bool,
        result_ttl: float,
        exactly_once: bool = False,
    ) -> None:
        self.app = app
        self.fn = fn
        self.name = name
        self.queue = queue
        self.max_deliveries = max_deliveries
        self.time_limit = time_limit
        self.rate_limit = rate_limit
        self.store_result = store_result
        self.result_ttl = result_ttl
        self.exactly_once = exactly_once  # called as fn(tr, ...) in the transaction that acks it
        self.is_async = inspect.iscoroutinefunction(fn)
        try:
            self.signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self.signature = None  # some builtins: arguments checked as JSON only
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)
        self.__module__ = getattr(fn, "__module__", __name__)
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<task {self.name} on queue {self.queue!r}>"

    def __reduce__(self) -> tuple[Callable[..., Task], tuple[str, str]]:
        """Pickled by reference (its module and name, as a function is): a child process of a
        worker finds the task its own import of the module registered."""
        if task_by_reference(self.__module__, self.__qualname__) is not self:
            raise pickle.PicklingError(
                f"task {self.name} is not {self.__module__}.{self.__qualname__}: it cannot be found by "
                "its name in another process"
            )
        return task_by_reference, (self.__module__, self.__qualname__)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the function now, in this thread (no queue involved)."""
        return self.fn(*args, **kwargs)

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this call (checked now) for ``then=``."""
        return self.configure().s(*args, **kwargs)

    def configure(
        self,
        *,
        delay: float = 0.0,
        priority: int = 0,
        dedup_key: str | None = None,
        then: Signature | Sequence[Signature] | None = None,
    ) -> Configured:
        """This task with options for its next ``defer`` (or ``s``): ``delay`` seconds,
        ``priority``, ``dedup_key`` (the queue's dedup window), ``then`` (tasks to enqueue in
        the transaction that acks this one)."""
        return Configured(self, Options.make(delay, priority, dedup_key, then))

    def defer(self, tr: Transaction | Database, /, *args: Any, **kwargs: Any) -> str:
        """Enqueue this call; returns the message id. ``tr`` a transaction: it commits or
        aborts with the caller's writes; a Database: one transaction of its own, exactly once.
        Arguments that do not bind to the function's signature, or that JSON cannot carry,
        raise TaskArgumentsError and nothing is written."""
        return Configured(self, Options()).defer(tr, *args, **kwargs)


def task_by_reference(module: str, qualname: str) -> Task:
    """The :class:`Task` at ``module.qualname`` (what unpickling a task does)."""
    obj: Any = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    if not isinstance(obj, Task):
        raise pickle.PicklingError(
            f"task {module}.{qualname} cannot be found by its name: define tasks at a module's top level"
        )
    return obj


class Configured:
    """A task with options for one call (``task.configure(...)``)."""

    def __init__(self, task: Task, options: Options) -> None:
        self.task = task
        self.options = options

    def s(self, *args: Any, **kwargs: Any) -> Signature:
        """A signature of this call, its arguments checked now (for ``then=``)."""
        return self._signature(args, kwargs, check_json=True)

    def _signature(self, args: tuple[Any, ...], kwargs: dict[str, Any], *, check_json: bool) -> Signature:
        t = self.task
        bind_arguments(t.name, t.signature, args, kwargs, check_json=check_json, leading=int(t.exactly_once))
        return Signature(
            t.name,
            t.queue,
            t.app.root,
            tuple(args),
            dict(kwargs),
            self.options,
            t.result_ttl if t.store_result else None,
        )

    def defer(self, tr: Transaction | Database, /, *args: Any, **kwargs: Any) -> str:
        """As :meth:`Task.defer`, with these options."""
        return enqueue_signature(tr, self._signature(args, kwargs, check_json=False))


class TaskRegistry:
    """Task functions by name over one database (see :class:`fdbqueue.Tasks`)."""

    def __init__(
        self,
        db: Database | str | None = None,
        *,
        queue: str = DEFAULT_QUEUE,
        root: tuple[Any, ...] = DEFAULT_ROOT,
        result_ttl: float = DEFAULT_RESULT_TTL,
    ) -> None:
        self.db: Database = open_database(db) if db is None or isinstance(db, str) else as_database(db)
        self.default_queue = validate_queue_name(queue)
        self.root = tuple(root)
        self.result_ttl = check_duration("result_ttl", result_ttl, positive=True)
        self.tasks: dict[str, Task] = {}

    def task(
        self,
        fn: Callable[..., Any] | None = None,
        *,
        name: str | None = None,
        queue: str | None = None,
        max_deliveries: int | None = None,
        time_limit: float | None = None,
        rate_limit: str | None = None,
        store_result: bool = False,
        result_ttl: float | None = None,
        exactly_once: bool = False,
    ) -> Any:
        """Register ``fn`` as a task (``@app.task`` or ``@app.task(...)``); returns the
        :class:`Task`. ``name``: default ``module.qualname``. ``queue``: default the app's
        (``"tasks"``). ``max_deliveries``: runs at most this many times (the queue's own
        setting still applies: the app's worker raises it to the highest of its tasks').
        ``time_limit``: seconds a run may take. ``rate_limit``: ``"50/s"``, kept for the
        worker. ``store_result``: keep the return value (JSON) ``result_ttl`` seconds.
        ``exactly_once``: the function is called as ``fn(tr, *args, **kwargs)`` inside the
        transaction that removes its message (its writes, its result and its chain commit
        with it, or none of them); it must finish within FoundationDB's 5-second limit."""
        if fn is not None and not callable(fn):
            raise QueueError(f"@app.task decorates a function, got {fn!r}")
        if max_deliveries is not None and (
            isinstance(max_deliveries, bool) or not isinstance(max_deliveries, int) or max_deliveries < 1
        ):
            raise QueueError(f"max_deliveries must be an int >= 1 or None, got {max_deliveries!r}")
        limit = None if time_limit is None else check_duration("time_limit", time_limit, positive=True)
        rate = check_rate_limit(rate_limit)
        for flag, value in (("store_result", store_result), ("exactly_once", exactly_once)):
            if not isinstance(value, bool):
                raise QueueError(f"{flag} must be True or False, got {value!r}")
        ttl = (
            self.result_ttl if result_ttl is None else check_duration("result_ttl", result_ttl, positive=True)
        )
        qname = validate_queue_name(queue if queue is not None else self.default_queue)

        def register(f: Callable[..., Any]) -> Task:
            # A worker's child process imports a script as "__mp_main__" (multiprocessing's
            # spawn and forkserver): its tasks keep the names the script's own process gave.
            module = "__main__" if f.__module__ == "__mp_main__" else f.__module__
            tname = name if name is not None else f"{module}.{f.__qualname__}"
            if not isinstance(tname, str) or not tname:
                raise QueueError(f"a task's name is a non-empty str, got {tname!r}")
            if tname in self.tasks and self.tasks[tname].fn is not f:
                raise QueueError(f"a task named {tname!r} is registered already ({self.tasks[tname].fn!r})")
            if exactly_once and inspect.iscoroutinefunction(f):
                raise QueueError(
                    f"task {tname!r}: an exactly_once task runs in a transaction, not an async def"
                )
            t = Task(self, f, tname, qname, max_deliveries, limit, rate, store_result, ttl, exactly_once)
            self.tasks[tname] = t
            return t

        return register if fn is None else register(fn)

    @property
    def queues(self) -> list[str]:
        """The queues of the registered tasks, in registration order."""
        return list(dict.fromkeys(t.queue for t in self.tasks.values()))

    def get(self, name: str) -> Task:
        """The task registered as ``name``; UnknownTaskError otherwise."""
        task = self.tasks.get(name)
        if task is None:
            known = ", ".join(sorted(self.tasks)) or "none"
            raise UnknownTaskError(f"no task named {name!r} is registered (known: {known})")
        return task

    def defer_by_name(self, tr: Transaction | Database, name: str, /, *args: Any, **kwargs: Any) -> str:
        """``defer`` of the task registered as ``name``: UnknownTaskError if none is."""
        return self.get(name).defer(tr, *args, **kwargs)

    def result(self, db: Database | None, message_id: str, timeout: float | None = 10.0) -> Any:
        """The return value of the task ``message_id`` (deferred with ``store_result=True``),
        waiting up to ``timeout`` seconds (None: as long as it takes) on a watch. Raises
        TaskFailedError (the exception's type and text) when the task failed for good,
        TaskTimeoutError when it has not finished in time, NoResultError when nothing is kept
        for that id. Read-only."""
        return result(db if db is not None else self.db, self.root, message_id, timeout)

    def sweep_results(self, db: Database | None = None, *, limit: int = 1000) -> int:
        """Clear results past their TTL (a worker of the app does it at its sweeps)."""
        return sweep_results(db if db is not None else self.db, self.root, limit)
