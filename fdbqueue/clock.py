"""The wall clock the layer stamps messages with (enqueue time, due times, deadlines, TTLs).

Stored timestamps are wall-clock microseconds, so that processes - and machines - agree on
them. Tests drive time through :func:`set_clock` instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

_source: Callable[[], float] = time.time


def now_us() -> int:
    """Now, in microseconds since the epoch."""
    return int(_source() * 1e6)


def set_clock(source: Callable[[], float] | None) -> None:
    """Use ``source()`` (seconds since the epoch) as the layer's clock; None restores time.time."""
    global _source
    _source = source or time.time


class FakeClock:
    """A clock that moves only when told to: ``clock.advance(seconds)``."""

    def __init__(self, start: float | None = None) -> None:
        self.now = time.time() if start is None else start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@contextmanager
def fake_clock(start: float | None = None) -> Iterator[FakeClock]:
    """Within the block, the layer's clock is a :class:`FakeClock`."""
    clock = FakeClock(start)
    set_clock(clock)
    try:
        yield clock
    finally:
        set_clock(None)
