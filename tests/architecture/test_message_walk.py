"""The walk of one message through enqueue, lease and nack (to the error queue): each step goes
down the layers and enters each module of the package once.

A profile hook notes, at every call into the package, the chain of package modules on the
stack since the last callback (a function defined inside another, or a lambda, that a retry
loop or an engine runs for its definer: the definer's own module calling itself, in effect);
the engines are left out, below every layer. A generator of steps (``fdbqueue.ops.steps``) that
its driver resumes counts as a callback too. A chain that leaves a module and comes back to it
(``queue -> leasing -> queue``: a lower module calling back up) fails, and so does a call from
a lower layer into a higher one (tests/architecture/test_imports.py has the layers).
"""

from __future__ import annotations

import inspect
import itertools
import sys
from collections.abc import Callable, Iterator
from types import FrameType
from typing import Any

import fdbqueue
from fdbqueue import Queue
from tests.architecture.test_imports import LAYERS

PACKAGE = "fdbqueue."


def _module(frame: FrameType) -> str | None:
    name = frame.f_globals.get("__name__", "")
    if not isinstance(name, str) or not name.startswith(PACKAGE) or name.startswith(PACKAGE + "engines"):
        return None
    return name[len(PACKAGE) :]


def _chains(step: Callable[[], object]) -> Iterator[tuple[str, ...]]:
    seen: set[tuple[str, ...]] = set()

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or _module(frame) is None:
            return
        chain: list[str] = []
        f: FrameType | None = frame
        while f is not None:
            m = _module(f)
            if m is not None and (not chain or chain[-1] != m):
                chain.append(m)
            if m is not None and (
                "<locals>" in f.f_code.co_qualname
                or f.f_code.co_name == "<lambda>"
                or f.f_code.co_flags & inspect.CO_GENERATOR
            ):
                # A callback: what called it runs its definer's code. So does a generator of
                # steps resumed by its driver (fdbqueue.ops.steps.drive): the blocking API's loops.
                break
            f = f.f_back
        seen.add(tuple(reversed(chain)))

    sys.setprofile(profile)
    try:
        step()
    finally:
        sys.setprofile(None)
    yield from sorted(seen)


def test_each_step_enters_each_module_once_and_goes_down_the_layers() -> None:
    db = fdbqueue.open("sim://?seed=2&faults=0")
    fdbqueue.create_queue(db, "walk", max_deliveries=1, journal=True)
    q = Queue("walk")
    held: list[Any] = []
    steps: list[tuple[str, Callable[[], object]]] = [
        ("enqueue", lambda: q.enqueue(db, b"x" * 25_000)),  # chunked
        ("lease", lambda: held.append(q.lease(db))),
        ("nack", lambda: q.nack(db, held[0], reason="walk")),  # its last delivery: dead letter
    ]
    problems = []
    modules: set[str] = set()
    for name, step in steps:
        for chain in _chains(step):
            modules.update(chain)
            twice = sorted({m for m in chain if chain.count(m) > 1})
            if twice:
                problems.append(f"{name}: {' -> '.join(chain)} enters {twice} twice")
            for caller, callee in itertools.pairwise(chain):
                if LAYERS.get(callee, 0) > LAYERS.get(caller, 0):
                    problems.append(f"{name}: {caller} (layer {LAYERS[caller]}) calls up into {callee}")
    assert not problems, "\n".join(sorted(set(problems)))
    # (the one writer is a package: its lease, the ack's way to the error queue, the arrival)
    walked = {"api.queue", "ops.delivery", "ops.journaling"}
    walked |= {f"ops.moves.{m}" for m in ("core", "arrivals", "leases", "places")}
    assert walked <= modules  # the walk did go through them
    assert [e.op for e in fdbqueue.history(db, held[0].id)] == ["enqueue", "lease", "dead"]
