"""A process pool for a :class:`~fdbqueue.runtime.worker.Worker` (``processes=N``): handlers
run in child processes, the parent does every database call (leases, heartbeats, acks, nacks).

A CPU-bound handler holds the GIL for every thread of a worker; celery's prefork pool,
dramatiq's processes and rq's forked work horses exist for this. Here each of the worker's
``N`` handler slots owns one child. The parent sends it the leased :class:`Message`; the
child calls the handler and answers with an outcome - ``ok``, ``retry(delay, reason)``,
``discard(reason)``, ``error(type, text, traceback)`` or ``engine(type, text)`` (the
handler's own use of a failing store) - which the parent settles exactly as it settles a
handler that ran in a thread (:func:`~fdbqueue.runtime.handling.judge`).

* The handler must be picklable by reference: a module-level function, or an instance of a
  module-level class, that the child imports by its module's name (a script's functions
  need the ``if __name__ == "__main__":`` guard). Children start with ``forkserver`` where
  the platform has it, else ``spawn`` - never a bare ``fork`` of a process with threads
  (the Python docs' ``multiprocessing`` "Contexts and start methods").
* ``time_limit``: a child still running its handler past the limit is killed (SIGKILL) and
  replaced; the message goes back as a failed delivery (the error queue at max_deliveries).
* A child that dies while it holds a message (killed, crashed, out of memory) has that
  message nacked as a failed delivery, reason ``ChildDied: ...``: retried by another child,
  and a message that kills every child it reaches ends in the error queue rather than
  killing children forever (celery's ``WorkerLostError`` plays this part).
* ``max_tasks_per_child`` and ``max_memory_per_child``: a child is replaced after that many
  handler calls, or after a call that leaves its resident memory above the limit (read from
  ``/proc/self/statm``; elsewhere the peak from ``getrusage``), as celery's
  ``worker_max_tasks_per_child`` and ``worker_max_memory_per_child`` do.
* Children ignore SIGINT and SIGTERM (a Ctrl-C or a service manager signals the whole group):
  the parent drains - its in-hand messages finish in their children - and ends them. A child
  whose parent dies exits at once (it watches the parent's sentinel).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import multiprocessing
import os
import pickle
import re
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.errors import (
    ChildDied,
    Discard,
    HandlerSignatureError,
    PoolStartError,
    QueueError,
    RemoteFailure,
    Retry,
)
from fdbqueue.ops import tracing
from fdbqueue.ops.settling import AfterAck
from fdbqueue.runtime.handling import engine_failure
from fdbqueue.types import Message

# forkserver: a fresh server process forks each child, so a restart costs a fork, not a new
# interpreter importing fdbqueue again (about 0.7 s); spawn where the platform lacks it.
START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"
START_TIMEOUT = 120.0  # seconds a new child may take to import and load the handler
TEXT_MAX = 20_000  # characters of a failure's text and traceback sent back (a reason keeps less)
STOP_TIMEOUT = 5.0  # seconds an idle child asked to exit may take before it is killed

# What :meth:`ProcessPool.call` returns when it raised nothing.
OK = "ok"
TIMED_OUT = "timed_out"  # past time_limit: the child was killed
CLOSED = "closed"  # the pool was closed at once meanwhile: the worker released the message
UNAVAILABLE = "unavailable"  # no child could be started: the message was not handled
_PAST_LIMIT: tuple[Any, ...] = ("past time_limit",)  # _answer's: no answer within time_limit


def check_processes(processes: object) -> int:
    """``processes``: an int >= 0 (0: handlers run in the worker's threads)."""
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 0:
        raise QueueError(f"processes must be an int >= 0 (0: no child processes), got {processes!r}")
    return processes


def check_max_tasks(value: object) -> int | None:
    """``max_tasks_per_child``: None (no limit) or an int >= 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise QueueError(f"max_tasks_per_child must be an int >= 1 or None, got {value!r}")
    return value


_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
}


def check_memory(value: object) -> int | None:
    """``max_memory_per_child``: None (no limit), a number of bytes (int >= 1), or a string
    with a unit: ``"512MB"`` (decimal: KB, MB, GB), ``"512MiB"`` or ``"512M"`` (binary)."""
    if value is None:
        return None
    if isinstance(value, str):
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", value)
        unit = match.group(2).lower() if match else None
        if match is None or unit not in _UNITS:
            raise QueueError(
                f"max_memory_per_child must be bytes or a size such as '512MB', '1.5GiB', got {value!r}"
            )
        size = int(float(match.group(1)) * _UNITS[unit])
    elif isinstance(value, bool) or not isinstance(value, int):
        raise QueueError(
            f"max_memory_per_child must be an int of bytes, a size such as '512MB', or None, got {value!r}"
        )
    else:
        size = value
    if size < 1:
        raise QueueError(f"max_memory_per_child must be at least 1 byte, got {value!r}")
    return size


def check_picklable(handler: Callable[..., Any], processes: int) -> bytes:
    """The handler pickled for the children; a clear error when it cannot be (a lambda, a
    function defined inside another, a bound method of an object that does not pickle)."""
    name = getattr(handler, "__qualname__", type(handler).__name__)
    try:
        return pickle.dumps(handler)
    except Exception as exc:
        raise HandlerSignatureError(
            f"with processes={processes} the handler runs in child processes, so it must be "
            f"picklable: a function defined at the top level of a module (or an instance of a "
            f"module-level class) that the children import by its module's name; {name!r} "
            f"cannot be pickled ({type(exc).__name__}: {exc}). Move it to module level, or use "
            "processes=0 (threads)"
        ) from None


@dataclass(frozen=True)
class PoolSettings:
    """A worker's pool, checked at its construction: the pickled handler and the limits."""

    handler_blob: bytes
    size: int
    max_tasks: int | None
    max_memory: int | None


def pool_settings(
    processes: int,
    mode: str,
    concurrency: int,
    handler: Callable[..., Any],
    max_tasks_per_child: object,
    max_memory_per_child: object,
) -> PoolSettings | None:
    """A Worker's ``processes`` and the child limits checked together (None: no pool)."""
    max_tasks = check_max_tasks(max_tasks_per_child)
    max_memory = check_memory(max_memory_per_child)
    if not processes:
        if max_tasks is not None or max_memory is not None:
            raise QueueError("max_tasks_per_child and max_memory_per_child need processes > 0")
        return None
    if mode != "lease":
        # The handler's writes and the message's removal are one transaction, which lives in
        # this process: a child cannot write into it (FoundationDB transactions are not shared
        # between processes), so the exactly-once promise would not hold.
        raise QueueError(
            "processes > 0 runs handlers in child processes, which cannot join the worker's "
            "transaction: use mode='lease' with processes, or exactly_once without them"
        )
    if concurrency not in (1, processes):
        raise QueueError(
            f"with processes={processes} each child runs one handler call at a time: leave "
            f"concurrency at 1 (or give {processes}), got concurrency={concurrency}"
        )
    return PoolSettings(check_picklable(handler, processes), processes, max_tasks, max_memory)


# -- the child -------------------------------------------------------------------------------


def _rss() -> int:
    """This process's resident memory in bytes: ``/proc/self/statm``'s second field (pages,
    proc(5)); where there is no /proc, the peak from getrusage (KiB on Linux, bytes on macOS)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _watch_parent() -> None:
    """Exit as soon as the parent dies, even in the middle of a handler: its messages go back
    by their leases, and nothing would read this child's answer."""
    parent = multiprocessing.parent_process()
    if parent is None:
        return
    sentinel = parent.sentinel

    def watch() -> None:
        wait([sentinel])
        os._exit(1)

    threading.Thread(target=watch, name="fdbqueue-parent-watch", daemon=True).start()


def _outcome(handler: Callable[..., Any], queue: str, m: Message) -> tuple[Any, ...]:
    """Call the handler on ``m``; its outcome as plain data the parent settles."""
    try:
        value = tracing.run(queue, m.id, m.headers, handler, m)
        # What must commit with the ack (a task's result, a chain's next task) is plain data:
        # it crosses back to the parent, which settles; any other return value stays here.
        return (OK, value if isinstance(value, AfterAck) else None)
    except Retry as exc:
        return ("retry", exc.delay, exc.reason)
    except Discard as exc:
        return ("discard", exc.reason)
    except BaseException as exc:  # SystemExit too: the child stays to serve the next message
        kind = "engine" if engine_failure(exc) else "error"
        try:
            text = str(exc)
        except Exception as unprintable:  # a broken __str__ must not end the child
            text = f"<{type(exc).__name__}.__str__ failed: {type(unprintable).__name__}>"
        return (kind, type(exc).__name__, text[:TEXT_MAX], traceback.format_exc()[-TEXT_MAX:])


def child_main(conn: Connection, handler_blob: bytes) -> None:
    """A child's loop: load the handler, then answer each ``(seq, queue, message)`` with
    ``(seq, outcome, resident bytes)`` until asked to exit (None) or the parent goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when children end
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    _watch_parent()
    try:
        handler = pickle.loads(handler_blob)
    except BaseException as exc:
        conn.send(("failed", f"{type(exc).__name__}: {exc}"))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            request = conn.recv()
        except (EOFError, OSError):
            return
        if request is None:
            return
        seq, queue, m = request
        outcome = _outcome(handler, queue, m)
        conn.send((seq, outcome, _rss()))


# -- the parent ------------------------------------------------------------------------------


class _Child:
    """One child process and the parent's end of its pipe."""

    def __init__(self, ctx: Any, handler_blob: bytes) -> None:
        parent_end, child_end = ctx.Pipe()
        self.proc = ctx.Process(
            target=child_main, args=(child_end, handler_blob), name="fdbqueue-pool-child", daemon=True
        )
        self.proc.start()
        child_end.close()
        self.conn: Connection = parent_end
        self.pid: int = self.proc.pid
        self.ready = False
        self.tasks = 0
        self.retire = False  # replace it before its next call

    def wait_ready(self, timeout: float) -> None:
        """Wait for the child to load the handler; :class:`PoolStartError` if it cannot."""
        if self.ready:
            return
        got = wait([self.conn, self.proc.sentinel], timeout)
        reply: Any = None
        if self.conn in got:
            try:
                reply = self.conn.recv()
            except (EOFError, OSError):
                reply = None
        if reply is not None and reply[0] == "ready":
            self.ready = True
            return
        self.kill()
        if reply is not None:
            why = f"cannot load the handler: {reply[1]}"
        elif not got:
            why = f"did not start within {timeout:g} s"
        else:
            why = f"died while starting ({_death(self.proc.exitcode)}; its error output says why)"
        raise PoolStartError(
            f"a worker child process {why}. With processes > 0 the handler must be importable in a "
            'fresh process by its module\'s name (a script needs the `if __name__ == "__main__":` guard)'
        )

    def kill(self) -> None:
        if self.proc.is_alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
        self.proc.join(STOP_TIMEOUT)
        self.conn.close()

    def stop(self) -> None:
        """Ask an idle child to exit; kill it if it does not."""
        with contextlib.suppress(OSError, ValueError):
            self.conn.send(None)
        self.proc.join(STOP_TIMEOUT)
        self.kill()


def _death(exitcode: int | None) -> str:
    if exitcode is None:
        return "still running"
    if exitcode < 0:
        try:
            return f"killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"killed by signal {-exitcode}"
    return f"exit code {exitcode}"


class ProcessPool:
    """``size`` child processes running ``handler``, one per handler slot of a worker."""

    def __init__(self, settings: PoolSettings, *, time_limit: float | None, logger: logging.Logger) -> None:
        self.blob = settings.handler_blob
        self.size = settings.size
        self.time_limit = time_limit
        self.max_tasks = settings.max_tasks
        self.max_memory = settings.max_memory
        self.log = logger
        self.ctx = multiprocessing.get_context(START_METHOD)
        self.restarts = 0  # children replaced (max tasks, memory, time limit, death)
        self._cond = threading.Condition()
        self._idle: list[_Child] = []
        self._busy: set[_Child] = set()
        self._seq = 0
        self._closed = False

    def start(self) -> None:
        """Start every child and wait until each has loaded the handler (errors here, before
        the worker leases anything)."""
        if START_METHOD == "forkserver":
            _preload()
        children: list[_Child] = []
        try:
            try:
                children.extend(_Child(self.ctx, self.blob) for _ in range(self.size))
            except Exception as exc:  # a daemonic process may have no children, no fork left ...
                raise PoolStartError(
                    f"could not start a worker child process ({START_METHOD}): {type(exc).__name__}: {exc}"
                ) from exc
            for c in children:
                c.wait_ready(START_TIMEOUT)
        except BaseException:
            for c in children:
                c.kill()
            raise
        with self._cond:
            self._closed = False
            self._idle.extend(children)

    @property
    def pids(self) -> list[int]:
        """The children's process ids, idle and busy."""
        with self._cond:
            return [c.pid for c in [*self._idle, *self._busy]]

    def call(self, q: Queue, m: Message, stop: threading.Event) -> tuple[str, AfterAck | None]:
        """Run the handler on ``m`` in a child: :data:`OK` with what the handler returned to
        commit with its ack (an :class:`AfterAck`, else None); :data:`TIMED_OUT` (the child was
        killed past ``time_limit``); :data:`CLOSED` (the pool was closed at once); or
        :data:`UNAVAILABLE` (no child could take it: the message never reached one). A failing
        handler raises here what it raised there - ``Retry``, ``Discard`` or a
        :class:`RemoteFailure` with its type, text and traceback - and a child that died
        holding ``m`` raises :class:`ChildDied`."""
        try:
            child = self._take()
        except PoolStartError as exc:
            if self._closed:
                return CLOSED, None
            self.log.error("%s; the message goes back (not counted)", exc)
            stop.wait(1.0)  # not a hot loop of failing starts
            return UNAVAILABLE, None
        if child is None:
            return CLOSED, None
        replace = True
        try:
            with self._cond:
                self._seq += 1
                seq = self._seq
            try:
                child.conn.send((seq, q.name, _portable(m)))
            except (OSError, ValueError):  # it died idle: the message never reached it
                return (CLOSED if self._closed else UNAVAILABLE), None
            reply = self._answer(child, seq)
            if reply is None or reply is _PAST_LIMIT:
                if self._closed:
                    return CLOSED, None
                if reply is _PAST_LIMIT:
                    child.kill()
                    return TIMED_OUT, None
                # Died: its pipe may close before its exit is known (is_alive() still True
                # for a moment), so the pipe's end, not is_alive(), tells a death from a limit.
                return self._died(child, m)
            _, outcome, rss = reply
            replace = False
            child.tasks += 1
            self._check_limits(child, rss)
            return _settle(outcome)
        finally:
            if replace:
                child.kill()
                child.retire = True
            self._give(child)

    def _answer(self, child: _Child, seq: int) -> tuple[Any, ...] | None:
        """The child's answer to request ``seq``; None when it died; :data:`_PAST_LIMIT` when it
        ran past the time limit. Interrupted (a second SIGTERM raising StopNow here): the child
        is killed, since it runs a call no one will settle."""
        deadline = None if self.time_limit is None else time.monotonic() + self.time_limit
        try:
            while True:
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                got = wait([child.conn, child.proc.sentinel], left)
                if child.conn in got or child.conn.poll():
                    try:
                        reply: tuple[Any, ...] = child.conn.recv()
                    except (EOFError, OSError):
                        return None
                    if reply[0] == seq:
                        return reply
                    continue  # an answer to an earlier call given up on: not this one's
                if got:
                    return None
                if deadline is not None and time.monotonic() >= deadline:
                    return _PAST_LIMIT
        except BaseException:
            child.kill()
            raise

    def _died(self, child: _Child, m: Message) -> tuple[str, AfterAck | None]:
        child.proc.join(1.0)
        raise ChildDied(
            f"the worker's child process {child.pid} died ({_death(child.proc.exitcode)}) while it held "
            f"message {m.id}"
        )

    def _check_limits(self, child: _Child, rss: int) -> None:
        if self.max_tasks is not None and child.tasks >= self.max_tasks:
            child.retire = True
            self.log.debug(
                "worker child %d ran %d calls (max_tasks_per_child): replacing it", child.pid, child.tasks
            )
        elif self.max_memory is not None and rss > self.max_memory:
            child.retire = True
            self.log.info(
                "worker child %d uses %d MiB, above max_memory_per_child (%d MiB): replacing it",
                child.pid,
                rss // 2**20,
                self.max_memory // 2**20,
            )

    def _take(self) -> _Child | None:
        """An idle child, ready (a replacement is started here); None once closed."""
        with self._cond:
            while not self._idle and not self._closed:
                self._cond.wait(0.25)
            if self._closed:
                return None
            child = self._idle.pop()
            self._busy.add(child)
        try:
            if child.retire or not child.proc.is_alive():
                child.kill()
                with self._cond:
                    self.restarts += 1
                child = self._replace(child)
            child.wait_ready(START_TIMEOUT)
        except BaseException:
            with self._cond:
                self._busy.discard(child)
                child.retire = True
                self._idle.append(child)  # another try at the next call
                self._cond.notify()
            raise
        return child

    def _replace(self, old: _Child) -> _Child:
        try:
            new = _Child(self.ctx, self.blob)
        except Exception as exc:
            raise PoolStartError(
                f"could not start a worker child process: {type(exc).__name__}: {exc}"
            ) from exc
        with self._cond:
            self._busy.discard(old)
            self._busy.add(new)
        return new

    def _give(self, child: _Child) -> None:
        """Back to the idle list after a call; a child to retire is replaced now, so that the
        new one starts while the parent settles."""
        if child.retire and not self._closed:
            child.stop() if child.proc.is_alive() else child.kill()
            with self._cond:
                self.restarts += 1
            try:
                child = self._replace(child)
            except Exception as exc:  # could not start one: the next call tries again
                self.log.warning("could not start a worker child process: %s", exc)
        with self._cond:
            self._busy.discard(child)
            if self._closed:
                child.kill()
                return
            self._idle.append(child)
            self._cond.notify()

    def close(self, *, kill: bool = False) -> None:
        """End the children: idle ones are asked to exit; with ``kill`` (stopped at once) or
        when still busy they are killed, and the calls waiting on them return :data:`CLOSED`."""
        with self._cond:
            self._closed = True
            idle, self._idle = self._idle, []
            busy = list(self._busy)
            self._cond.notify_all()
        for c in busy:
            with contextlib.suppress(ProcessLookupError):
                os.kill(c.pid, signal.SIGKILL)  # its call sees the death and returns CLOSED
        for c in idle:
            c.kill() if kill else c.stop()


def _portable(m: Message) -> Message:
    """``m`` as it pickles: its read-only mappings (views of the stored record) as dicts."""
    return dataclasses.replace(m, headers=dict(m.headers), extra=dict(m.extra))


def _settle(outcome: tuple[Any, ...]) -> tuple[str, AfterAck | None]:
    """A child's outcome as the parent's return (:data:`OK` and what commits with the ack) or
    exception."""
    kind = outcome[0]
    if kind == OK:
        return OK, outcome[1]
    if kind == "retry":
        raise Retry(outcome[1], outcome[2])
    if kind == "discard":
        raise Discard(outcome[1])
    _, type_name, text, tb = outcome
    raise RemoteFailure(type_name, text, tb, engine=kind == "engine")


def _preload() -> None:
    """Have the forkserver import fdbqueue once, so that each child it forks starts at once.

    Only before the server starts (a running server keeps its modules); the modules already
    listed (``__main__`` by default) are kept."""
    from multiprocessing import forkserver

    server: Any = getattr(forkserver, "_forkserver", None)
    if server is None or getattr(server, "_forkserver_pid", None) is not None:
        return
    current = list(getattr(server, "_preload_modules", ["__main__"]))
    if __name__ not in current:
        forkserver.set_forkserver_preload([*current, __name__])
