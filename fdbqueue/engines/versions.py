"""The local engines' version clock: versions advance with ``CLOCK_MONOTONIC``, in microseconds.

FoundationDB's master advances versions at about :data:`VERSIONS_PER_SECOND` even when nothing
commits (``fdbserver/core/ServerKnobs.cpp``: ``VERSIONS_PER_SECOND``). The embedded and sim
engines keep the same rate on ``CLOCK_MONOTONIC``: shared by every process of one boot, and
never moved by a wall-clock correction.

Tests move this clock without sleeping through the layer's fake clock
(``fdbqueue.store.clock.fake_clock``), which calls :func:`freeze`, :func:`thaw`,
:func:`advance` and :func:`set_wall` here: the engines know no fake clock, only that their
clock may be frozen and moved.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable

# FoundationDB's rate (fdbserver/core/ServerKnobs.cpp, VERSIONS_PER_SECOND = 1e6): the one
# place the engines and the layer take it from.
VERSIONS_PER_SECOND = 1_000_000

# The wall clock (seconds since the epoch) the layer reads: the embedded engine's evidence that
# a process's monotonic clock agrees with the others' (wall_us). Set by the layer's set_clock.
_wall: Callable[[], float] = time.time

# While frozen: the monotonic clock stays at this reading (µs) ...
_frozen_us: int | None = None
# ... moved on by advance(). Kept when the clock thaws, so that database time never runs
# backwards in this process.
_ahead_us = 0
# A frozen clock still ticks one microsecond per reading: what happened later reads later,
# as on a real clock (a deadline set at one reading is never met by an earlier one).
_ticks = itertools.count()


def monotonic_us() -> int:
    """The engines' clock in microseconds: CLOCK_MONOTONIC, unless a test froze it."""
    frozen = _frozen_us
    if frozen is None:
        return time.monotonic_ns() // 1000 + _ahead_us
    return frozen + _ahead_us + next(_ticks)


def monotonic() -> float:
    """:func:`monotonic_us` in seconds (the engines' 5-second window and timeouts)."""
    if _frozen_us is None:  # the common case, read before most operations: one C call
        return time.monotonic() + _ahead_us / 1e6
    return monotonic_us() / 1e6


# The classes whose ``clock`` (a static alias read several times a transaction) is this
# module's clock: while it is neither frozen nor moved on - every process but a test's - the
# alias is ``time.monotonic`` itself, which gives the same reading without a Python call;
# else :func:`monotonic`. freeze(), thaw() and advance() switch it.
_clock_holders: list[type] = []


def keep_clock(cls: type) -> None:
    """Keep ``cls.clock`` this module's clock from now on (see :data:`_clock_holders`)."""
    _clock_holders.append(cls)
    _switch_clock()


def _switch_clock() -> None:
    read = time.monotonic if _frozen_us is None and _ahead_us == 0 else monotonic
    for cls in _clock_holders:
        cls.clock = staticmethod(read)  # type: ignore[attr-defined]


def wall_us() -> int:
    """The process's wall clock in microseconds (no thread's skew): what the embedded engine
    stamps beside a version so that another process can check its own monotonic clock."""
    return int(_wall() * 1e6)


def set_wall(source: Callable[[], float]) -> None:
    """Read the wall clock from ``source()`` (seconds since the epoch)."""
    global _wall
    _wall = source


def freeze() -> None:
    """Stop the clock at its present reading (if not stopped already); :func:`advance` moves it."""
    global _frozen_us
    if _frozen_us is None:
        _frozen_us = time.monotonic_ns() // 1000
        _switch_clock()


def thaw() -> None:
    """Let the clock run again from CLOCK_MONOTONIC, keeping what :func:`advance` added."""
    global _frozen_us
    _frozen_us = None
    _switch_clock()


def frozen() -> bool:
    return _frozen_us is not None


def advance(us: int) -> None:
    """Move the clock ``us`` microseconds on (frozen or not)."""
    global _ahead_us
    _ahead_us += us
    _switch_clock()
