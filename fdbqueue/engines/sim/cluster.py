"""A model of a FoundationDB cluster, to measure a layer at a cluster's scale on two cores.

:class:`ClusterDatabase` is the sim engine (its MVCC, conflict ranges, 5-second window) plus what
a cluster does that one in-memory store does not, each calibrated to FoundationDB's published
figures and knobs (``fdbclient/ClientKnobs.cpp``, ``fdbserver/core/ServerKnobs.cpp``,
``documentation/sphinx/source/performance.rst`` in FoundationDB's source):

* **Virtual time** (:class:`~fdbqueue.engines.sim.virtual.VirtualTime`): clients are greenlets
  in one thread; every latency below is a sleep on a discrete-event clock, so hundreds of
  clients run the layer's real code while the clock shows what the cluster would take.
* **Latencies** (performance.rst, "Latency", under 75 % load): start transaction (GRV)
  0.3-1 ms, read 0.1-1 ms, commit 1.5-2.5 ms. A read version is taken at the first read.
* **Commit batches**: the commit proxy gathers the commits that arrive within
  ``COMMIT_TRANSACTION_BATCH_INTERVAL_MIN`` (1 ms; up to ``_MAX`` 20 ms under load) into one
  batch with one version; the resolver checks them in order, later ones against earlier ones
  of the same batch, and their versionstamps differ in the batch order (the last two bytes).
* **Versions** advance at ``VERSIONS_PER_SECOND`` (1e6) of virtual time; a read version is the
  last committed version, and an idle cluster commits an empty batch every
  ``MAX_COMMIT_BATCH_INTERVAL`` (2 s), so while idle read versions step by ~2e6. ``drift``
  makes the version rate differ from time (the master's rate is only held near 1e6 a second:
  ``MAX_VERSION_RATE_OFFSET``). :meth:`ClusterDatabase.recover` jumps versions by
  ``MAX_VERSIONS_IN_FLIGHT`` (100 s of versions; ``MAX_VERSIONS_IN_FLIGHT_FORCED``, a week, for
  a forced recovery), ends every open transaction (1007 at its next read or commit), ends the
  commits in flight unknown (1021) and delays every read version for ``downtime``.
* **Storage teams and ratekeeper** (:mod:`fdbqueue.engines.sim.ratekeeper`): keys on teams of
  ~20,000 writes a second; a team that lags makes ratekeeper delay *every* client's read
  version.
* **Per-error backoff** as ``Transaction::onError`` (``fdbclient/NativeAPI.actor.cpp``): for
  not_committed (1020), commit_unknown_result (1021) and the throttling and proxy-memory codes,
  a random fraction of a backoff that starts at ``DEFAULT_BACKOFF`` (10 ms) and grows by
  ``BACKOFF_GROWTH_RATE`` (2) up to ``DEFAULT_MAX_BACKOFF`` (1 s) (the transaction's max retry
  delay); for transaction_too_old (1007) and future_version (1009) a flat
  ``FUTURE_VERSION_RETRY_DELAY`` (10 ms). A user's ``reset()`` starts the backoff again
  (``Transaction::fullReset``); a retry does not.

Deterministic by seed: one thread, a clock that moves only by events in order, and every
random draw (latency jitter, backoff) from ``random.Random(seed)``.
"""

from __future__ import annotations

import math
import random
import zlib
from collections import Counter
from dataclasses import dataclass, field

from fdbqueue.engines.contract import KeySelector, KeyValue
from fdbqueue.engines.local.mutations import make_versionstamp
from fdbqueue.engines.local.watches import StampFuture
from fdbqueue.engines.sim.database import SimDatabase, SimTransaction
from fdbqueue.engines.sim.ratekeeper import Ratekeeper, TeamLoad, shard_of
from fdbqueue.engines.sim.store import _UNDER
from fdbqueue.engines.sim.virtual import VirtualTime
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.errors import EngineError

__all__ = ["ClusterDatabase", "ClusterKnobs", "ClusterStats", "ClusterTransaction"]

