"""The sim engine's multi-version store and commit resolution (the model is in database.py).

:class:`SimStore` is the database side of :class:`~fdbqueue.engines.sim.database.SimDatabase`: per-key
version chains, the read versions of open transactions, a log of recent commits' write
ranges, the commit-time read-conflict check and apply, garbage collection and watches.
Its ``_locked`` methods expect the store lock held.
"""

from __future__ import annotations

import itertools
import threading
import time
from bisect import bisect_right
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from sortedcontainers import SortedList

from fdbqueue.engines.limits import TRANSACTION_WINDOW_SECONDS
from fdbqueue.engines.local.mutations import apply_atomic, fill_versionstamp, make_versionstamp
from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.engines.local.writemap import WriteMap
from fdbqueue.engines.sim.traffic import TrafficCounter
from fdbqueue.engines.versions import VERSIONS_PER_SECOND, monotonic, monotonic_us
from fdbqueue.errors import EngineError

MAX_VERSION = 2**63 - 1  # FoundationDB's Version: int64_t

# Registrations of read versions older than the window plus this margin are dropped, so a
# forgotten transaction cannot pin old versions forever; its next read or commit gets 1007.
WINDOW_MARGIN_SECONDS = 1.0
MAX_WATCHES = 10_000  # FoundationDB's default per-database limit (1032 beyond it)
# A recovery's new master starts this many versions past the last committed one
# (fdbserver/core/ServerKnobs.cpp: MAX_VERSIONS_IN_FLIGHT = 100 * VERSIONS_PER_SECOND).
MAX_VERSIONS_IN_FLIGHT = 100 * VERSIONS_PER_SECOND

Chain = list[tuple[int, bytes | None]]
Range = tuple[bytes, bytes]

# Kinds of a buffered write to one key (FoundationDB's WriteMap distinguishes the same cases).
_UNDER = 0  # atomic ops over the database's value: "dependent", reading it still conflicts
_VALUE = 1  # a set or clear (atomic ops on top folded in): "independent" of the database
_STAMP = 2  # set_versionstamped_value: unreadable until commit (1036)


class ManualClock:
    """A clock tests drive by hand: ``SimDatabase(clock=c)`` reads ``now()`` and sleeps by advancing."""

    def __init__(self, start: float = 0.0) -> None:
        self._now = float(start)
        self._lock = threading.Lock()

    def now(self) -> float:
        return self._now

    def advance(self, seconds: float) -> None:
        with self._lock:
            self._now += seconds

    def sleep(self, seconds: float) -> None:
        self.advance(seconds)


@dataclass
class SimStats:
    """Counters for tests and benchmarks (read under the database's lock for a consistent view)."""

    commits: int = 0  # commits that wrote (including 1021s that were applied)
    read_only: int = 0  # commits with nothing to write: local, no check
    conflicts: int = 0  # genuine 1020s
    too_old: int = 0  # genuine 1007s at commit
    faults: dict[int, int] = field(default_factory=dict)  # injected errors by code


def _value_at(chain: Chain, version: int) -> bytes | None:
    for v, value in reversed(chain):
        if v <= version:
            return value
    return None


class _Write:
    __slots__ = ("kind", "ops", "value")

    def __init__(self, kind: int, value: bytes | None, ops: list[tuple[str, bytes]] | None = None) -> None:
        self.kind = kind
        self.value = value
        self.ops = ops


class CommitRequest(Protocol):
    """What a commit hands the store: one attempt's read version, conflict ranges and writes
    (a :class:`~fdbqueue.engines.sim.database.SimTransaction`, or the copy of one in flight)."""

    _rv: int | None  # the read version, None when the attempt never read
    _token: int | None  # its registration in SimStore._live
    _rconf: list[Range]  # read conflict ranges
    _wconf: list[Range]  # write conflict ranges
    _wm: WriteMap[_Write]  # buffered writes and cleared ranges
    _clears: list[tuple[int, bytes, bytes]]  # (sequence, begin, end) of each clear_range, in call order
    _vs_keys: list[tuple[int, bytes, bytes]]  # (sequence, key template, value) of versionstamped keys


