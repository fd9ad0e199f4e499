"""Blocking operations written once, for the blocking API and for asyncio: steps.

A blocking operation (a blocking dequeue or lease, waiting for a queue, following the journal)
is a generator of *steps*: it yields what it needs done and is sent back the outcome, or
thrown the exception, as in the "sans-I/O" style of protocol libraries (h11, hyper-h2):

* :class:`Run` - a call that may block (a transaction and its commit);
* :class:`Wait` - until one of some watches fires, or a timeout passes;
* :class:`Emit` - a value for the caller of an iterator (a journal entry).

:func:`drive` and :func:`iterate` take the steps in the calling thread (fdbqueue's blocking
API); ``fdbqueue.aio`` drives the very same steps with coroutines: each call in the event
loop's thread pool, each wait on the watches' callbacks, no thread held while waiting. So
each loop, with its deadlines and its re-checks, exists once.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Generator
from typing import Any, NamedTuple, TypeVar

from fdbqueue.engines.contract import Watch
from fdbqueue.errors import EngineError

__all__ = [
    "REFUSED_WATCH_RECHECK",
    "Emit",
    "Run",
    "Steps",
    "Wait",
    "drive",
    "iterate",
    "refused",
    "refused_wait",
    "resume",
    "wait_on",
    "wait_watches",
]

T = TypeVar("T")

# When the database refuses another watch (1032 too_many_watches: FoundationDB allows 10,000
# outstanding watches per database by default, ``DatabaseContext::maxOutstandingWatches`` in
# ``fdbclient/NativeAPI.actor.cpp``), a waiter falls back to re-checking the queue this often,
# still bounded by its own timeout and the queue's next deadline.
REFUSED_WATCH_RECHECK = 0.2


class Run(NamedTuple):
    """Call ``fn()``, which may block; the steps are sent what it returns (or thrown what it raised)."""

    fn: Callable[[], Any]


class Wait(NamedTuple):
    """Until one of ``watches`` fires (sent True) or ``timeout`` passes (False): see :func:`wait_watches`."""

    watches: list[Watch]
    timeout: float | None


class Emit(NamedTuple):
    """``value`` for the caller of :func:`iterate` (or its asyncio twin); the steps are sent None."""

    value: Any


Step = Run | Wait | Emit
Steps = Generator[Step, Any, T]


def refused(watch: Watch) -> bool:
    """True when ``watch`` failed with 1032 (too_many_watches)."""
    if not watch.is_ready():
        return False
    try:
        watch.wait(0)
    except EngineError as exc:
        return exc.code == 1032
    return False


def refused_wait(timeout: float | None) -> tuple[float, bool]:
    """For a refused watch: how long to sleep instead, and what the wait then answers
    (True: look again, as after a firing; False: ``timeout`` passed)."""
    if timeout is not None and timeout <= REFUSED_WATCH_RECHECK:
        return max(0.0, timeout), False
    return REFUSED_WATCH_RECHECK, True


def wait_on(watch: Watch, timeout: float | None) -> bool:
    """``watch.wait(timeout)``; a refused watch (1032) waits a bounded re-check interval instead.

    True when the watch fired, or when a refused watch's re-check interval ended before
    ``timeout`` (the caller looks again, as after a firing); False when ``timeout`` passed.
    Raises any other error the watch failed with.
    """
    try:
        return watch.wait(timeout)
    except EngineError as exc:
        if exc.code != 1032:
            raise
    pause, answer = refused_wait(timeout)
    time.sleep(pause)
    return answer


def wait_watches(watches: list[Watch], timeout: float | None) -> bool:
    """One watch: :func:`wait_on`. Several: True once one fires or fails (the caller reads
    again), False when ``timeout`` passes; a thread each, since a thread can wait on one."""
    if len(watches) == 1:
        return wait_on(watches[0], timeout)
    fired = threading.Event()

    def wait(w: Watch) -> None:
        try:
            if w.wait(timeout):
                fired.set()
        except EngineError:
            fired.set()

    for w in watches:
        threading.Thread(target=wait, args=(w,), daemon=True).start()
    return fired.wait(timeout)


def resume(steps: Steps[T], send: Any, error: BaseException | None) -> tuple[Step | None, Any]:
    """Advance ``steps`` by sending ``send`` (or throwing ``error``): (the next step, None),
    or (None, their result) once they end. The part every driver shares."""
    try:
        return (steps.send(send) if error is None else steps.throw(error)), None
    except StopIteration as stop:
        return None, stop.value


def _perform(step: Run | Wait) -> Any:
    return step.fn() if isinstance(step, Run) else wait_watches(step.watches, step.timeout)


def iterate(steps: Steps[T]) -> Generator[Any, None, T]:
    """Take ``steps`` in this thread, yielding what they emit; returns their result."""
    send: Any = None
    error: BaseException | None = None
    try:
        while True:
            step, result = resume(steps, send, error)
            if step is None:
                return result  # type: ignore[no-any-return]
            send, error = None, None
            if isinstance(step, Emit):
                yield step.value
                continue
            try:
                send = _perform(step)
            except BaseException as exc:  # thrown into the steps, which may handle it
                error = exc
    finally:
        steps.close()  # the caller stopped early: the steps' own clean-up (watches) runs


def drive(steps: Steps[T]) -> T:
    """Take ``steps`` in this thread; their result. They may not emit (use :func:`iterate`)."""
    taking = iterate(steps)
    try:
        value = next(taking)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    taking.close()
    raise TypeError(f"drive() cannot take an Emit ({value!r}): use iterate()")
