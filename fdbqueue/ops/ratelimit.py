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
take that writes takes a token at least. A take reads up to ``PROBE`` shards, chosen at
random, at snapshot isolation in one round trip (no conflicts: FoundationDB's queue recipe,
``recipes/python-recipes/micro_queue.py``), takes from the fullest (and the next ones, while
it wants more), and adds a read conflict on the shards it takes from only, then writes them
back: two consumers conflict only when they drew the same shard at the same moment, and the
loser's retry draws again.

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

from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.errors import QueueError
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys, RateKeys
from fdbqueue.store.rates import Rate, decode_state, encode_state, parse_rate, seconds_to_token

PROBE = 8  # shards one take reads, in one round trip (all of them when the bucket has no more)

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


def limited(cfg: QueueConfig) -> bool:
    """Whether a lease of the queue of ``cfg`` may take tokens (:func:`gate` would not answer
    None at once): its own rate limit, or a thread inside :func:`extra`."""
    return cfg.rate_limit is not None or bool(_extra_users)


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

    def __init__(self, granted: int, now: int, taken: list[list[tuple[bytes, float]]]) -> None:
        self.granted = granted
        self.now = now
        self.taken = taken  # per limit: (shard key, tokens it held at now), fullest first

    def spend(self, tr: Transaction, used: int) -> None:
        """Take ``used`` tokens from each limit's shards, fullest first (nothing written when
        0; a shard is written only when tokens are taken from it)."""
        if used <= 0:
            return
        for shards in self.taken:
            left = used
            for key, tokens in shards:
                if left <= 0:
                    break
                part = min(left, math.floor(tokens))
                tr.set(key, encode_state(tokens - part, self.now))
                left -= part


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
    taken: list[list[tuple[bytes, float]]] = []
    wait = 0.0
    for rk, rate in limits:
        shards, until = _draw(tr, rk, rate, now, n)
        have = sum(math.floor(t) for _, t in shards)
        if not have:
            granted, wait = 0, max(wait, until)
            continue
        granted = min(granted, have)
        taken.append(shards)
    if granted <= 0:
        _local.wait = max(wait, 0.001)
        return Gate(0, now, [])
    _local.wait = None
    for shards in taken:
        left = granted
        for key, tokens in shards:  # conflicts confined to the shards taken from
            if left <= 0:
                break
            tr.add_read_conflict_key(key)
            left -= math.floor(tokens)
    return Gate(granted, now, taken)


def take(
    tr: Transaction | Database,
    name: str,
    rate: Rate | str,
    n: int = 1,
    *,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> tuple[int, float]:
    """Take up to ``n`` tokens from the named bucket ``name`` at ``rate``, in ``tr``: (tokens
    taken, seconds until the next token when none was). The bucket is the one a Worker's
    ``rate_limit_key=name`` takes from, so a caller that limits something other than a lease
    (a task of a queue shared with other tasks) shares it with those workers. Composes inside
    the caller's transaction: nothing is spent when it aborts; given a Database, a transaction
    of its own (a commit that ends unknown and is run again may spend tokens twice: the limit
    errs on the side of fewer)."""
    if not isinstance(name, str) or not name:
        raise QueueError(f"name must be a non-empty str, got {name!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise QueueError(f"n must be an int >= 1, got {n!r}")
    parsed = rate_of(rate) if isinstance(rate, str) else rate
    return run_once(tr, lambda t, _: _take(t, name, parsed, n, root))


def _take(tr: Transaction, name: str, rate: Rate, n: int, root: tuple[Any, ...]) -> tuple[int, float]:
    now = db_now(tr)
    shards, until = _draw(tr, RateKeys.named(name, root), rate, now, n)
    if not shards:
        return 0, max(until, 0.001)
    gate = Gate(min(n, sum(math.floor(t) for _, t in shards)), now, [shards])
    left = gate.granted
    for key, tokens in shards:
        if left <= 0:
            break
        tr.add_read_conflict_key(key)
        left -= math.floor(tokens)
    gate.spend(tr, gate.granted)
    return gate.granted, 0.0


def _draw(
    tr: Transaction, rk: RateKeys, rate: Rate, now: int, n: int
) -> tuple[list[tuple[bytes, float]], float]:
    """The shards of ``rk`` to take up to ``n`` tokens from, fullest first, each holding a
    token at least (none: the bucket is empty as far as the probe saw), and the seconds
    until the fullest shard probed holds one. Reads PROBE shards at most, chosen at random,
    at snapshot isolation, in one round trip."""
    shards = rate.shards
    picks = list(range(shards)) if shards <= PROBE else random.sample(range(shards), PROBE)
    random.shuffle(picks)  # ties go to a random shard: takers spread over them
    shard_keys = [rk.shard(i) for i in picks]
    raws = tr.snapshot.get_many(shard_keys)
    found = [
        (key, decode_state(raw, rate, now, VERSIONS_PER_SECOND))
        for key, raw in zip(shard_keys, raws, strict=True)
    ]
    found.sort(key=lambda kt: -kt[1])  # stable: ties keep the random order
    out: list[tuple[bytes, float]] = []
    have = 0
    for key, tokens in found:
        if tokens < 1.0 or have >= n:
            break
        out.append((key, tokens))
        have += math.floor(tokens)
    return out, seconds_to_token(found[0][1], rate)
