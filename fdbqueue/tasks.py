"""The face of tasks: :class:`Tasks`, a registry of task functions over a database, and the
worker that runs them - a :class:`~fdbqueue.Worker` (threads) or, when a task is an ``async
def``, an :class:`~fdbqueue.aio.AsyncWorker`. Defer and results are ``fdbqueue.api.tasks``;
the handler that runs a task message is ``fdbqueue.runtime.tasks``."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from fdbqueue.api.tasks import TaskRegistry
from fdbqueue.engines.contract import Database
from fdbqueue.errors import QueueError
from fdbqueue.runtime.handling import WorkerStats
from fdbqueue.runtime.tasks import (
    AsyncTaskRunner,
    ExactlyOnceTaskRunner,
    TaskRunner,
    prepare_queues,
    worker_time_limit,
)
from fdbqueue.runtime.timelimit import check_time_limit
from fdbqueue.runtime.worker import Worker

if TYPE_CHECKING:  # imported when used: `import fdbqueue` imports no asyncio
    import asyncio

    from fdbqueue.aio.worker import AsyncWorker


class Tasks(TaskRegistry):
    """A registry of task functions over ``db`` (a Database, a URL, or None for
    ``fdbqueue.open()``'s default); ``queue``: the queue of tasks that name none (``"tasks"``);
    ``result_ttl``: how long results are kept (one day).

    ``@app.task`` registers a function; ``task.defer(tr, ...)`` enqueues a call (JSON
    arguments, checked against the signature) in the caller's transaction;
    ``app.result(db, id)`` waits for a kept result; ``app.worker().run()`` runs the tasks.
    """

    def worker(
        self,
        *,
        concurrency: int = 4,
        processes: int = 0,
        time_limit: float | None = None,
        db: Database | None = None,
        **options: Any,
    ) -> Worker | AsyncTaskWorker:
        """A worker over the queues of the registered tasks: a lease-mode
        :class:`~fdbqueue.Worker` with ``concurrency`` handler threads, or, when any task is
        an ``async def``, an :class:`AsyncTaskWorker` (the AsyncWorker, ``concurrency``
        tasks in flight; plain functions run in its thread pool), or, when the tasks are
        ``exactly_once``, an exactly-once Worker (each run in the transaction that removes its
        message; on the embedded engine one at a time). Each one's ``run()`` runs
        until stopped and returns its WorkerStats. ``processes``: child processes running
        the handlers (the tasks must be importable: module-level functions of a module-level
        app); ``concurrency`` is then ``processes``. ``time_limit``: seconds
        a task may run (default: the longest of the tasks' own). ``options``: the Worker's
        (``lease_seconds``, ``heartbeat``, ``shutdown_timeout``, ...). Creates the tasks'
        queues (max_deliveries at least their tasks')."""
        if not self.tasks:
            raise QueueError("no task is registered: decorate functions with @app.task first")
        target = db if db is not None else self.db
        if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
            raise QueueError(f"processes must be an int >= 0, got {processes!r}")
        limit = worker_time_limit(self, check_time_limit(time_limit))
        once = [t.exactly_once for t in self.tasks.values()]
        if any(once):
            if not all(once):
                raise QueueError(
                    "exactly_once tasks run on an exactly-once worker, the others on a lease-mode "
                    "one: register them in two apps (Tasks) and run a worker of each"
                )
            if processes:
                raise QueueError("exactly_once tasks run in the worker's transaction: processes=0 with them")
            prepare_queues(self, target)
            handler = ExactlyOnceTaskRunner(self, target, limit)
            return Worker(
                target,
                self.queues,
                handler,
                mode="exactly_once",
                concurrency=concurrency,
                time_limit=limit,
                **options,
            )
        if any(t.is_async for t in self.tasks.values()):
            if processes:
                raise QueueError("async tasks run on an event loop (AsyncWorker): processes=0 with them")
            return AsyncTaskWorker(
                self.aio_worker(concurrency=concurrency, time_limit=limit, db=target, **options)
            )
        if processes:  # one handler call per child at a time: the pool's concurrency is its size
            options["processes"] = processes
            concurrency = processes
        prepare_queues(self, target)
        runner = TaskRunner(self, target, limit)
        return Worker(target, self.queues, runner, concurrency=concurrency, time_limit=limit, **options)

    def aio_worker(
        self,
        *,
        concurrency: int = 10,
        time_limit: float | None = None,
        db: Database | None = None,
        **options: Any,
    ) -> AsyncWorker:
        """An :class:`~fdbqueue.aio.AsyncWorker` over the tasks' queues, for an application's
        own event loop: ``await app.aio_worker().run()``. ``async def`` tasks are awaited on
        it, plain ones run in its thread pool."""
        from fdbqueue.aio.worker import AsyncWorker

        if not self.tasks:
            raise QueueError("no task is registered: decorate functions with @app.task first")
        if any(t.exactly_once for t in self.tasks.values()):
            raise QueueError(
                "exactly_once tasks run on an exactly-once worker (app.worker()), not an AsyncWorker"
            )
        target = db if db is not None else self.db
        limit = worker_time_limit(self, check_time_limit(time_limit))
        prepare_queues(self, target)
        runner = AsyncTaskRunner(self, target, limit)
        return AsyncWorker(target, self.queues, runner, concurrency=concurrency, time_limit=limit, **options)


class AsyncTaskWorker:
    """``app.worker()`` when a task is async: the AsyncWorker run on an event loop of its
    own, with the thread Worker's ``run()`` and ``stop()``."""

    def __init__(self, worker: AsyncWorker) -> None:
        self.aio = worker
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def stats(self) -> WorkerStats:
        return self.aio.stats

    def run(
        self, *, max_messages: int | None = None, until_empty: bool = False, install_signals: bool = False
    ) -> WorkerStats:
        """Run the AsyncWorker until stopped (see :meth:`fdbqueue.aio.AsyncWorker.run`)."""
        import asyncio

        async def main() -> WorkerStats:
            self._loop = asyncio.get_running_loop()
            return await self.aio.run(
                max_messages=max_messages, until_empty=until_empty, install_signals=install_signals
            )

        try:
            return asyncio.run(main())
        finally:
            self._loop = None

    def stop(self) -> None:
        """Stop it from any thread."""
        loop = self._loop
        if loop is not None:
            loop.call_soon_threadsafe(self.aio.stop)
        else:
            self.aio.stop()
