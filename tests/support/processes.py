"""Helpers for the tests that SIGKILL real OS processes sharing one store file.

``Children`` starts processes (spawn or forkserver: never fork, which would copy the test
process's open connections), kills one, restarts it, and fails the test with the child's
own error output when a child dies by itself. ``held`` and ``assert_nothing_left`` read a
queue the way the checks of tests/processes/test_delivery.py and tests/processes/test_storm.py do.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines import versions
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.layout import READY_PARTS, ready_count

# Every key tag a message can leave behind (fdbqueue/store/layout.py): none may remain once drained.
MESSAGE_TAGS = ("r", "id", "b", "f", "l", "d", "pop", "res")


@dataclass
class Child:
    role: str
    target: Callable[..., None]
    args: tuple[Any, ...]
    proc: Any  # multiprocessing.process.BaseProcess
    ready: Any  # a multiprocessing Event the child sets once it works, or None
    may_finish: bool  # exit code 0 is a normal end (a producer that sent everything)


class Children:
    """Child processes by role; ``kill`` one with SIGKILL, ``restart`` it, ``stop`` them all.

    ``errors``: a directory where children write their stderr as ``<pid>.err`` (see
    :func:`child_stderr`); the failure message of :meth:`check_alive` quotes it.
    """

    def __init__(self, method: str = "spawn", errors: Path | None = None) -> None:
        self.ctx = multiprocessing.get_context(method)
        self.errors = errors
        self.children: list[Child] = []
        self.kills: Counter[str] = Counter()  # SIGKILLs of live children, by role
        self.stopped: Counter[str] = Counter()  # children SIGKILLed by stop(), by role

    def start(
        self,
        role: str,
        target: Callable[..., None],
        *args: Any,
        ready: bool = False,
        may_finish: bool = False,
    ) -> Child:
        """Start ``target(*args)`` (with a ready Event as its last argument if ``ready``)."""
        event = self.ctx.Event() if ready else None
        proc = self.ctx.Process(target=target, args=(*args, event) if ready else args, daemon=True)
        proc.start()
        child = Child(role, target, args, proc, event, may_finish)
        self.children.append(child)
        return child

    def restart(self, child: Child) -> Child:
        """Replace ``child`` (dead by now) with a new process of the same role and arguments."""
        self.children.remove(child)
        return self.start(
            child.role, child.target, *child.args, ready=child.ready is not None, may_finish=child.may_finish
        )

    def killable(self, role: str | None = None) -> list[Child]:
        """Live children (of ``role``) that have said they are working, if they say so."""
        return [
            c
            for c in self.children
            if (role is None or c.role == role)
            and c.proc.is_alive()
            and (c.ready is None or c.ready.is_set())
        ]

    def kill(self, child: Child) -> bool:
        """SIGKILL ``child`` and reap it; False when it had already ended."""
        alive = child.proc.is_alive()
        if alive:
            try:
                os.kill(child.proc.pid, signal.SIGKILL)
            except ProcessLookupError:  # ended between the check and the kill
                alive = False
        child.proc.join(10)
        if alive:
            self.kills[child.role] += 1
        return alive

    def check_alive(self) -> None:
        """Fail when a child ended other than by our SIGKILL (or, if it may, with exit 0)."""
        for c in self.children:
            code = c.proc.exitcode
            if code is None or code == -signal.SIGKILL or (code == 0 and c.may_finish):
                continue
            raise AssertionError(
                f"a {c.role} process (pid {c.proc.pid}) died on its own, exit code {code}:\n"
                + self.stderr_of(c.proc.pid)
            )

    def stderr_of(self, pid: int) -> str:
        if self.errors is None:
            return "(its stderr went to the test's)"
        f = self.errors / f"{pid}.err"
        return f.read_text(errors="replace")[-4000:] if f.exists() else "(no stderr file)"

    def stop(self) -> None:
        """SIGKILL every live child and reap it (counted in ``stopped``, not ``kills``)."""
        for c in self.children:
            if c.proc.is_alive():
                try:
                    os.kill(c.proc.pid, signal.SIGKILL)
                    self.stopped[c.role] += 1
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 30
        for c in self.children:
            c.proc.join(max(0.1, deadline - time.monotonic()))


@pytest.fixture
def real_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep this process's database time on the real clock, as its children's is.

    ``fake_clock().advance`` in an earlier test of this process leaves the engines' clock
    ahead (``fdbqueue.engines.versions``: database time must never run backwards in a process). A
    store this process shares with child processes would then jump that far ahead at its
    first commit here: for the children, time stands almost still until their clock catches
    up (leases of killed consumers never run out), and a sweep from here forgets every dedup
    entry older than the jump. This store is new, so running this process on the real clock
    again cannot move its versions backwards.
    """
    assert not versions.frozen(), "a fake clock is still installed"
    monkeypatch.setattr(versions, "_ahead_us", 0)


def child_stderr(errors: str) -> None:
    """In a child: send fd 2 (tracebacks, warnings) to ``<errors>/<pid>.err``.

    A forkserver's children inherit the stderr the server started with, which pytest may
    already have stopped capturing: a file of their own keeps what they say.
    """
    fd = os.open(os.path.join(errors, f"{os.getpid()}.err"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 2)
    os.close(fd)


def held(db: Any, q: Queue) -> tuple[int, int, int]:
    """The queue's ready (less taken, plus wake less counted: store/layout.py), in-flight and
    delayed counters, read in one transaction."""

    @fdbqueue.transactional
    def read(tr: Any) -> tuple[int, int, int]:
        ready = ready_count(*(tr.get(q.keys.counter(c)) for c in READY_PARTS))
        return (
            ready,
            unpack_count(tr.get(q.keys.counter("inflight"))),
            unpack_count(tr.get(q.keys.counter("delayed"))),
        )

    return read(db)  # type: ignore[no-any-return]


def assert_nothing_left(db: Any, name: str) -> None:
    """Queue ``name`` holds nothing: counters at zero, no message keys, no dead letters."""
    q = Queue(name)
    assert q.size(db) == 0 and held(db, q) == (0, 0, 0), f"{name}: counters {held(db, q)}"
    for tag in MESSAGE_TAGS:
        left = db.get_range_startswith(q.keys.q.pack((tag,)))
        assert left == [], f"{name}: keys left under {tag!r}: {left[:3]}"
    dead = list(Queue(f"{name}.error").browse(db, limit=5))
    assert dead == [], f"{name}: messages were dead-lettered: {[(m.id, m.reason) for m in dead]}"
