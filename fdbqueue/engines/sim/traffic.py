"""Counting a sim database's traffic: what ``fdbqueue.testing.traffic`` reports.

A :class:`TrafficCounter` attached to a :class:`~fdbqueue.engines.sim.store.SimStore`
(``attach_counter``) is told, under the store lock, of every attempt that begins (its first
read, write or conflict range), every commit that applies mutations and which keys they
touch, and every commit that fails with not_committed (1020). On a cluster, a key is
served by one storage team: the keys written by a large share of commits are the load
one team must carry alone (FoundationDB's developer guide, "Avoid hot keys"; its known
limitations: a key modified more than 10-100 times a second).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from types import MappingProxyType


class TrafficCounter:
    """Per-key committed writes, commits, attempts and conflicts, counted while attached.

    Thread-safe: the store calls it under its lock; readers take their own lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._writes: Counter[bytes] = Counter()
        self.commits = 0
        self.transactions = 0
        self.conflicts = 0

    # -- what the store tells it -----------------------------------------------------------

    def began(self) -> None:
        with self._lock:
            self.transactions += 1

    def committed(self, keys: Iterable[bytes]) -> None:
        """One commit that applied mutations to ``keys`` (each counted once per commit)."""
        with self._lock:
            self._writes.update(set(keys))
            self.commits += 1

    def conflicted(self) -> None:
        with self._lock:
            self.conflicts += 1

    # -- what a test reads ---------------------------------------------------------------

    @property
    def writes(self) -> Mapping[bytes, int]:
        """Committed mutations per key (a copy, read-only)."""
        with self._lock:
            return MappingProxyType(dict(self._writes))

    def hottest(self, n: int = 10) -> list[tuple[bytes, int]]:
        """The ``n`` most written keys, most written first (ties: in key order)."""
        if isinstance(n, bool) or not isinstance(n, int):
            raise TypeError(f"hottest(n) takes a number of keys (an int), not {n!r}")
        if n < 0:
            raise ValueError(f"hottest(n) takes a number of keys >= 0, not {n}")
        with self._lock:
            items = list(self._writes.items())
        items.sort(key=lambda kv: (-kv[1], kv[0]))
        return items[:n]

    def __repr__(self) -> str:
        return (
            f"TrafficCounter(transactions={self.transactions}, commits={self.commits}, "
            f"conflicts={self.conflicts}, keys={len(self._writes)})"
        )