class SimStore:
    """The store behind one lock: per-key version chains, a log of recent commits' write ranges, watches."""

    def __init__(self, clock: ManualClock | None) -> None:
        self.max_watches = MAX_WATCHES
        self.stats = SimStats()
        self._manual = clock
        self._lock = threading.Lock()
        self._keys = SortedList()  # every key with a version chain (tombstones until compacted)
        self._chains: dict[bytes, Chain] = {}
        self._jumped = 0  # versions added by recoveries (recover)
        self._version = self._now_version()
        # Read versions of open transactions: token -> (version, clock when taken), changed
        # only under the lock. An ending transaction queues its token in _released instead
        # (a deque append needs no lock): its finaliser may run in the cyclic garbage
        # collector, inside any thread's locked section, even in the middle of a walk over
        # _live (list(_live.items()) allocates, and an allocation may start a collection).
        self._live: dict[int, tuple[int, float]] = {}
        self._released: deque[int] = deque()
        self._tokens = itertools.count()
        self._pending: deque[tuple[int, bytes]] = deque()  # (version, key) with an older version to drop
        self._log: deque[tuple[int, list[bytes], list[bytes]]] = deque()  # commits' merged write ranges
        self._pruned_through = 0  # newest commit dropped from the log
        self._watches: dict[bytes, list[EventWatch]] = {}
        self._watch_count = 0
        # Attached TrafficCounters (fdbqueue.testing.traffic): told of every attempt, commit
        # and conflict while attached; an empty tuple costs the commit path one test.
        self.counters: tuple[TrafficCounter, ...] = ()

    def attach_counter(self, counter: TrafficCounter) -> None:
        with self._lock:
            self.counters = (*self.counters, counter)

    def detach_counter(self, counter: TrafficCounter) -> None:
        with self._lock:
            self.counters = tuple(c for c in self.counters if c is not counter)

    def clock(self) -> float:
        return self._manual.now() if self._manual is not None else monotonic()

    def _now_version(self) -> int:
        """The clock in versions (integer microseconds when it is the monotonic clock)."""
        if self._manual is not None:
            return int(self._manual.now() * VERSIONS_PER_SECOND) + self._jumped
        return monotonic_us() + self._jumped

    def _jump_locked(self, versions: int) -> None:
        """Versions jump ``versions`` ahead from now on (a recovery, here or in the cluster
        model); refused past FoundationDB's Version, an int64_t
        (fdbclient/include/fdbclient/FDBTypes.h): past it no commit could make its versionstamp."""
        if self._now_version() + versions > MAX_VERSION:
            raise ValueError(
                f"a jump of {versions / VERSIONS_PER_SECOND:g} s takes the versions past {MAX_VERSION}"
            )
        self._jumped += versions

    def recover(self, jump: float | None = None, downtime: float | None = None) -> None:
        """Versions jump ``jump`` seconds' worth ahead (default 100 s), as at a recovery, while
        no time passes (``downtime``: the cluster model's; here the store is back at once).

        The recovery's first version is ``MAX_VERSIONS_IN_FLIGHT`` past the last committed one
        (``fdbserver/ClusterRecovery.actor.cpp``: ``recoveryTransactionVersion = lastEpochEnd +
        SERVER_KNOBS->MAX_VERSIONS_IN_FLIGHT``; ``MAX_VERSIONS_IN_FLIGHT_FORCED``, a week, at a
        forced recovery), so every read version taken before the recovery is too old from then
        on: its transaction's next read or commit gets 1007.
        """
        with self._lock:
            self._jump_locked(MAX_VERSIONS_IN_FLIGHT if jump is None else round(jump * VERSIONS_PER_SECOND))
            self._drop_released_locked()
            self._version = max(self._version, self._now_version() - 1)
            self._live.clear()
            self._pruned_through = self._version

    def sleep(self, seconds: float) -> None:
        if self._manual is not None:
            self._manual.sleep(seconds)
        else:
            time.sleep(seconds)

    def sizes(self) -> dict[str, int]:
        """Internal sizes, to check that compaction keeps a long-running store small."""
        with self._lock:
            self._drop_released_locked()
            return {
                "keys": len(self._keys),
                "versions": sum(len(c) for c in self._chains.values()),
                "log": len(self._log),
                "pending": len(self._pending),
                "live": len(self._live),
                "watches": self._watch_count,
            }

    # -- commit resolution -----------------------------------------------------------------------

    def _check_and_apply_locked(self, tr: CommitRequest, fired: list[EventWatch]) -> int:
        rv = tr._rv
        if tr._rconf and rv is not None:
            if tr._token not in self._live or rv < self._pruned_through:
                self.stats.too_old += 1
                raise EngineError(1007, "read version is older than the 5-second window")
            for version, wb, we in reversed(self._log):
                if version <= rv:
                    break
                for rb, re in tr._rconf:
                    j = bisect_right(we, rb)
                    if j < len(wb) and wb[j] < re:
                        self.stats.conflicts += 1
                        raise EngineError(
                            1020, "a transaction committed since this one's read version wrote what it read"
                        )
        version, order = self._commit_version_locked()
        self._version = version
        stamp = make_versionstamp(version, order)
        chains = self._chains

        # The final value of every key this commit changes, computed over the latest state
        # (atomic ops and clears act on what is there at commit, not on the snapshot).
        final: dict[bytes, bytes | None] = {}
        wm = tr._wm
        for b, e in wm.cleared_ranges:
            for k in self._keys.irange(b, e, (True, False)):
                if chains[k][-1][1] is not None:
                    final[k] = None
        for k, w in wm.values.items():
            if w.kind == _VALUE:
                final[k] = w.value
                continue
            if w.kind == _STAMP:
                assert w.value is not None
                value: bytes | None = fill_versionstamp(w.value, stamp)
            else:
                chain = chains.get(k)
                value = None if chain is None or wm.cleared(k) else chain[-1][1]
            for op, param in w.ops or ():
                value = apply_atomic(op, value, param)
            final[k] = value
        for seq, template, value_ in tr._vs_keys:
            k = fill_versionstamp(template, stamp)
            # Mutations apply in call order: a later clear_range over the final key wins.
            if not any(s > seq and b <= k < e for s, b, e in tr._clears):
                final[k] = value_

        watches = self._watches
        for k, value in final.items():
            chain = chains.get(k)
            if chain is None:
                if value is None:
                    continue
                chains[k] = [(version, value)]
                self._keys.add(k)
            else:
                if chain[-1][1] == value:
                    continue
                chain.append((version, value))
                self._pending.append((version, k))
            if watches and k in watches:
                self._fire_locked(k, value, fired)

        wb_list: list[bytes] = []
        we_list: list[bytes] = []
        for b, e in sorted(tr._wconf):
            if we_list and b <= we_list[-1]:
                if e > we_list[-1]:
                    we_list[-1] = e
            else:
                wb_list.append(b)
                we_list.append(e)
        if wb_list:
            self._log.append((version, wb_list, we_list))
        self.stats.commits += 1
        if self.counters:
            self._count_locked(tr, stamp)
        return version

    def _count_locked(self, tr: CommitRequest, stamp: bytes) -> None:
        """Tell the attached counters which keys this commit's mutations touched: each set,
        clear or atomic op on its key, a range clear once on its begin key, a versionstamped
        key under its final key. A commit with no mutation (write conflict ranges only) is
        not one."""
        keys = list(tr._wm.values)
        keys += [b for _, b, _ in tr._clears]
        keys += [fill_versionstamp(template, stamp) for _, template, _ in tr._vs_keys]
        if keys:
            for c in self.counters:
                c.committed(keys)

    def _commit_version_locked(self) -> tuple[int, int]:
        """The next commit's version and its order within the version (the versionstamp's
        last two bytes). Above every read version handed out (database.py: at most the
        clock's version - 1). The cluster model (cluster.py) gives one commit batch's
        transactions one version, in order."""
        return max(self._version + 1, self._now_version()), 0

    def _drop_released_locked(self) -> None:
        released, live = self._released, self._live
        while released:
            live.pop(released.popleft(), None)

    def _collect_locked(self) -> None:
        """Drop versions and log entries no transaction can still need."""
        self._drop_released_locked()
        if not self._pending and not self._log:
            return
        floor = self._version  # a transaction that reads from now on gets at least this
        if self._live:
            oldest = self.clock() - TRANSACTION_WINDOW_SECONDS - WINDOW_MARGIN_SECONDS
            for token, (rv, taken) in list(self._live.items()):
                if taken < oldest:
                    self._live.pop(token, None)  # expired: its next read or commit is 1007
                elif rv < floor:
                    floor = rv
        pending, chains = self._pending, self._chains
        while pending and pending[0][0] <= floor:
            key = pending.popleft()[1]
            chain = chains.get(key)
            if chain is None:
                continue
            i = len(chain) - 1
            while i > 0 and chain[i][0] > floor:
                i -= 1
            if i:
                del chain[:i]
            if len(chain) == 1 and chain[0][1] is None:
                del chains[key]
                self._keys.remove(key)
        log = self._log
        while log and log[0][0] <= floor:
            self._pruned_through = log.popleft()[0]

    # -- watches ---------------------------------------------------------------------------------

    def _fire_locked(self, key: bytes, value: bytes | None, fired: list[EventWatch]) -> None:
        waiting = self._watches[key]
        keep = [w for w in waiting if w.seen == value]
        if len(keep) == len(waiting):
            return
        fired.extend(w for w in waiting if w.seen != value)
        self._watch_count -= len(waiting) - len(keep)
        if keep:
            self._watches[key] = keep
        else:
            del self._watches[key]

    def _arm_watches(self, watches: list[EventWatch]) -> None:
        fire: list[EventWatch] = []
        refuse: list[EventWatch] = []
        with self._lock:
            for w in watches:
                if w.is_ready():
                    continue  # cancelled before its transaction committed
                chain = self._chains.get(w.key)
                if (chain[-1][1] if chain else None) != w.seen:
                    fire.append(w)
                elif self._watch_count >= self.max_watches:
                    refuse.append(w)
                else:
                    w._on_cancel = self._unregister
                    self._watches.setdefault(w.key, []).append(w)
                    self._watch_count += 1
        for w in fire:
            w.fire()
        for w in refuse:
            w.fail(1032, f"more than {self.max_watches} outstanding watches")

    def _unregister(self, w: EventWatch) -> None:
        with self._lock:
            waiting = self._watches.get(w.key)
            if waiting and w in waiting:
                waiting.remove(w)
                self._watch_count -= 1
                if not waiting:
                    del self._watches[w.key]

    def close(self) -> None:
        """Fail outstanding watches (1101) so that no waiter hangs on a closed database."""
        with self._lock:
            waiting = [w for ws in self._watches.values() for w in ws]
            self._watches.clear()
            self._watch_count = 0
        for w in waiting:
            w.fail(1101, "database closed")
