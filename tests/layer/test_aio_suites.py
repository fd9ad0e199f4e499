"""The queue and delivery suites (tests/layer/test_queue.py, tests/layer/test_delivery.py) run again with
every Queue call going through ``fdbqueue.aio.AsyncQueue`` and its event loop: the async API
gives what the sync one gives, case by case, on every engine."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import fdbqueue
from fdbqueue import aio
from tests.layer import test_delivery, test_queue
from tests.layer.test_delivery import *  # noqa: F403 - the delivery suite's tests, collected here again
from tests.layer.test_queue import *  # noqa: F403 - the queue suite's tests, collected here again

_ROUTED = (
    "enqueue",
    "enqueue_many",
    "deduplicated",
    "dequeue",
    "lease",
    "lease_many",
    "ack",
    "ack_many",
    "nack",
    "nack_many",
    "release",
    "extend",
    "sweep",
    "peek",
    "get",
    "nth",
    "size",
    "empty",
    "delete",
)


class ThroughAsync(fdbqueue.Queue):
    """A Queue whose calls run as coroutines of ``AsyncQueue`` on this module's event loop."""

    loop: asyncio.AbstractEventLoop
    owner: threading.Thread

    def __getattribute__(self, name: str) -> Any:
        if name not in (*_ROUTED, "browse"):
            return object.__getattribute__(self, name)
        plain = fdbqueue.Queue(
            object.__getattribute__(self, "name"), root=object.__getattribute__(self, "root")
        )
        method = getattr(aio.AsyncQueue(plain), name)
        # The test's own loop in its thread; another thread (a test's Timer) runs its own.
        owner = threading.current_thread() is ThroughAsync.owner
        run: Any = ThroughAsync.loop.run_until_complete if owner else asyncio.run
        if name != "browse":
            return lambda *args, **kw: run(method(*args, **kw))

        def browse(*args: Any, **kw: Any) -> Iterator[fdbqueue.Message]:
            pages = method(*args, **kw)  # an async iterator: pulled one message at a time
            while True:
                try:
                    yield run(pages.__anext__())
                except StopAsyncIteration:
                    return

        return browse


@pytest.fixture(autouse=True)
def _through_async(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    ThroughAsync.loop = asyncio.new_event_loop()
    ThroughAsync.owner = threading.current_thread()
    for module in (test_delivery, test_queue):
        monkeypatch.setattr(module, "Queue", ThroughAsync)
    yield
    ThroughAsync.loop.close()


del test_invalid_queue_names  # noqa: F821 - names only: no Queue call to route


def test_the_calls_go_through_the_async_api(db: fdbqueue.Database, monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[str] = []
    real = aio.AsyncQueue._run

    async def counting(self: aio.AsyncQueue, method: Any, *args: Any, **kw: Any) -> Any:
        ran.append(method.__name__)
        return await real(self, method, *args, **kw)

    monkeypatch.setattr(aio.AsyncQueue, "_run", counting)
    q = test_queue.Queue("jobs")
    assert isinstance(q, ThroughAsync)
    q.enqueue(db, b"x")
    assert [m.payload for m in q.browse(db)] == [b"x"]
    assert q.dequeue(db) is not None
    assert ran == ["enqueue", "dequeue"]  # browse pulls its pages from the thread pool itself
