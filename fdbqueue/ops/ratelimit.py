"""Rate limits inside the lease transaction: a token bucket split into shards.

A queue's ``rate_limit`` (``create_queue(db, "emails", rate_limit="50/s")``), and the named
limits a Worker passes (``Worker(..., rate_limit="50/s")``), bound how many messages every
consumer of the database together leases a period. The bucket lives in the database, so the
limit holds across threads, processes and machines.

**Why shards.** A single bucket key that every consumer reads and writes is a hot key: each
take conflicts with every concurrent take (FoundationDB developer guide, "Conflict ranges":
a transaction fails when a key it read was written after its read version), and one storage
team serves all of them. An atomic add would not conflict, but a bucket must refuse a take
when it is empty, which needs the value read (FoundationDB developer guide, "Atomic
operations": an atomic op whose key is also read serializably conflicts as a write after a
read does). So the bucket is ``Rate.shards`` keys (``layout.RateKeys``), each refilling at
``rate / shards`` tokens a second up to ``capacity / shards``; ``shards`` grows with the rate
so that each key is written at most ``rates.PER_SHARD_RATE`` (25) times a second: every
take that writes takes a token at least. A take reads a few shards at snapshot isolation
(no conflicts: FoundationDB's queue recipe, ``recipes/python-recipes/micro_queue.py``),
picks the fullest, and adds a read conflict on that one key only, then writes it back: two
consumers conflict only when they drew the same shard at the same moment, and the loser's
retry draws again.

**Time** is database time (``fdbqueue.store.clock``): a shard stores the read version it
was counted at, and refills by the versions since, so no client's clock takes part and a
stopped or skewed clock neither grants nor withholds tokens.

**Bounds.** A bucket starts full and holds ``rates.BURST_SECONDS`` of its rate at most, so
in any window of T seconds at most ``rate * T + burst`` messages are leased (110 in a
second for ``"100/s"``). Tokens a lease takes but cannot use (fewer messages ready) are
not spent: the shard is written with what was leased. A lease with nothing granted writes
nothing, and its caller learns how long to wait (:func:`throttled`) instead of spinning on
a queue that has messages ready.

Every function composes inside the caller's transaction (the lease's).
"""

from __future__ import annotations

import math
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from functools import lru_cache
from typing import Any

from fdbqueue.engines.contract import Transaction
from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys, RateKeys
from fdbqueue.store.rates import Rate, decode_state, encode_state, parse_rate, seconds_to_token

PROBE = 4  # shards one take reads (all of them when the bucket has no more)

Limit = tuple[RateKeys, Rate]


class _Local(threading.local):
    extra: tuple[Rate, str | None] | None = None  # a worker's own limit, its bucket's name
    wait: float | None = None  # the last take that granted nothing: seconds to the next token


_local = _Local()
_extra_users = 0  # threads inside ``extra``: the lease path looks at the thread's own only then
_extra_lock = threading.Lock()


@lru_cache(maxsize=256)
def rate_of(text: str) -> Rate:
    """The parsed rate (settings are read by every lease: parsed once per distinct text)."""
    return parse_rate(text)


@contextmanager
def extra(rate: Rate, name: str | None = None) -> Iterator[None]:
    """Within the block, this thread's leases also take from the named bucket ``name`` at
    ``rate`` (None: a bucket per queue, named as the queue): a Worker's ``rate_limit``,
    shared by every worker, in any process, that gives the same name."""
    global _extra_users
    before = _local.extra
    _local.extra = (rate, name)
    with _extra_lock:
        _extra_users += 1
    try:
        yield
    finally:
        _local.extra = before
        with _extra_lock:
            _extra_users -= 1


def throttled() -> float | None:
    """Seconds until a token comes, when this thread's last lease was refused one (then
    cleared); None when it was not held back by a rate limit."""
    wait, _local.wait = _local.wait, None
    return wait


def timer_watch(key: bytes, seconds: float) -> EventWatch:
    """A watch that fires after ``seconds``: what a blocking lease held back by a rate limit
    waits on, instead of the queue's wake key (which says messages are ready, and would
    wake it at once, again and again)."""
    w = EventWatch(key, None)
    timer = threading.Timer(seconds, w.fire)
    timer.daemon = True
    timer.start()
    return w


