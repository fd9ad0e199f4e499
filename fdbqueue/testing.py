"""Scripted faults and outages on the sim engine, for application tests.

``FaultScript(db)`` decides how the next commits end that FoundationDB could fail;
``outage(db)`` makes the database unreachable for a while. Both need a ``sim://`` database
(:class:`~fdbqueue.engines.sim.database.SimDatabase`); any other engine gets :class:`FaultScriptError`.

Which commits a script entry applies to, and which outcomes FoundationDB can give them
(``fault_possible`` in ``fdbqueue/engines/sim/faults.py``):

* A read-only commit (no mutation, no write conflict range) consumes nothing: FoundationDB
  returns from it at once, unchecked (``Transaction::commitMutations``,
  fdbclient/NativeAPI.actor.cpp).
* Every other commit consumes the next entry, in order, whatever the entry is. It ends:

  - ``None``: as it would anyway (commits, or a genuine 1020 / 1007).
  - ``1020`` (not_committed): only if the transaction has read conflict ranges of its own.
    A blind write's only read conflict range is its self-conflicting one
    (``Transaction::makeSelfConflicting``), on a unique key nobody writes: FoundationDB
    never reports a conflict for it. Such a commit goes through as if the entry were
    ``None``, and the entry is listed in :attr:`FaultScript.skipped`.
  - ``1007`` (transaction_too_old): only if the transaction took a read version before
    committing (a read, or ``get_read_version``); else likewise skipped.
  - ``("1021", applied)`` commit_unknown_result, ``("1039", applied)`` cluster_version_changed,
    ``("1031", applied)`` transaction_timed_out during commit, ``("1025", applied)``
    transaction_cancelled (``cancel()`` during commit): any commit. ``applied`` says whether
    the commit landed; the error is raised either way. 1021 and 1039 are retryable
    (``fdb_error_predicate``, bindings/c/fdb_c.cpp); 1031 and 1025 are not, and
    ``on_error`` re-raises them.
  - ``("1031", "later")``, ``("1025", "later")``: the commit is still in flight when the error
    is raised (RYWImpl::simulateTimeoutInFlightCommit, fdbclient/ReadYourWrites.cpp): it
    reaches the resolver at the start of the next commit with writes on the database, with
    its own read version, and lands unless it conflicts or is too old by then.

Not-committed outcomes (1020, 1007) apply nothing. Commits past the end of the script draw
the URL's seeded faults (none with ``faults=0``). ``on_backoff(db, hook)`` runs a hook in the
next retry backoff, where other clients act between a failed commit and its retry.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from types import TracebackType

from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.engines.sim.faults import (
    LANDS_LATER_FAULTS,
    MAYBE_COMMITTED_FAULTS,
    NOT_COMMITTED_FAULTS,
    CommitInfo,
    Fault,
    fault_possible,
)
from fdbqueue.engines.sim.traffic import TrafficCounter
from fdbqueue.errors import FaultScriptError

__all__ = ["FaultScript", "FaultScriptError", "Outcome", "on_backoff", "outage", "recovery", "traffic"]

# None, 1020, 1007, or (code, applied) with code one of "1021", "1039", "1031", "1025";
# applied may be "later" for 1031 and 1025.
Outcome = int | tuple[str | int, bool | str] | None


def _sim(db: object, what: str) -> SimDatabase:
    if not isinstance(db, SimDatabase) or db.engine != "sim":
        kind = getattr(db, "url", None) or type(db).__name__
        raise FaultScriptError(f"{what} needs a sim:// database (fdbqueue.open('sim://?seed=1')), not {kind}")
    return db


def _fault(outcome: Outcome) -> Fault | None:
    if outcome is None:
        return None
    if type(outcome) is int and outcome in NOT_COMMITTED_FAULTS:
        return Fault(outcome)
    if isinstance(outcome, tuple) and len(outcome) == 2:
        code, applied = outcome
        if isinstance(code, (str, int)) and not isinstance(code, bool):
            try:
                number = int(code)
            except ValueError:
                number = 0
            if number in MAYBE_COMMITTED_FAULTS and isinstance(applied, bool):
                return Fault(number, applied)
            if number in LANDS_LATER_FAULTS and applied == "later":
                return Fault(number, later=True)
    raise FaultScriptError(
        f"bad outcome {outcome!r}: use None, 1020, 1007, or (code, applied) with code "
        f"'1021', '1039', '1031' or '1025' and applied True or False ('later' for 1031, 1025)"
    )


class FaultScript:
    """How the next commits of a sim:// database end (see the module docstring for which).

    Creating one attaches it to ``db`` (replacing an earlier script); :meth:`detach`, or
    leaving its ``with`` block, gives the seeded faults back. The script is shared by every
    thread using ``db``.
    """

    def __init__(self, db: object) -> None:
        self.db = _sim(db, "FaultScript")
        self._script: deque[tuple[Outcome, Fault | None]] = deque()
        self.fired: list[Outcome] = []  # entries that ended a commit as scripted (None too)
        self.skipped: list[Outcome] = []  # entries FoundationDB could not give their commit
        self.db.fault_source = self._next

    def arm(self, outcomes: Iterable[Outcome]) -> None:
        """The next commits with writes end as ``outcomes`` say, in order (replaces any rest)."""
        script = [(o, _fault(o)) for o in outcomes]  # all checked before any is armed
        with self.db._lock:
            self._script.clear()
            self._script.extend(script)

    @property
    def pending(self) -> list[Outcome]:
        """The entries not consumed yet."""
        with self.db._lock:
            return [o for o, _ in self._script]

    def __enter__(self) -> FaultScript:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.detach()

    def detach(self) -> None:
        """Stop scripting: the URL's seeded faults decide again."""
        with self.db._lock:
            self._script.clear()
            if self.db.fault_source == self._next:
                self.db.fault_source = None

    def _next(self, commit: CommitInfo) -> Fault | None:
        # Called by the sim with its store lock held, once per commit with writes.
        if not self._script:
            return self.db.seeded_fault(commit)
        outcome, fault = self._script.popleft()
        if fault is not None and not fault_possible(fault.code, commit):
            self.skipped.append(outcome)
            return None
        self.fired.append(outcome)
        return fault