# Transaction::onError's codes that take the growing, randomised backoff (getBackoff):
# not_committed, commit_unknown_result, database_locked, commit_proxy_memory_limit_exceeded,
# process_behind, grv_proxy_memory_limit_exceeded, batch_transaction_throttled,
# tag_throttled, transaction_throttled_hot_shard (codes: flow/include/flow/error_definitions.h).
GROWING_BACKOFF_CODES = frozenset({1020, 1021, 1038, 1042, 1037, 1078, 1051, 1213, 1235})
# Of those, the ones whose backoff grows up to RESOURCE_CONSTRAINED_MAX_BACKOFF (30 s) instead
# of the transaction's max backoff: the proxies' memory limits, a throttled hot shard.
RESOURCE_CONSTRAINED_CODES = frozenset({1042, 1078, 1235})
# ... and the flat FUTURE_VERSION_RETRY_DELAY: transaction_too_old, future_version.
FLAT_BACKOFF_CODES = frozenset({1007, 1009})


@dataclass(frozen=True)
class ClusterKnobs:
    """The model's parameters; the defaults are FoundationDB's figures (see the module doc)."""

    teams: int = 20  # storage teams the shards spread over
    team_writes_per_second: float = 20_000.0  # performance.rst: ssd engine, writes, one process
    shard_depth: int = 3  # tuple elements that make a shard (ratekeeper.py)
    grv_latency: float = 0.0005  # performance.rst: start transaction 0.3 - 1 ms
    read_latency: float = 0.0005  # performance.rst: read 0.1 - 1 ms
    commit_latency: float = 0.002  # performance.rst: commit 1.5 - 2.5 ms (after the batch closes)
    jitter: float = 0.25  # each latency times uniform(1 - jitter, 1 + jitter)
    commit_batch_interval: float = 0.001  # COMMIT_TRANSACTION_BATCH_INTERVAL_MIN
    idle_batch_interval: float = 2.0  # MAX_COMMIT_BATCH_INTERVAL: empty batches while idle
    drift: float = 0.0  # versions run (1 + drift) times as fast as time
    ratekeeper_interval: float = 0.1  # METRIC_UPDATE_RATE
    ratekeeper_target: float = 1.0  # seconds of a team's work (TARGET_BYTES_PER_STORAGE_SERVER)
    ratekeeper_spring: float = 0.5  # seconds (SPRING_BYTES_STORAGE_SERVER)
    ratekeeper_smoothing: float = 1.0  # seconds (SMOOTHING_AMOUNT)
    recovery_jump: float = 100.0  # MAX_VERSIONS_IN_FLIGHT / VERSIONS_PER_SECOND
    recovery_downtime: float = 1.0  # seconds without read versions while the cluster recovers
    backoff_initial: float = 0.01  # DEFAULT_BACKOFF (fdbclient/ClientKnobs.cpp)
    backoff_max: float = 1.0  # DEFAULT_MAX_BACKOFF
    backoff_growth: float = 2.0  # BACKOFF_GROWTH_RATE
    backoff_resource_max: float = 30.0  # RESOURCE_CONSTRAINED_MAX_BACKOFF
    future_version_retry_delay: float = 0.01  # FUTURE_VERSION_RETRY_DELAY

    def __post_init__(self) -> None:
        # Each knob in its range, by name: one out of it would end a run later (a division by
        # zero in ratekeeper, versions going back at a recovery).
        for name in ("teams", "shard_depth"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, not {value!r}")
        positive = (
            "team_writes_per_second",
            "commit_batch_interval",
            "idle_batch_interval",
            "ratekeeper_interval",
            "ratekeeper_target",
            "ratekeeper_smoothing",
        )
        for name in positive:
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) > 0):
                raise ValueError(f"{name} must be a finite number > 0, not {getattr(self, name)!r}")
        non_negative = (
            "grv_latency",
            "read_latency",
            "commit_latency",
            "recovery_downtime",
            "recovery_jump",
            "backoff_initial",
            "backoff_max",
            "backoff_resource_max",
            "future_version_retry_delay",
        )
        for name in non_negative:
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0):
                raise ValueError(
                    f"{name} must be a non-negative number of seconds, not {getattr(self, name)!r}"
                )
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be in [0, 1)")
        if not (math.isfinite(self.drift) and self.drift > -1):
            # versions run (1 + drift) times as fast as time: forward, at a finite rate
            raise ValueError("drift must be a finite number > -1")
        if not (math.isfinite(self.backoff_growth) and self.backoff_growth >= 1):
            raise ValueError(f"backoff_growth must be a finite number >= 1, not {self.backoff_growth!r}")
        if not 0 < self.ratekeeper_spring <= self.ratekeeper_target:
            raise ValueError("ratekeeper_spring must be in (0, ratekeeper_target]")


