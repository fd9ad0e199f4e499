"""A CountingDatabase that also logs what each transaction read and wrote, key by key.

``tests/counting.py`` records round trips and sizes; the hot-key measurements need more:
which keys an operation reads (snapshot reads included: they load a storage server all
the same) and writes, and how many watches a waiter makes. Only measuring: every call goes
to the wrapped engine unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fdbqueue.engines.contract import KeySelector, KeyValue
from tests.counting import CountingDatabase, CountingTransaction, _CountingReads


@dataclass
class KeyTraffic:
    """Keys and bytes one transaction attempt read and wrote."""

    keys_read: list[bytes] = field(default_factory=list)  # every key returned or asked for
    sizes_read: list[int] = field(default_factory=list)  # key + value bytes of each
    keys_written: list[bytes] = field(default_factory=list)

    @property
    def bytes_read(self) -> int:
        return sum(self.sizes_read)

    def read(self, key: bytes, value: bytes | None) -> None:
        self.keys_read.append(key)
        self.sizes_read.append(len(key) + len(value or b""))


class _LoggingReads(_CountingReads):
    def _log(self) -> KeyTraffic:
        owner: LoggingTransaction = self._owner  # type: ignore[assignment]
        return owner.traffic

    def get(self, key: bytes) -> bytes | None:
        value = super().get(key)
        self._log().read(key, value)
        return value

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        values = super().get_many(keys)
        log = self._log()
        for k, v in zip(keys, values, strict=True):
            log.read(k, v)
        return values

    def get_range(self, begin: Any, end: Any, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        rows = super().get_range(begin, end, limit, reverse)
        log = self._log()
        for k, v in rows:
            log.read(k, v)
        return rows

    def get_key(self, selector: KeySelector) -> bytes:
        key = super().get_key(selector)
        self._log().read(key, None)
        return key


class LoggingTransaction(_LoggingReads, CountingTransaction):
    def __init__(self, db: LoggingDatabase, inner: Any) -> None:
        CountingTransaction.__init__(self, db, inner)
        self.snapshot = _LoggingReads(self, inner.snapshot, True)
        self.traffic = KeyTraffic()
        db.traffic.append(self.traffic)

    def _new_attempt(self) -> None:
        super()._new_attempt()
        self.traffic = KeyTraffic()
        self.db.traffic.append(self.traffic)  # type: ignore[attr-defined]

    def _mutation(self, p1: bytes, p2: bytes, wb: bytes, we: bytes) -> None:
        super()._mutation(p1, p2, wb, we)
        self.traffic.keys_written.append(p1)

    def watch(self, key: bytes) -> Any:
        self.db.watches += 1  # type: ignore[attr-defined]
        return self._inner.watch(key)


class LoggingDatabase(CountingDatabase):
    """``traffic`` parallels ``costs`` (one entry per attempt); ``watches`` counts watches made."""

    def __init__(self, inner: Any) -> None:
        super().__init__(inner)
        self.traffic: list[KeyTraffic] = []
        self.watches = 0

    def create_transaction(self) -> LoggingTransaction:
        return LoggingTransaction(self, self.inner.create_transaction())

    def take_all(self) -> list[tuple[Any, KeyTraffic]]:
        """(cost, traffic) of every attempt so far, forgetting them."""
        out = list(zip(self.costs, self.traffic, strict=True))
        self.costs, self.traffic = [], []
        return out
