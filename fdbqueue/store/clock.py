"""Time in fdbqueue: database time (versions) for correctness, the wall clock for people.

**Database time.** Whatever decides an outcome - a lease's expiry, a delayed message's due
time, a TTL, a dedup window, the age of a receipt or a staged request, journal retention - is
measured in the database's versions (:func:`db_now`): the transaction's read version, which
FoundationDB's master advances at about :data:`VERSIONS_PER_SECOND` even when nothing commits
(``fdbserver/core/ServerKnobs.cpp``: ``VERSIONS_PER_SECOND``), and which every client of one
database shares, less the versions that were not time. No client's wall clock takes part, so
a client whose clock is minutes off, or is corrected, can neither lose nor duplicate a
message. A duration users give in seconds (delay, TTL, lease length, dedup window) is
converted with :func:`versions`.

**Versions that are not time.** At every recovery the versions jump ``MAX_VERSIONS_IN_FLIGHT``
(100e6: 100 s) ahead, a forced recovery's about a week, while no time passes
(``fdbqueue.testing.recovery`` does it on the sim). Counted as time, such a jump would end
every lease at once (its message delivered twice), end TTLs and dedup windows early, bring
delayed messages due and trim the journal early. So each process keeps, per database, the
last read version it saw beside its own monotonic clock; a read version further ahead than
that clock allows (by more than :data:`JUMP_SECONDS`, plus :data:`DRIFT` of the time
measured) is a jump, and the excess is recorded in the database's time correction
(``layout.TIME_KEY``: from a read version on, how many versions were not time) in the
transaction that saw it, under a read conflict, so two clients that see one jump add it once.
Every transaction reads the correction with the metadata it reads anyway
(``meta.read_meta``, ``privileges.check``; one key more in the same ``get_many``, no round
trip more) and leaves it out of database time: every client counts the same time. Only the
engines whose versions can jump (the optimistic ones: FoundationDB, the sim) read it; the
embedded engine's versions are its clock. What is not handled: a jump while no process of the
database had a baseline (all restarted across the recovery: their first read versions are
their baselines) is counted as time; the versions' rate may run up to 10 % off the clocks'
(the master's ``MAX_VERSION_RATE_MODIFIER``), which leases and delays inherit; an idle
cluster's read version moves with its commit batches, at least every
``MAX_COMMIT_BATCH_INTERVAL`` (2 s), and is counted when it moves, below the jump threshold.

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

import contextlib
import struct
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from fdbqueue.engines import versions as _versions
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.store.layout import TIME_KEY

if TYPE_CHECKING:
    from fdbqueue.engines.contract import Transaction

_source: Callable[[], float] = time.time

# A read version further ahead of the last one a process saw than its monotonic clock allows
# by more than this is a jump (a recovery adds MAX_VERSIONS_IN_FLIGHT, 100 s of versions,
# fdbserver/core/ServerKnobs.cpp). Smaller steps are time: an idle cluster's read version
# moves with its commit batches (at least every MAX_COMMIT_BATCH_INTERVAL, 2 s), and is
# then counted when it moves.
JUMP_SECONDS = 10.0
# How far the versions' rate may run ahead of the wall clock's before a step is a jump: the
# master's rate follows its own clock and may drift by up to 10 % (the master's
# MAX_VERSION_RATE_MODIFIER, fdbserver/core/ServerKnobs.cpp, 0.1).
DRIFT = 0.1
_JUMP = JUMP_SECONDS * VERSIONS_PER_SECOND
_TIME = struct.Struct(">qq")  # the correction's value: (anchor, offset)


class _Seen:
    """The last read version a process saw of one database, its monotonic clock then, the
    anchor of the newest correction it had read, and the baseline it had under the correction
    before that one (``before``: for snapshots taken before the newest correction committed)."""

    __slots__ = ("anchor", "before", "mono", "rv")

    def __init__(self, rv: int, mono: float, anchor: int = 0, before: _Seen | None = None) -> None:
        self.rv = rv
        self.mono = mono
        self.anchor = anchor
        self.before = before


_baselines: weakref.WeakKeyDictionary[object, _Seen] = weakref.WeakKeyDictionary()


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
    """Now in database time: the transaction's read version less the versions that were not
    time (:func:`note_time`; 0 on the embedded engine, whose versions never jump).

    The read version is free once the transaction has read (FoundationDB keeps the
    transaction's read version future, ``readVersionFuture`` in
    ``fdbclient/NativeAPI.actor.cpp``, and returns it again); the correction comes with the
    queue metadata an operation reads first (``meta.read_meta``), else with one read here.
    Every later transaction reads a database time >= it (but for a jump that a client without
    a baseline saw before it was recorded: the correction takes it back).
    """
    rv = int(tr.get_read_version())
    # engine_traits' first, read as it reads it: the embedded engine, whose versions are its clock
    if not getattr(tr.db, "may_conflict", True):
        return rv
    offset = tr.journal_order().time
    if offset is None:
        offset = note_time(tr, tr.snapshot.get(TIME_KEY))
    return rv - offset


def note_time(tr: Transaction, raw: bytes | None) -> int:
    """Take ``raw``, the value of the database's time correction read in ``tr``, as ``tr``'s:
    returns the versions to leave out of database time.

    The correction is ``(anchor, offset)``: from read version ``anchor`` on, ``offset``
    versions were not time. Each process keeps, per database, the last read version it saw
    beside its own monotonic clock; a read version further ahead than the clock allows (by
    more than :data:`JUMP_SECONDS` plus :data:`DRIFT`) with no correction recorded since is a
    jump: the excess is added to the offset, written in ``tr`` under a read conflict (so that
    two clients that see the same jump add it once: the second conflicts, retries, and finds
    the first's correction), and not counted as time by ``tr`` nor by any later transaction
    of any client.
    """
    anchor, offset = (int(v) for v in _TIME.unpack(raw)) if raw and len(raw) == _TIME.size else (0, 0)
    rv = int(tr.get_read_version())
    db = tr.db
    home = getattr(db, "fdb_database", db)  # a raw fdb.Database outlives its wrappers
    clock = getattr(db, "clock", None)
    mono = clock() if callable(clock) else _versions.monotonic()
    seen = _baselines.get(home)
    # The baseline that goes with this snapshot's correction: a transaction whose read version
    # came after a jump but before the jump's correction committed reads no correction, and
    # must be measured against the baseline from before the jump, not the one the correction
    # moved past it (else it counts the jump as time: every TTL and lease ends at once).
    base = seen
    while base is not None and base.anchor > anchor and base.before is not None:
        base = base.before
    if seen is None or base is None:
        with contextlib.suppress(TypeError):  # not weakly referable: the recorded correction only
            _baselines[home] = _Seen(rv, mono, anchor)
    elif anchor > base.rv or rv - base.rv <= (mono - base.mono) * VERSIONS_PER_SECOND * (1 + DRIFT) + _JUMP:
        if anchor > seen.anchor:  # a newer correction: a new baseline, the old one kept
            old = _Seen(seen.rv, seen.mono, seen.anchor)
            _baselines[home] = (
                _Seen(rv, mono, anchor, old) if rv > seen.rv else _Seen(seen.rv, seen.mono, anchor, old)
            )
        elif base is seen and rv > seen.rv:  # no jump, or one already corrected: time went on
            seen.rv, seen.mono = rv, mono
    else:
        # A jump nobody has corrected since our baseline: the versions beyond what our clock
        # measured were not time. The baseline stays until the correction is read back (if
        # this transaction does not commit, the next one finds the jump again; if another
        # recorded it meanwhile, this one's write conflicts on the correction and its retry
        # reads that one).
        offset += rv - base.rv - round((mono - base.mono) * VERSIONS_PER_SECOND)
        tr.add_read_conflict_key(TIME_KEY)
        tr.set(TIME_KEY, _TIME.pack(rv, offset))
    tr.journal_order().time = offset
    return offset


def versions(seconds: float) -> int:
    """A duration in seconds as a number of versions."""
    return round(seconds * VERSIONS_PER_SECOND)


def seconds_of(n_versions: int) -> float:
    """A number of versions as seconds."""
    return n_versions / VERSIONS_PER_SECOND
