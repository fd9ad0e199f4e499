"""Rate limits: the text users write (``"50/s"``, ``"1000/m"``, ``"10/h"``), and the token
bucket's arithmetic and stored state (no I/O; ``fdbqueue.ops.ratelimit`` takes tokens).

A limit is a token bucket split into ``shards`` keys (``layout.RateKeys``): each shard fills
at ``per_second / shards`` tokens a second up to ``capacity / shards`` (at least one token),
so that no one key takes every consumer's write. Why, and the bounds: ``ops/ratelimit.py``.
"""

from __future__ import annotations

import math
import re
import struct
from dataclasses import dataclass

from fdbqueue.errors import QueueError

UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_TEXT = re.compile(r"([0-9]+(?:\.[0-9]+)?)/([smhd])")

# Tokens a second one shard refills at most: every take writes its shard once and takes a
# token at least, so this bounds each key's write rate (FoundationDB's developer guide keeps
# a key's updates to "tens to hundreds" a second before it is a hot key).
PER_SHARD_RATE = 25.0
MAX_SHARDS = 1024  # up to 25,600/s (a take reads PROBE shards whatever their number, so more
# shards cost a take nothing)
# The burst: what the bucket holds when full, in seconds of its rate. At most rate + burst
# messages start in any one-second window (110 for a 100/s limit).
BURST_SECONDS = 0.1
# The highest limit the design bears: every shard at PER_SHARD_RATE. Above it each shard's key
# would be written more often than that, so such a limit is refused rather than stretched.
MAX_RATE = PER_SHARD_RATE * MAX_SHARDS  # 25,600 tokens a second

_STATE = struct.Struct("<dq")  # tokens left, the database version they were counted at


@dataclass(frozen=True)
class Rate:
    """``count`` messages a ``period`` seconds: a parsed rate limit."""

    count: float
    period: float
    text: str

    @property
    def per_second(self) -> float:
        return self.count / self.period

    @property
    def shards(self) -> int:
        """Keys the bucket is split over: one per PER_SHARD_RATE tokens a second."""
        return max(1, min(MAX_SHARDS, math.ceil(self.per_second / PER_SHARD_RATE)))

    @property
    def shard_rate(self) -> float:
        """Tokens a second one shard refills."""
        return self.per_second / self.shards

    @property
    def shard_capacity(self) -> float:
        """Tokens one shard holds at most: BURST_SECONDS of its rate, one token at least
        (a slow limit, ``"10/h"``, hands out one message at a time)."""
        return max(1.0, self.shard_rate * BURST_SECONDS)

    def __str__(self) -> str:
        return self.text


def parse_rate(text: object, what: str = "rate_limit") -> Rate:
    """``"<count>/<unit>"``, unit ``s``, ``m``, ``h`` or ``d`` and count a number above 0
    (``"50/s"``, ``"1000/m"``, ``"0.5/s"``), at most :data:`MAX_RATE` (25,600) a second; a
    clear :class:`QueueError` for anything else."""
    if isinstance(text, Rate):
        return text
    if not isinstance(text, str):
        raise QueueError(f"{what} must be a str such as '50/s', '1000/m' or '10/h', got {text!r}")
    found = _TEXT.fullmatch(text)
    if found is None:
        raise QueueError(
            f"{what} {text!r} is not a rate: write '<count>/<unit>' with unit s, m, h or d "
            "(per second, minute, hour, day), e.g. '50/s', '1000/m', '10/h'"
        )
    count = float(found.group(1))
    period = UNITS[found.group(2)]
    if not count > 0:
        raise QueueError(f"{what} {text!r}: the count must be above 0")
    if count / period > MAX_RATE:
        raise QueueError(
            f"{what} {text!r}: at most {MAX_RATE:,.0f} a second ({MAX_SHARDS:,} shards of "
            f"{PER_SHARD_RATE:g} a second each, the most the token bucket spreads its writes over)"
        )
    return Rate(count, period, text)


def encode_state(tokens: float, at: int) -> bytes:
    return _STATE.pack(tokens, at)


def decode_state(raw: bytes | None, rate: Rate, now: int, versions_per_second: float) -> float:
    """Tokens a shard holds at version ``now``: what it stored, refilled since at the shard's
    rate up to its capacity. An absent or damaged shard is full (a new limit starts full)."""
    cap = rate.shard_capacity
    if raw is None or len(raw) != _STATE.size:
        return cap
    tokens: float
    at: int
    tokens, at = _STATE.unpack(raw)
    if not math.isfinite(tokens):
        return cap
    elapsed = max(0, now - at) / versions_per_second
    return float(max(0.0, min(cap, tokens + elapsed * rate.shard_rate)))


def seconds_to_token(tokens: float, rate: Rate) -> float:
    """Seconds until a shard holding ``tokens`` holds one."""
    return max(0.0, (1.0 - tokens) / rate.shard_rate)
