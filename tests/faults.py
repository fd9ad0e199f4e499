"""Test helpers: scripted fault injection on the sim engine, and a hook into retry backoffs.

The sim engine draws its injected faults from ``db._rng`` (one ``random()`` per commit with
writes, and a second one for a 1021 to decide whether the commit was applied; read-only
commits draw nothing). :class:`ScriptedFaults` stands in for that generator so that a test
can say exactly which of the next commits fail and how, and reproduce a rare interleaving
deterministically instead of hoping that a seed finds it.

``on_backoff`` runs a callback inside ``on_error``'s backoff sleep: the moment between
a failed commit and its retry, when other clients of a real cluster go on working.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

from fdbqueue.engines.sim import SimDatabase

# One scripted outcome per commit with writes: None (commits), 1020, 1007,
# ("1021", True) (applied, reported unknown) or ("1021", False) (not applied).
Outcome = Any

_FAULTS = 0.5  # any probability > 0: only the scripted draws decide


class ScriptedFaults:
    """Replaces a SimDatabase's fault generator; commits beyond the script succeed."""

    def __init__(self, db: SimDatabase) -> None:
        if not isinstance(db, SimDatabase):
            raise TypeError("ScriptedFaults needs the sim engine")
        self.db = db
        self.script: deque[Outcome] = deque()
        self._applied: float | None = None
        self.drawn = 0  # commits with writes that consulted the script
        db.delay = 0.0
        db.faults = _FAULTS
        db._rng = self  # type: ignore[assignment]

    def arm(self, outcomes: Iterable[Outcome]) -> None:
        """The next commits with writes end as ``outcomes`` say, in order (replaces any rest)."""
        self.script.clear()
        self.script.extend(outcomes)

    def random(self) -> float:
        if self._applied is not None:
            r, self._applied = self._applied, None
            return r
        self.drawn += 1
        if not self.script:
            return 0.999  # no fault
        outcome = self.script.popleft()
        if outcome is None:
            return 0.999
        if outcome == 1020:
            return _FAULTS * 0.1  # int(3 * r / faults) == 0
        if outcome == 1007:
            return _FAULTS * 0.9  # == 2
        kind, applied = outcome
        assert kind == "1021", outcome
        self._applied = 0.0 if applied else 0.99  # applied = random() < 0.5
        return _FAULTS * 0.5  # == 1


def on_backoff(db: SimDatabase, hook: Callable[[], None], times: int = 1) -> list[int]:
    """Run ``hook()`` in the next ``times`` retry backoffs of any transaction on ``db``."""
    calls: list[int] = []
    real_sleep = db.sleep

    def sleep(seconds: float) -> None:
        if len(calls) < times:
            calls.append(1)
            hook()
        real_sleep(seconds)

    db.sleep = sleep  # type: ignore[method-assign]
    return calls
