"""A handler's time limit (``time_limit=``): :class:`TimeLimit` runs a worker's handler calls
in threads it can give up on, and bounds how many abandoned calls may run on.

Apart from :mod:`.handling` (what workers and dispatchers share about handlers, failures and
the queues they serve) because it is a machine of its own - threads, places reserved and
given back, a stall to report - that only a worker with a time limit runs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from fdbqueue.types import check_duration


def check_time_limit(time_limit: object) -> float | None:
    """``time_limit``: None (no limit) or a number of seconds above 0."""
    return None if time_limit is None else check_duration("time_limit", time_limit, positive=True)


def time_limit_reason(seconds: float) -> str:
    """The failed delivery's reason (the dead letter's, at max_deliveries) when a handler ran
    past its time limit."""
    return f"time_limit: the handler ran past {seconds:g} s"


class _Runner:
    """A thread that runs one handler call at a time for one worker slot."""

    def __init__(self, limit: TimeLimit) -> None:
        self.limit = limit
        self.lock = threading.Lock()
        self.go = threading.Event()
        self.done = threading.Event()
        self.job: tuple[Callable[..., Any], tuple[Any, ...]] | None = None
        self.result: tuple[bool, Any] = (True, None)
        self.abandoned = False
        self.thread = threading.Thread(target=self._loop, name="fdbqueue-handler", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            self.go.wait()
            self.go.clear()
            if self.job is None:
                return
            fn, args = self.job
            self.job = None
            try:
                result: tuple[bool, Any] = (True, fn(*args))
            except BaseException as exc:  # handed to the slot, which raises it there
                result = (False, exc)
            with self.lock:
                abandoned = self.abandoned
                if not abandoned:
                    self.result = result
                    self.done.set()
            if abandoned:  # the slot gave up on this call: its result goes nowhere
                self.limit.ended()
                return

    def close(self) -> None:
        self.job = None
        self.go.set()


class TimeLimit:
    """Runs a worker's handler calls in threads it can give up on after ``seconds``.

    Python cannot stop a thread: a call past its limit is *abandoned* - it runs on, its
    result ignored - and the slot goes on in a fresh thread. At most ``most`` calls, running
    or abandoned, live at once: a call starts only on a place :meth:`reserve` took. The
    worker leases no more messages than there are free places (:meth:`free`), so none is
    leased for a slot that cannot run it; while abandoned threads take every place
    (:attr:`stalled`: a handler that ignores its time limit) it holds no message at all and
    waits (:meth:`wait`) for one of them to end.
    """

    def __init__(self, seconds: float, most: int, logger: logging.Logger) -> None:
        self.seconds = seconds
        self.most = most
        self.log = logger
        self.abandoned = 0  # abandoned threads still running
        self.running = 0  # calls started (or about to start) and not given up
        self._cond = threading.Condition()
        self._runners = threading.local()
        self._all: list[_Runner] = []

    def free(self) -> int:
        """How many more calls may start now."""
        with self._cond:
            return max(0, self.most - self.abandoned - self.running)

    @property
    def stalled(self) -> bool:
        """Abandoned threads take every place: no call can start until one of them ends."""
        return self.abandoned >= self.most

    def reserve(self) -> bool:
        """Take a place for a call (then :meth:`run` it); False when none is free."""
        with self._cond:
            if self.abandoned + self.running >= self.most:
                return False
            self.running += 1
            return True

    def run(self, stop: threading.Event, fn: Callable[..., Any], *args: Any) -> tuple[bool, Any]:
        """``fn(*args)`` in this slot's thread, on a place :meth:`reserve` took, up to
        ``seconds``: (True, its result), its exception raised here, or (False, None) when
        the call was abandoned (its place stays taken until its thread ends)."""
        runner: _Runner | None = getattr(self._runners, "runner", None)
        if runner is None:
            runner = self._runners.runner = _Runner(self)
            with self._cond:
                self._all.append(runner)
        runner.done.clear()
        runner.job = (fn, args)
        runner.go.set()
        try:
            finished = runner.done.wait(self.seconds)
        except BaseException:  # stopped at once (StopNow) while waiting: leave it behind
            if not self._abandon(runner):
                self._finished()
            raise
        if not finished and self._abandon(runner):
            return False, None
        self._finished()
        ok, value = runner.result
        if not ok:
            raise value
        return True, value

    def _finished(self) -> None:
        with self._cond:
            self.running -= 1
            self._cond.notify_all()

    def _abandon(self, runner: _Runner) -> bool:
        """Give up on ``runner``'s call unless it has just finished; True if given up."""
        with runner.lock:
            if runner.done.is_set():
                return False
            runner.abandoned = True
        self._runners.runner = None
        with self._cond:
            self._all.remove(runner)
            self.running -= 1
            self.abandoned += 1
        return True

    def ended(self) -> None:
        """An abandoned call returned at last: its thread ends, and its place is free."""
        with self._cond:
            self.abandoned -= 1
            self._cond.notify_all()

    def wait(self, stop: threading.Event, timeout: float) -> None:
        """Wait up to ``timeout`` for a free place (or ``stop``)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while self.abandoned + self.running >= self.most and not stop.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    return
                self._cond.wait(min(left, 0.25))  # a stop ends the wait within a quarter second

    def stall_advice(self) -> str:
        """What the log says while abandoned threads take every place."""
        return (
            f"{self.abandoned} handler threads abandoned past their time limit of {self.seconds:g} s "
            f"are still running (at most {self.most}): this worker leases no message until one "
            "of them ends, and holds none meanwhile (other workers take them). The handler "
            "ignores its time limit (Python cannot stop a thread): make it return in time "
            "(timeouts on its own blocking calls), or run its work in a process it can end"
        )

    def close(self) -> None:
        """End the idle slot threads (abandoned ones end when their calls do)."""
        with self._cond:
            runners, self._all = self._all, []
        for r in runners:
            r.close()
        self._runners = threading.local()
