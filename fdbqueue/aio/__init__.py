"""asyncio: ``AsyncQueue`` (every ``Queue`` method as a coroutine), ``AsyncWorker`` (many
``async`` handlers in flight on one event loop) and ``transactional`` for ``async`` functions
taking ``tr``.

One implementation serves both APIs: a coroutine given a Database runs the same ``Queue``
method in the event loop's thread pool (its own retried transaction there), so nothing of
the queue's logic is written twice. Waiting is where the two differ: a blocking ``dequeue``,
``lease`` or ``wait`` holds no thread while it waits - it awaits the queue's watch through the
watch's completion callback (``Watch.on_ready``: the bindings' ``Future.on_ready`` on
FoundationDB, the engine's notification on the local engines), looking again when it fires,
as the blocking calls do (``fdbqueue.ops.waiting``). Given a Transaction, a coroutine runs the
method at once in the event loop's thread, inside that transaction.

    q = aio.AsyncQueue("jobs")
    await q.enqueue(db, {"n": 1})
    m = await q.dequeue(db, timeout=5)
    await aio.AsyncWorker(db, "jobs", handle, concurrency=100).run()
"""

from __future__ import annotations

from fdbqueue.aio.queue import AsyncQueue, journal, transactional, wait_watch
from fdbqueue.aio.worker import AsyncWorker

__all__ = ["AsyncQueue", "AsyncWorker", "journal", "transactional", "wait_watch"]