@dataclass
class ClusterStats:
    """What the model counted (virtual-time figures; read between runs)."""

    transactions: int = 0  # attempts that took a read version or committed blind writes
    grvs: int = 0
    grv_wait: float = 0.0  # seconds read versions waited in all (latency and throttling)
    throttled_wait: float = 0.0  # of which ratekeeper's and recoveries' share
    batches: int = 0  # commit batches with at least one commit
    commits: int = 0  # committed transactions with writes
    errors: Counter[int] = field(default_factory=Counter)  # on_error's codes
    key_writes: Counter[bytes] = field(default_factory=Counter)  # mutations per key
    recoveries: int = 0


class _OrderedStamp(StampFuture):
    """A commit's versionstamp: its batch's version and its order in the batch."""

    __slots__ = ("order",)

    def __init__(self) -> None:
        super().__init__()
        self.order = 0

    def wait(self) -> bytes:
        if self._version is not None:
            return make_versionstamp(self._version, self.order)
        return super().wait()


class ClusterTransaction(SimTransaction):
    """A sim transaction whose read version, reads, commit and retries take virtual time."""

    _sim: ClusterDatabase

    def __init__(self, db: ClusterDatabase) -> None:
        self._backoff = db.knobs.backoff_initial
        super().__init__(db)

    def _clear_state(self) -> None:
        super()._clear_state()
        self._stamp = _OrderedStamp()

    # -- read version and reads ------------------------------------------------------------------

    def _start(self) -> None:
        """Before the first read: wait for a read version (GRV proxy, ratekeeper)."""
        if self._rv is None:
            self._sim._grv()

    def _get(self, key: bytes, snapshot: bool) -> bytes | None:
        self._start()
        self._sim._pause(self._sim.knobs.read_latency)
        return super()._get(key, snapshot)

    def _get_many(self, keys: list[bytes], snapshot: bool) -> dict[bytes, bytes | None]:
        # The reads of a get_many are issued together: one round trip (performance.rst,
        # "Reads": do as many reads as possible in parallel).
        self._start()
        self._sim._pause(self._sim.knobs.read_latency)
        get = super()._get
        return {k: get(k, snapshot) for k in keys}

    def _resolve(self, selector: KeySelector, snapshot: bool) -> bytes:
        self._start()
        self._sim._pause(self._sim.knobs.read_latency)
        return super()._resolve(selector, snapshot)

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        self._start()
        self._sim._pause(self._sim.knobs.read_latency)
        return super()._get_range(begin, end, limit, reverse, snapshot)

    def _read_version(self) -> int:
        self._start()
        return super()._read_version()

    def _acquire_locked(self) -> int:
        rv = self._rv
        if rv is not None:
            if self._token not in self._sim._live:
                raise EngineError(1007, "read version expired: older than the 5-second window or a recovery")
            return rv
        db = self._sim
        if db._released:
            db._drop_released_locked()
        rv = self._rv = db._read_version_locked()
        self._rv_time = db.clock()
        self._token = next(db._tokens)
        db._live[self._token] = (rv, self._rv_time)
        db.cluster_stats.transactions += 1
        return rv

    # -- commit ----------------------------------------------------------------------------------

    def _commit(self) -> int:
        db = self._sim
        if not (self._wm or self._vs_keys or self._wconf):
            return super()._commit()  # read-only: local, at once
        if self._rv is None:
            # Blind writes: tryCommit still starts the transaction (a read version flagged
            # CAUSAL_READ_RISKY, fdbclient/NativeAPI.actor.cpp), so ratekeeper holds it too.
            db.cluster_stats.transactions += 1
            db._grv()
        keys = self._mutated_keys()
        epoch = db._epoch
        batch = db._enter_batch()
        if db._epoch != epoch:
            # A recovery while the commit was on its way: FoundationDB answers
            # commit_unknown_result; here it was not applied.
            self._release()
            raise EngineError(1021, "commit_unknown_result: the cluster recovered during the commit")
        db._applying = batch
        version = super()._commit()
        if version >= 0:
            assert isinstance(self._stamp, _OrderedStamp)
            self._stamp.order = db._batch_order
            db._took(keys)
        return version

    def _mutated_keys(self) -> list[tuple[bytes, int]]:
        """(key, mutations) of this attempt: a set or clear once, each atomic op once, a range
        clear once on its begin key, a versionstamped key under its template."""
        out: list[tuple[bytes, int]] = []
        for k, w in self._wm.values.items():
            out.append((k, len(w.ops or ()) if w.kind == _UNDER else 1))
        out.extend((b, 1) for b, _ in self._wm.cleared_ranges)
        out.extend((template, 1) for _, template, _ in self._vs_keys)
        return out

    # -- retries ---------------------------------------------------------------------------------

    def on_error(self, error: BaseException) -> None:
        """FoundationDB's per-error backoff (module doc); the retry rules are the sim's."""
        code = getattr(error, "code", None)
        super().on_error(error)  # re-raises what is not retryable; the base waits 0 here
        db = self._sim
        db.cluster_stats.errors[code or 0] += 1
        cap = min(db.knobs.backoff_max, self.options.max_retry_delay_ms / 1000.0)
        if code in FLAT_BACKOFF_CODES:
            delay = min(db.knobs.future_version_retry_delay, cap)
        elif code in GROWING_BACKOFF_CODES:
            delay = self._backoff * db._random.random()
            if code in RESOURCE_CONSTRAINED_CODES:
                cap = db.knobs.backoff_resource_max
            self._backoff = min(self._backoff * db.knobs.backoff_growth, cap)
        else:
            delay = 0.0
        db.last_backoff = delay
        if delay > 0:
            db.sleep(delay)

    def reset(self) -> None:
        super().reset()
        self._backoff = self._sim.knobs.backoff_initial


