"""Handlers for the process-pool tests: they run in the worker's child processes, so they live
at module level (picklable by reference) and take what they need from the message's JSON
payload (a child inherits no state from the test, and the forkserver not even later
environment changes)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import fdbqueue


def note(path: str, line: str) -> None:
    """Append one line to ``path`` (O_APPEND: lines of concurrent children do not mix)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode() + b"\n")
    finally:
        os.close(fd)


def act(m: fdbqueue.Message) -> None:
    """Write ``start <pid> <id> <delivery>``, then do what the payload says, then ``done <pid> <id>``.

    Payload keys: ``log`` (the file), ``gate`` (wait, on a first delivery, until that file
    exists), ``sleep`` (seconds), ``hang`` (sleep a minute), ``store_fails_once`` (a marker
    file: raise StoreFullError unless it exists, and create it), ``fail`` (``retry`` on a
    first delivery, ``discard``, ``error``), ``ballast`` (MiB kept alive in the child),
    ``die`` (SIGKILL its own process on a first delivery).
    """
    spec = m.json()
    note(spec["log"], f"start {os.getpid()} {m.id} {m.deliveries}")
    if spec.get("die") and m.deliveries == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    gate = spec.get("gate")
    if gate and m.deliveries == 1:
        deadline = time.monotonic() + 60
        while not Path(gate).exists() and time.monotonic() < deadline:
            time.sleep(0.01)
    time.sleep(spec.get("sleep", 0))
    if spec.get("hang"):
        time.sleep(60)
    if spec.get("ballast"):
        _BALLAST.append(bytearray(spec["ballast"] * 2**20))
    store = spec.get("store_fails_once")
    if store and not Path(store).exists():
        Path(store).touch()
        raise fdbqueue.StoreFullError("the disk is full")  # the store failing, not the message
    fail = spec.get("fail")
    if fail == "retry" and m.deliveries == 1:
        raise fdbqueue.Retry(delay=0, reason="not yet")
    if fail == "discard":
        raise fdbqueue.Discard("no use")
    if fail == "error":
        raise ValueError(f"cannot handle {m.id}")
    note(spec["log"], f"done {os.getpid()} {m.id}")


_BALLAST: list[bytearray] = []


def record(m: fdbqueue.Message) -> None:
    """For the command line: the payload is the log file's path; writes ``<pid> <id>``."""
    spec = m.json()
    time.sleep(spec.get("sleep", 0))
    note(spec["log"], f"{os.getpid()} {m.id}")


def _refuse() -> None:
    raise RuntimeError("not in a child")


class Unloadable:
    """A handler that pickles in the worker but cannot be loaded in a child."""

    def __call__(self, m: fdbqueue.Message) -> None: ...

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return (_refuse, ())
