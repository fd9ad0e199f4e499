"""The older test helpers, now thin wrappers over the public :mod:`fdbqueue.testing`.

``ScriptedFaults(db)`` is a :class:`~fdbqueue.testing.FaultScript` that, as before, lets no
seeded fault through past its script, and counts the commits that consulted it (``drawn``).
``on_backoff`` returns a list that gets one entry each time the hook ran.
"""

from __future__ import annotations

from collections.abc import Callable

from fdbqueue import testing
from fdbqueue.testing import FaultScript

__all__ = ["ScriptedFaults", "on_backoff"]


class ScriptedFaults(FaultScript):
    """A FaultScript on a database whose seeded faults are off: only the script fails commits."""

    def __init__(self, db: object) -> None:
        super().__init__(db)
        self.db.faults = 0.0

    @property
    def drawn(self) -> int:
        """Commits with writes that consumed a script entry."""
        return len(self.fired) + len(self.skipped)


def on_backoff(db: object, hook: Callable[[], object], times: int = 1) -> list[int]:
    """Run ``hook()`` in the next ``times`` retry backoffs on ``db``; the list counts the runs."""
    calls: list[int] = []

    def run() -> None:
        calls.append(1)
        hook()

    testing.on_backoff(db, run, times)
    return calls