class ClusterDatabase(SimDatabase):
    """The sim engine on a modelled cluster (module doc). Run its clients on ``clock``:

    >>> vt = VirtualTime()
    >>> db = ClusterDatabase(seed=7, knobs=ClusterKnobs(teams=20), clock=vt)
    >>> vt.spawn(lambda: queue.enqueue(db, b"x")); vt.run(until=10.0)   # doctest: +SKIP
    """

    retry_base_delay = 0.0  # the per-error backoff is ClusterTransaction.on_error's
    may_commit_unknown = True  # a recovery ends commits in flight with 1021

    def __init__(
        self, *, seed: int = 0, knobs: ClusterKnobs | None = None, clock: VirtualTime | None = None
    ) -> None:
        self.knobs = knobs or ClusterKnobs()
        self.vt = clock or VirtualTime()
        super().__init__(seed=seed, clock=self.vt)
        self.engine = "sim"
        self.url = f"sim://?seed={seed}"  # the model has no URL: ClusterDatabase(...) makes it
        self.cluster_stats = ClusterStats()
        self._random = random.Random(seed * 1_000_003 + 17)
        k = self.knobs
        self.teams = [TeamLoad(k.team_writes_per_second) for _ in range(k.teams)]
        self.ratekeeper = Ratekeeper(
            self.teams,
            k.ratekeeper_target,
            k.ratekeeper_spring,
            k.ratekeeper_interval,
            k.ratekeeper_smoothing,
        )
        self._team_of: dict[bytes, int] = {}
        self._epoch = 0
        self._down_until = 0.0
        self._batch_id = -1  # the batch being applied now, its version and order so far
        self._batch_version = -1
        self._batch_order = 0
        self._applying = -1
        self.last_backoff = 0.0

    # -- time and versions -----------------------------------------------------------------------

    def _now_version(self) -> int:
        now = self._manual.now() if self._manual is not None else 0.0
        return int(now * VERSIONS_PER_SECOND * (1.0 + self.knobs.drift)) + self._jumped

    def _version_at(self, t: float) -> int:
        return int(t * VERSIONS_PER_SECOND * (1.0 + self.knobs.drift)) + self._jumped

    def _read_version_locked(self) -> int:
        """The last committed version (the batch being applied at this instant excluded), or
        the last empty batch's while idle."""
        now = self.vt.now()
        committed = self._version
        if self._batch_id >= 0 and self._batch_time(self._batch_id) == now:
            committed = self._batch_version - 1
        k = self.knobs.idle_batch_interval
        idle = self._version_at(math.floor(now / k) * k) - 1
        return max(committed, min(idle, self._now_version() - 1))

    def _pause(self, seconds: float) -> None:
        j = self.knobs.jitter
        if j:
            seconds *= 1.0 + j * (2.0 * self._random.random() - 1.0)
        self.vt.sleep(seconds)

    def _grv(self) -> None:
        now = self.vt.now()
        release = max(self.ratekeeper.admit(now), self._down_until)
        s = self.cluster_stats
        s.grvs += 1
        s.throttled_wait += release - now
        self.vt.sleep(release - now)
        self._pause(self.knobs.grv_latency)
        s.grv_wait += self.vt.now() - now

    # -- commit batches --------------------------------------------------------------------------

    def _batch_time(self, batch: int) -> float:
        return batch * self.knobs.commit_batch_interval + self.knobs.commit_latency

    def _enter_batch(self) -> int:
        """Wait for the next batch to close and be logged; its number."""
        now = max(self.vt.now(), self._down_until)
        batch = math.floor(now / self.knobs.commit_batch_interval) + 1
        self.vt.sleep(self._batch_time(batch) - self.vt.now())
        return batch

    def _commit_version_locked(self) -> tuple[int, int]:
        if self._applying == self._batch_id:
            self._batch_order += 1
            return self._batch_version, self._batch_order
        self._batch_id = self._applying
        self._batch_version = max(self._version + 1, self._now_version())
        self._batch_order = 0
        self.cluster_stats.batches += 1
        return self._batch_version, 0

    def _took(self, keys: list[tuple[bytes, int]]) -> None:
        now = self.vt.now()
        depth = self.knobs.shard_depth
        writes = self.cluster_stats.key_writes
        self.cluster_stats.commits += 1
        for key, n in keys:
            team = self._team_of.get(key)
            if team is None:
                team = self._team_of[key] = zlib_team(shard_of(key, depth), len(self.teams))
            self.teams[team].add(n, now)
            writes[key] += n

    def team_of(self, key: bytes) -> int:
        """The team ``key`` lives on."""
        return zlib_team(shard_of(key, self.knobs.shard_depth), len(self.teams))

    # -- recoveries ------------------------------------------------------------------------------

    def recover(self, jump: float | None = None, downtime: float | None = None) -> None:
        """A recovery now: versions jump by ``jump`` seconds' worth (default the knob, 100 s),
        open transactions end (1007 at their next read or commit), commits in flight end
        unknown (1021), and read versions wait ``downtime`` seconds."""
        jump = self.knobs.recovery_jump if jump is None else jump
        downtime = self.knobs.recovery_downtime if downtime is None else downtime
        if not (math.isfinite(jump) and jump >= 0 and math.isfinite(downtime) and downtime >= 0):
            raise ValueError("jump and downtime must be non-negative numbers of seconds")
        with self._lock:
            self._jump_locked(round(jump * VERSIONS_PER_SECOND))
            self._version = max(self._version, self._now_version())
            self._live.clear()
            self._epoch += 1
        self._down_until = self.vt.now() + downtime
        self.cluster_stats.recoveries += 1

    @property
    def available_at(self) -> float:
        """When read versions are served again after the last recovery (virtual seconds)."""
        return self._down_until

    def create_transaction(self) -> ClusterTransaction:
        self._check_up()
        return ClusterTransaction(self)

    # -- what a benchmark reads ------------------------------------------------------------------

    def hottest_team(self) -> tuple[int, int]:
        """(team, mutations) of the most-written team."""
        i = max(range(len(self.teams)), key=lambda t: self.teams[t].writes)
        return i, self.teams[i].writes


def zlib_team(shard: bytes, teams: int) -> int:
    """The team a shard is placed on: a stable hash (crc32), the same in every run."""
    return zlib.crc32(shard) % teams