def on_backoff(db: object, hook: Callable[[], object], times: int = 1) -> None:
    """Run ``hook()`` inside the next ``times`` retry backoffs of any transaction on ``db``.

    A backoff is ``on_error``'s wait between a failed commit and its retry: the moment when
    other clients of a cluster go on working (run another transaction there, for instance).
    """
    sim = _sim(db, "on_backoff")
    if not callable(hook) or isinstance(times, bool) or not isinstance(times, int) or times < 0:
        raise FaultScriptError("on_backoff needs a callable and a count >= 0")
    sim._backoff_hooks.extend([hook] * times)


@contextmanager
def outage(db: object) -> Iterator[None]:
    """While active, every call on ``db`` raises :class:`~fdbqueue.ClusterUnavailableError`.

    New transactions and the reads, writes, ``get_read_version`` and commits of open ones
    fail (a commit then applies nothing); ``cancel``, ``reset`` and ``on_error`` still work,
    so callers can clean up. Afterwards everything works again and nothing committed is lost
    (a transaction left open across it may meet its 5-second window: 1007). Nests.
    """
    sim = _sim(db, "outage")
    with sim._lock:
        sim._outages += 1
    try:
        yield
    finally:
        with sim._lock:
            sim._outages -= 1


def recovery(db: object, jump: float = 100.0) -> None:
    """The versions of ``db`` (sim://) jump ``jump`` seconds' worth ahead, as at a FoundationDB
    recovery; no time passes.

    A recovery's first version is ``MAX_VERSIONS_IN_FLIGHT`` (100e6: 100 seconds at
    ``VERSIONS_PER_SECOND``, ``fdbserver/core/ServerKnobs.cpp``) past the last committed one,
    the default jump; a forced recovery's is ``MAX_VERSIONS_IN_FLIGHT_FORCED`` (a week) past
    it. Transactions that read before it can no longer commit (1007), as on a cluster. What
    measures time in the layer (leases, delays, TTLs, dedup windows, journal retention) does
    not count the jump: ``fdbqueue.store.clock``.
    """
    sim = _sim(db, "recovery")
    if isinstance(jump, bool) or not isinstance(jump, (int, float)) or not math.isfinite(jump) or jump < 0:
        raise FaultScriptError(f"recovery's jump must be a finite number of seconds >= 0, not {jump!r}")
    try:
        sim.recover(float(jump))  # the cluster model's own recovery too (engines/sim/cluster.py)
    except ValueError as e:  # past FoundationDB's version range (an int64)
        raise FaultScriptError(f"recovery's jump of {jump!r} s is too large: {e}") from None


@contextmanager
def traffic(db: object) -> Iterator[TrafficCounter]:
    """Count a sim:// database's traffic while the block runs, from any thread.

    The :class:`~fdbqueue.engines.sim.traffic.TrafficCounter` it yields holds, counted from
    the block's start (and readable after it ends):

    * ``writes``: committed mutations per key (``Mapping[bytes, int]``): a set, clear or
      atomic op counts on its key, a range clear once on its begin key, a versionstamped
      key under its final key; a key a transaction changes several times counts once for
      that commit (what one version brings its storage team);
    * ``commits``: committed transactions with at least one mutation;
    * ``transactions``: every attempt that read or wrote anything, however it ended
      (committed, read-only, failed, reset or dropped; a retry after ``on_error`` is
      another attempt);
    * ``conflicts``: commits that failed with not_committed (1020), genuine or injected;
    * ``hottest(n)``: the ``n`` most written keys with their counts, most written first.

    On a cluster one key is served by one storage team: a key written by a large share of
    all commits is a hot spot (FoundationDB's developer guide, "Avoid hot keys"). Other
    engines raise :class:`FaultScriptError`.
    """
    sim = _sim(db, "traffic")
    counter = TrafficCounter()
    sim.attach_counter(counter)
    try:
        yield counter
    finally:
        sim.detach_counter(counter)