class Gate:
    """The tokens one lease transaction took: ``granted`` messages at most; :meth:`spend`
    writes back what the lease used."""

    __slots__ = ("granted", "now", "taken")

    def __init__(self, granted: int, now: int, taken: list[tuple[bytes, float]]) -> None:
        self.granted = granted
        self.now = now
        self.taken = taken  # (shard key, tokens it held at now)

    def spend(self, tr: Transaction, used: int) -> None:
        """Take ``used`` tokens from each shard drawn (nothing written when 0)."""
        if used <= 0:
            return
        for key, tokens in self.taken:
            tr.set(key, encode_state(tokens - used, self.now))


def limits_of(keys: QueueKeys, cfg: QueueConfig) -> list[Limit]:
    """The limits a lease on ``keys``' queue takes from: its own, and this thread's extras."""
    out: list[Limit] = []
    if cfg.rate_limit is not None:
        out.append((RateKeys.of_queue(keys), rate_of(cfg.rate_limit)))
    own = _local.extra
    if own is not None:
        rate, name = own
        out.append((RateKeys.named(keys.name if name is None else name, keys.root), rate))
    return out


def gate(tr: Transaction, keys: QueueKeys, cfg: QueueConfig, now: int, n: int) -> Gate | None:
    """Tokens for a lease of up to ``n`` messages at version ``now``; None when no limit
    applies (nothing read). A Gate granting 0 leases nothing and sets :func:`throttled`."""
    if cfg.rate_limit is None and not _extra_users:
        return None
    limits = limits_of(keys, cfg)
    if not limits:
        return None
    granted = n
    taken: list[tuple[bytes, float]] = []
    wait = 0.0
    for rk, rate in limits:
        key, tokens, until = _draw(tr, rk, rate, now)
        if tokens < 1.0:
            granted, wait = 0, max(wait, until)
            continue
        granted = min(granted, math.floor(tokens))
        taken.append((key, tokens))
    if granted <= 0:
        _local.wait = max(wait, 0.001)
        return Gate(0, now, [])
    _local.wait = None
    for key, _ in taken:
        tr.add_read_conflict_key(key)  # conflicts confined to the shard drawn
    return Gate(granted, now, taken)


def take(
    tr: Transaction, name: str, rate: Rate | str, n: int = 1, *, root: tuple[Any, ...] = DEFAULT_ROOT
) -> tuple[int, float]:
    """Take up to ``n`` tokens from the named bucket ``name`` at ``rate``, in ``tr``: (tokens
    taken, seconds until the next token when none was). The bucket is the one a Worker's
    ``rate_limit_key=name`` takes from, so a caller that limits something other than a lease
    (a task of a queue shared with other tasks) shares it with those workers. Composes inside
    the caller's transaction: nothing is spent when it aborts."""
    rate = rate_of(rate) if isinstance(rate, str) else rate
    key, tokens, until = _draw(tr, RateKeys.named(name, root), rate, db_now(tr))
    if tokens < 1.0:
        return 0, max(until, 0.001)
    got = min(n, math.floor(tokens))
    tr.add_read_conflict_key(key)
    tr.set(key, encode_state(tokens - got, db_now(tr)))
    return got, 0.0


def _draw(tr: Transaction, rk: RateKeys, rate: Rate, now: int) -> tuple[bytes, float, float]:
    """A shard of ``rk`` to take from: (its key, its tokens, seconds until it holds one).
    Reads PROBE shards at most, chosen at random, at snapshot isolation."""
    shards = rate.shards
    picks = list(range(shards)) if shards <= PROBE else random.sample(range(shards), PROBE)
    random.shuffle(picks)  # ties go to a random shard: takers spread over them
    shard_keys = [rk.shard(i) for i in picks]
    raws = tr.snapshot.get_many(shard_keys)
    best_key, best = shard_keys[0], -1.0
    for key, raw in zip(shard_keys, raws, strict=True):
        tokens = decode_state(raw, rate, now, VERSIONS_PER_SECOND)
        if tokens > best:
            best_key, best = key, tokens
    return best_key, best, seconds_to_token(best, rate)
