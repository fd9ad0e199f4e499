"""asyncio's queue face: :class:`AsyncQueue` (every ``Queue`` method as a coroutine), the
journal as an async iterator, ``transactional`` for ``async`` functions taking ``tr``, and how
a coroutine awaits a watch or drives the blocking API's steps without holding a thread
(:func:`wait_watch`, :func:`drive`, :func:`iterate`).

Apart from :mod:`.worker` (``AsyncWorker``, which runs handlers on these); the package's face,
``fdbqueue.aio``, names both (its docstring says how the two APIs share one implementation).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction, Watch, adopt, is_transaction
from fdbqueue.errors import EngineError, QueueError
from fdbqueue.ops import journaling
from fdbqueue.ops.steps import Emit, Run, Steps, refused, refused_wait, resume
from fdbqueue.ops.txn import as_database
from fdbqueue.ops.waiting import wait_ready_steps
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.types import Item, JournalEntry, Message, SweepStats, check_duration

T = TypeVar("T")


async def _off(fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` in the running loop's thread pool."""
    loop = asyncio.get_running_loop()
    return await loop.run_in_executor(None, functools.partial(fn, *args, **kwargs))


async def wait_watch(watch: Watch, timeout: float | None) -> bool:
    """Await ``watch`` up to ``timeout`` seconds without a thread: True when it fired (or
    was refused by the database and a re-check interval passed), False on timeout. Raises
    the error it failed with."""
    loop = asyncio.get_running_loop()
    fired: asyncio.Future[None] = loop.create_future()

    def settle() -> None:
        if not fired.done():
            fired.set_result(None)

    def done() -> None:  # from the thread that completed the watch
        loop.call_soon_threadsafe(settle)

    watch.on_ready(done)
    try:
        await asyncio.wait_for(fired, timeout)
    except asyncio.TimeoutError:
        return False
    if refused(watch):  # 1032 too_many_watches: look again after a bounded interval
        pause, answer = refused_wait(timeout)
        await asyncio.sleep(pause)
        return answer
    watch.wait(0)  # raises what it failed with
    return True


async def _steps(steps: Steps[T], result: list[T]) -> AsyncIterator[Any]:
    """``fdbqueue.ops.steps.iterate`` with coroutines: each call in the loop's thread pool, each
    wait on the watches' callbacks (no thread held); yields what the steps emit and leaves
    their result in ``result`` (an async generator cannot return one)."""
    send: Any = None
    error: BaseException | None = None
    try:
        while True:
            step, done = resume(steps, send, error)
            if step is None:
                result.append(done)
                return
            send, error = None, None
            if isinstance(step, Emit):
                yield step.value
                continue
            try:
                if isinstance(step, Run):
                    send = await _off(step.fn)
                else:
                    send = await _wait_watches(step.watches, step.timeout)
            except BaseException as exc:  # thrown into the steps, which may handle it
                error = exc
    finally:
        steps.close()  # cancelled or stopped early: the steps cancel their watches


async def drive(steps: Steps[T]) -> T:
    """``fdbqueue.ops.steps.drive`` with coroutines: their result. Cancelling it cancels the
    steps' watches."""
    result: list[T] = []
    async for value in _steps(steps, result):
        raise TypeError(f"drive() cannot take an Emit ({value!r}): use iterate()")
    return result[0]


async def iterate(steps: Steps[None]) -> AsyncIterator[Any]:
    """``fdbqueue.ops.steps.iterate`` with coroutines: yields what the steps emit."""
    async for value in _steps(steps, []):
        yield value


async def _wait_watches(watches: list[Watch], timeout: float | None) -> bool:
    """``fdbqueue.ops.steps.wait_watches``, awaited."""
    if len(watches) == 1:
        return await wait_watch(watches[0], timeout)
    return await _first(watches, timeout)


