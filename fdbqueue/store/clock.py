"""Time in fdbqueue: database time (versions) for correctness, the wall clock for people.

**Database time.** Whatever decides an outcome - a lease's expiry, a delayed message's due
time, a TTL, a dedup window, the age of a receipt or a staged request - is measured in the
database's versions: ``tr.get_read_version()`` (:func:`db_now`), which FoundationDB's
master advances at about :data:`VERSIONS_PER_SECOND` even when nothing commits
(``fdbserver/core/ServerKnobs.cpp``: ``VERSIONS_PER_SECOND``), and which every client of one
database shares. No client's wall clock takes part, so a client whose clock is minutes off,
or is corrected, can neither lose nor duplicate a message. A duration users give in seconds
(delay, TTL, lease length, dedup window) is converted with :func:`versions`.

**The engines' clock.** The embedded and simulation engines advance their versions with
``CLOCK_MONOTONIC`` (``fdbqueue.engines.versions``: shared by every process of one boot, and
never moved by a wall-clock correction).

**The wall clock** (:func:`now_us`) only stamps what people read: ``Message.enqueued_at``,
ages in stats, the wall-clock estimate of a lease's end, and the time part of new message
ids (index locality only).

**Tests** move time without sleeping: :func:`fake_clock` (or :func:`set_clock` with a
:class:`FakeClock`) freezes both clocks, and ``clock.advance(s)`` moves both by ``s``
seconds; :func:`thread_skew` offsets the wall clock of one thread only (a client whose
clock is wrong), leaving database time alone.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fdbqueue.engines import versions as _versions
from fdbqueue.engines.versions import VERSIONS_PER_SECOND

if TYPE_CHECKING:
    from fdbqueue.engines.contract import Transaction

_source: Callable[[], float] = time.time


class _Skew(threading.local):
    us = 0  # this thread's wall-clock offset (thread_skew)


_skews = _Skew()


# -- the wall clock (what users read) ------------------------------------------------------------


def now_us() -> int:
    """Now on the wall clock, in microseconds since the epoch: for what people read only."""
    return int(_source() * 1e6) + _skews.us


def set_clock(source: Callable[[], float] | None) -> None:
    """Use ``source()`` (seconds since the epoch) as the layer's wall clock; None restores it.

    A :class:`FakeClock` also drives database time on the embedded and sim engines (frozen,
    moved by its ``advance``), so that a test moves both with one call.
    """
    global _source
    _source = source or time.time
    _versions.set_wall(_source)
    if isinstance(source, FakeClock):
        _versions.freeze()
    else:
        _versions.thaw()


@contextmanager
def thread_skew(seconds: float) -> Iterator[None]:
    """Within the block, this thread's wall clock is ``seconds`` off (a testing hook).

    Models a client whose clock is wrong; database time is not affected.
    """
    before = _skews.us
    _skews.us = int(seconds * 1e6)
    try:
        yield
    finally:
        _skews.us = before


class FakeClock:
    """A clock that moves only when told to: ``clock.advance(seconds)``.

    ``now`` is the wall clock it shows (assign it to model a wall-clock jump or correction,
    which database time ignores); ``advance`` moves the wall clock and, while installed
    (:func:`set_clock`, :func:`fake_clock`), database time on the local engines.
    """

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
        if _source is self:
            _versions.advance(round(seconds * 1e6))


@contextmanager
def fake_clock(start: float | None = None) -> Iterator[FakeClock]:
    """Within the block, the layer's clock is a :class:`FakeClock` (see :func:`set_clock`)."""
    clock = FakeClock(start)
    set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(None)


# -- database time (what decides outcomes) -------------------------------------------------------


def db_now(tr: Transaction) -> int:
    """Now in database time: the transaction's read version.

    Free once the transaction has read (FoundationDB keeps the transaction's read version
    future, ``readVersionFuture`` in ``fdbclient/NativeAPI.actor.cpp``, and returns it again).
    Every later commit has a higher version; a later transaction reads a version >= it.
    """
    return int(tr.get_read_version())


def versions(seconds: float) -> int:
    """A duration in seconds as a number of versions."""
    return round(seconds * VERSIONS_PER_SECOND)


def seconds_of(n_versions: int) -> float:
    """A number of versions as seconds."""
    return n_versions / VERSIONS_PER_SECOND
