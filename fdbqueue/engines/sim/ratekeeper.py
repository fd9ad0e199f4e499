"""The cluster model's storage teams and ratekeeper: where a hot key slows every client.

**Teams.** FoundationDB keeps each key range (a shard) on one storage team: ``storageTeamSize``
replicas (3 in triple mode), each of which applies every mutation of the range. So one team
takes a key's writes at the rate one storage process sustains - ~20,000 writes a second for
the ssd engine (``documentation/sphinx/source/performance.rst``, "Throughput": one process on
one core) - however many teams the cluster has. Data distribution splits shards by size
(``MAX_SHARD_BYTES`` = 500e6) and by write bandwidth (``SHARD_SPLIT_BYTES_PER_KSEC`` = 250e6,
``fdbserver/core/ServerKnobs.cpp``) and spreads them over teams; a layer's key space is small
and its load is its writes, so bandwidth splitting is what places it: hot ranges are split
down to the smallest unit the keys allow, and a single key cannot be split at all. The
model's shard is the keys sharing their first ``shard_depth`` tuple elements (the bytes up to
the ``shard_depth``-th 0x00 byte: for fdbqueue's layout, at the default 3, one queue's keys,
one index's entry, or one global key), placed on a team by a stable hash (crc32).

Each team has a backlog: mutations received but not yet made durable, drained at the team's
write rate. Its *queue* is that backlog in seconds of the team's work.

**Ratekeeper** (``fdbserver/ratekeeper/Ratekeeper.cpp``, ``updateRate``). Every
``METRIC_UPDATE_RATE`` (0.1 s) it looks at every storage server's queue and, for one whose queue
is over ``TARGET_BYTES_PER_STORAGE_SERVER - SPRING_BYTES_STORAGE_SERVER`` (1000e6 - 100e6 bytes),
computes ``targetRateRatio = min((queue - target + spring) / spring, 2)`` and the transaction
rate limit ``actualTps * durableRate / (inputRate * targetRateRatio)``; the cluster's limit is
the lowest. It ignores at most ``min(storageTeamSize - 1, MAX_MACHINES_FALLING_BEHIND)`` (1)
machines: a team's replicas all lag together (they all take every write of the range), so one
lagging team limits the whole cluster. The GRV proxies hand out read versions at no more than
that rate: every client's transaction start waits, not just the hot key's writers.

The model keeps that law, with the queue measured in seconds of a team's work instead of
bytes: FoundationDB's 900e6 bytes at an ssd process's ~20,000 writes/s of ~100-byte mutations
are minutes of backlog, which a cluster reaches after minutes of overload; the model's default
target (1 s, spring 0.5 s) reaches the same steady state - the hot team's input held at its
durable rate - within a run of a few virtual seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

__all__ = ["Ratekeeper", "TeamLoad", "shard_of"]


def shard_of(key: bytes, depth: int) -> bytes:
    """The model's shard of ``key``: its bytes up to the ``depth``-th 0x00 (the whole key if fewer)."""
    at = -1
    for _ in range(depth):
        at = key.find(b"\x00", at + 1)
        if at < 0:
            return key
    return key[: at + 1]


@dataclass
class TeamLoad:
    """One team's write load: what it took, what it still has to make durable."""

    rate: float  # mutations a second the team makes durable
    backlog: float = 0.0  # mutations not yet durable (as of ``at``)
    at: float = 0.0
    writes: int = 0  # every mutation it took
    peak: float = 0.0  # the largest queue (seconds) seen
    inflow: int = 0  # mutations since the ratekeeper last looked
    smooth_input: float = 0.0  # mutations a second, smoothed
    smooth_durable: float = 0.0

    def drain(self, now: float) -> None:
        if now > self.at:
            self.backlog = max(0.0, self.backlog - self.rate * (now - self.at))
            self.at = now

    def add(self, n: int, now: float) -> None:
        self.drain(now)
        self.backlog += n
        self.writes += n
        self.inflow += n
        self.peak = max(self.peak, self.backlog / self.rate)

    def queue(self, now: float) -> float:
        """Seconds of work not yet durable."""
        self.drain(now)
        return self.backlog / self.rate


@dataclass
class Ratekeeper:
    """The teams' loads, the cluster's transaction rate limit and the GRV queue it makes."""

    teams: list[TeamLoad]
    target: float  # seconds of a team's work: TARGET_BYTES_PER_STORAGE_SERVER's counterpart
    spring: float  # SPRING_BYTES_STORAGE_SERVER's counterpart
    interval: float  # METRIC_UPDATE_RATE
    smoothing: float  # seconds: the time constant of the smoothed rates (SMOOTHING_AMOUNT)
    limit: float = math.inf  # transactions a second the GRV proxies release
    limited_by: int | None = None  # the team that set the limit
    _updated: float = 0.0
    _next_free: float = 0.0  # when the GRV queue releases its next read version
    _started: int = 0  # transactions started since the last update
    _smooth_tps: float = 0.0
    _backlog_then: list[float] = field(default_factory=list)
    limited_seconds: float = 0.0  # virtual time spent with a finite limit

    def update(self, now: float) -> None:
        """Recompute the limit once ``interval`` has passed (lazily, when a GRV asks)."""
        dt = now - self._updated
        if dt < self.interval:
            return
        alpha = 1.0 - math.exp(-dt / self.smoothing)
        if math.isfinite(self.limit):
            self.limited_seconds += dt
        tps = self._started / dt
        self._smooth_tps += alpha * (tps - self._smooth_tps)
        self._started = 0
        if len(self._backlog_then) != len(self.teams):
            self._backlog_then = [0.0] * len(self.teams)
        actual_tps = max(self._smooth_tps, 1.0)
        limit, by = math.inf, None
        for i, team in enumerate(self.teams):
            team.drain(now)
            durable = max(0.0, self._backlog_then[i] + team.inflow - team.backlog)
            self._backlog_then[i] = team.backlog
            team.smooth_input += alpha * (team.inflow / dt - team.smooth_input)
            team.smooth_durable += alpha * (durable / dt - team.smooth_durable)
            team.inflow = 0
            queue = team.backlog / team.rate
            ratio = min((queue - self.target + self.spring) / self.spring, 2.0)
            if ratio > 0 and team.smooth_input > 0:
                x = max(team.smooth_durable, 1.0) / (team.smooth_input * ratio)
                lim = actual_tps * x
                if lim < limit:
                    limit, by = lim, i
        self.limit = max(limit, 1.0) if math.isfinite(limit) else math.inf
        self.limited_by = by
        self._updated = now

    def admit(self, now: float) -> float:
        """A read version asked for at ``now``: when the GRV proxy releases it (>= now)."""
        self.update(now)
        self._started += 1
        if not math.isfinite(self.limit):
            self._next_free = now
            return now
        release = max(now, self._next_free)
        self._next_free = release + 1.0 / self.limit
        return release
