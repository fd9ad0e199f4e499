"""The dashboard's sampler: every queue's figures read every ``interval`` seconds in the
background, kept for the last ``window`` seconds, so that the pages show rates and a chart of
the last minutes and a page's request costs no read of a thousand queues.

Rates are differences of the durable totals between two samples (made ready, consumed), so
they count every process's work, not this one's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fdbqueue.api.admin import all_queue_stats
from fdbqueue.engines.contract import Database
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.types import QueueStats

log = logging.getLogger("fdbqueue.web")

RATE_SPAN = 10.0  # seconds a rate is measured over (a mean, not a jitter between two samples)

# One point of a series: time, ready, in flight, delayed, dead letters waiting, made ready
# (total), consumed (total).
Point = tuple[float, int, int, int, int, int, int]


@dataclass
class Sample:
    """The latest reading: every queue's figures and their rates over the last RATE_SPAN s."""

    at: float = 0.0
    took: float = 0.0
    stats: list[QueueStats] = field(default_factory=list)
    rates: dict[str, tuple[float, float]] = field(default_factory=dict)
    error: str | None = None


class Sampler:
    """Reads ``all_queue_stats`` every ``interval`` seconds in a daemon thread (start/close),
    keeping a series per queue and one of the totals for the last ``window`` seconds."""

    def __init__(
        self,
        db: Database,
        *,
        interval: float = 2.0,
        window: float = 300.0,
        root: tuple[Any, ...] = DEFAULT_ROOT,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not interval > 0 or not window >= interval:
            raise ValueError(f"need interval > 0 and window >= interval, got {interval}, {window}")
        self.db, self.root, self.interval, self.clock = db, tuple(root), interval, clock
        self.points = max(2, int(window / interval) + 1)
        self.rate_back = max(1, min(self.points - 1, round(RATE_SPAN / interval)))
        self.latest = Sample()
        self.series: dict[str, deque[Point]] = {}
        self.totals: deque[Point] = deque(maxlen=self.points)
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.sample()
        self._thread = threading.Thread(target=self._run, name="fdbqueue-web-sampler", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout=10)

    def wake(self) -> None:
        """Sample now (after an action, so the pages show its effect at once)."""
        self._wake.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.interval)
            self._wake.clear()
            if not self._stop.is_set():
                self.sample()

    def sample(self) -> Sample:
        """Read every queue's figures now; on a failure keep the last reading, with the error."""
        started = time.perf_counter()
        at = self.clock()
        try:
            stats = all_queue_stats(self.db, root=self.root)
        except Exception as exc:  # shown on the page; the next sample tries again
            log.warning("dashboard sample failed: %s", exc)
            with self._lock:
                self.latest.error = f"{type(exc).__name__}: {exc}"
            return self.latest
        took = time.perf_counter() - started
        with self._lock:
            rates: dict[str, tuple[float, float]] = {}
            tot = [0, 0, 0, 0, 0, 0]  # ready, in flight, delayed, errors, made ready, done
            for st in stats:
                s = self.series.get(st.name)
                if s is None:
                    s = self.series[st.name] = deque(maxlen=self.points)
                point = (at, st.ready, st.inflight, st.delayed, st.errors, st.made_ready, st.done)
                if s:
                    rates[st.name] = _rates(s[max(0, len(s) - self.rate_back)], point)
                s.append(point)
                for i, v in enumerate((st.ready, st.inflight, st.delayed, st.errors, st.made_ready, st.done)):
                    tot[i] += v
            for gone in set(self.series) - {st.name for st in stats}:
                del self.series[gone]
            self.totals.append((at, tot[0], tot[1], tot[2], tot[3], tot[4], tot[5]))
            self.latest = Sample(at=at, took=took, stats=stats, rates=rates)
            return self.latest

    def history(self, name: str | None) -> list[Point]:
        """The series of queue ``name`` (None: the totals), oldest first."""
        with self._lock:
            return list(self.totals if name is None else self.series.get(name, ()))


def _rates(before: Point, now: Point) -> tuple[float, float]:
    dt = now[0] - before[0]
    if dt <= 0:
        return 0.0, 0.0
    return max(0.0, (now[5] - before[5]) / dt), max(0.0, (now[6] - before[6]) / dt)


def rated(points: list[Point]) -> list[dict[str, float]]:
    """A series as the chart draws it: depths, and rates between neighbouring points."""
    out = []
    for i, p in enumerate(points):
        r = _rates(points[i - 1], p) if i else (0.0, 0.0)
        out.append(
            {
                "at": p[0],
                "ready": p[1],
                "inflight": p[2],
                "delayed": p[3],
                "errors": p[4],
                "in_rate": r[0],
                "done_rate": r[1],
            }
        )
    return out[1:] if len(out) > 1 else out