class AsyncQueue:
    """``Queue`` with coroutines. ``tr`` is a Database (the call runs in the loop's thread
    pool, in its own retried transaction) or a Transaction (runs now, in it)."""

    def __init__(self, name: str | Queue, *, root: tuple[Any, ...] | None = None) -> None:
        if isinstance(name, Queue):
            self.queue = name
        else:
            self.queue = Queue(name) if root is None else Queue(name, root=root)
        self.name = self.queue.name
        self.keys = self.queue.keys

    def __repr__(self) -> str:
        return f"AsyncQueue({self.name!r})"

    async def _run(self, method: Callable[..., T], tr: Transaction | Database, *args: Any, **kw: Any) -> T:
        tr = adopt(tr)
        if is_transaction(tr):
            return method(tr, *args, **kw)  # inside the caller's transaction: at once
        return await _off(method, tr, *args, **kw)

    async def enqueue(self, tr: Transaction | Database, payload: object, **kw: Any) -> str:
        """:meth:`Queue.enqueue`."""
        return await self._run(self.queue.enqueue, tr, payload, **kw)

    async def enqueue_many(
        self, tr: Transaction | Database, payloads: Sequence[Item], **kw: Any
    ) -> list[str]:
        """:meth:`Queue.enqueue_many`."""
        return await self._run(self.queue.enqueue_many, tr, payloads, **kw)

    async def deduplicated(self, tr: Transaction | Database, dedup_key: str) -> str | None:
        return await self._run(self.queue.deduplicated, tr, dedup_key)

    async def dequeue(
        self,
        tr: Transaction | Database,
        *,
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
        fallback: bool = False,
    ) -> Message | None:
        """:meth:`Queue.dequeue`; a blocking one (``timeout``) awaits the queue's watch."""
        if timeout is None or is_transaction(adopt(tr)):
            return await self._run(self.queue.dequeue, tr, timeout=timeout, where=where, fallback=fallback)
        return await drive(self.queue.dequeue_steps(as_database(tr), timeout, where, fallback))

    async def lease(
        self, tr: Transaction | Database, lease_seconds: float | None = None, *, timeout: float | None = None
    ) -> Message | None:
        """:meth:`Queue.lease`; a blocking one (``timeout``) awaits the queue's watch."""
        got = await self.lease_many(tr, 1, lease_seconds, timeout=timeout)
        return got[0] if got else None

    async def lease_many(
        self,
        tr: Transaction | Database,
        n: int,
        lease_seconds: float | None = None,
        *,
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[Message]:
        """:meth:`Queue.lease_many`; a blocking one (``timeout``) awaits the queue's watch."""
        if timeout is None or is_transaction(adopt(tr)):
            return await self._run(self.queue.lease_many, tr, n, lease_seconds, timeout=timeout, where=where)
        steps = self.queue.lease_steps(as_database(tr), n, lease_seconds, timeout, where)
        return await drive(steps) or []

    async def wait(self, db: Database, timeout: float | None = None) -> bool:
        """:meth:`Queue.wait`: until a message may be ready (True) or ``timeout`` passes
        (False), holding no thread."""
        if is_transaction(db) or not hasattr(db, "create_transaction"):
            raise QueueError("wait() needs a Database: a watch arms only when its transaction commits")
        if timeout is not None:
            timeout = check_duration("timeout", timeout)
        return await drive(wait_ready_steps(db, self.keys, timeout))

    async def ack(self, tr: Transaction | Database, m: Message) -> None:
        await self._run(self.queue.ack, tr, m)

    async def ack_many(self, tr: Transaction | Database, messages: Sequence[Message]) -> list[Message]:
        return await self._run(self.queue.ack_many, tr, messages)

    async def nack(self, tr: Transaction | Database, m: Message, **kw: Any) -> str:
        return await self._run(self.queue.nack, tr, m, **kw)

    async def nack_many(
        self, tr: Transaction | Database, messages: Sequence[Message], **kw: Any
    ) -> list[str | None]:
        return await self._run(self.queue.nack_many, tr, messages, **kw)

    async def release(self, tr: Transaction | Database, m: Message) -> None:
        await self._run(self.queue.release, tr, m)

    async def extend(self, tr: Transaction | Database, m: Message, lease_seconds: float) -> Message:
        return await self._run(self.queue.extend, tr, m, lease_seconds)

    async def sweep(self, tr: Transaction | Database, *, limit: int = 100) -> SweepStats:
        return await self._run(self.queue.sweep, tr, limit=limit)

    async def peek(self, tr: Transaction | Database) -> Message | None:
        return await self._run(self.queue.peek, tr)

    async def get(self, tr: Transaction | Database, msg_id: str) -> Message | None:
        return await self._run(self.queue.get, tr, msg_id)

    async def nth(self, tr: Transaction | Database, n: int) -> Message | None:
        return await self._run(self.queue.nth, tr, n)

    async def size(self, tr: Transaction | Database) -> int:
        return await self._run(self.queue.size, tr)

    async def empty(self, tr: Transaction | Database) -> bool:
        return await self._run(self.queue.empty, tr)

    async def delete(self, tr: Transaction | Database, msg_id: str) -> bool:
        return await self._run(self.queue.delete, tr, msg_id)

    async def browse(
        self, tr: Transaction | Database, *, limit: int | None = None, batch: int = 100
    ) -> AsyncIterator[Message]:
        """:meth:`Queue.browse` as an async iterator: a batch at a time from the thread pool."""
        it = self.queue.browse(tr, limit=limit, batch=batch)
        direct = is_transaction(adopt(tr))
        while True:
            take = functools.partial(_take, it, batch)
            page = take() if direct else await _off(take)
            for m in page:
                yield m
            if len(page) < batch:
                return


def _take(it: Iterator[T], n: int) -> list[T]:
    return list(itertools.islice(it, n))


async def journal(
    db: Database,
    queue: str | None,
    *,
    since: bytes | str | None = None,
    limit: int | None = None,
    follow: bool = False,
    timeout: float | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> AsyncIterator[JournalEntry]:
    """``fdbqueue.journal`` as an async iterator: pages read in the thread pool; with
    ``follow`` it then awaits the journal's watches (no thread held) and yields new entries as
    they commit, until ``timeout`` seconds pass without one (None: for ever)."""
    steps = journaling.journal_steps(
        db, queue, since=since, limit=limit, follow=follow, timeout=timeout, root=root
    )
    async for e in iterate(steps):
        yield e


async def _first(watches: list[Watch], timeout: float | None) -> bool:
    """Await the first of ``watches`` to fire or fail (True), or ``timeout`` (False)."""
    waits = [asyncio.ensure_future(wait_watch(w, timeout)) for w in watches]
    try:
        done, _ = await asyncio.wait(waits, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        return any(not f.cancelled() and (f.exception() is not None or f.result()) for f in done)
    finally:
        for f in waits:
            f.cancel()


def transactional(fn: Callable[..., Awaitable[T]]) -> Callable[..., Awaitable[T]]:
    """For ``async def f(tr, ...)``: given a Database, runs ``f`` in a transaction of its own
    and commits it, retrying on retryable errors (FoundationDB's retry loop, as
    ``fdbqueue.transactional``); given a Transaction, awaits ``f`` inside it.

    The transaction lives in the event loop's thread: use ``tr`` (and AsyncQueue calls given
    ``tr``) inside ``f``, not calls given the Database, which would wait for the same store's
    writer (the embedded engine has one) from another thread while ``f`` holds it.
    """

    @functools.wraps(fn)
    async def run(tr: Transaction | Database, *args: Any, **kwargs: Any) -> T:
        tr = adopt(tr)
        if is_transaction(tr):
            return await fn(tr, *args, **kwargs)
        t = as_database(tr).create_transaction()
        try:
            while True:
                try:
                    result = await fn(t, *args, **kwargs)
                    t.commit()
                    return result
                except EngineError as exc:
                    t.on_error(exc)  # retryable: backs off and resets; else raises
        finally:
            t.cancel()

    return run
