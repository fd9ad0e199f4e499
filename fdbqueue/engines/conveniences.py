"""FoundationDB's Database convenience calls (``db[key]``, ``db.get_range`` ...), each its own
retried, committed transaction through the engine contract's :func:`run_transaction`: mixed
into every engine's Database."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from fdbqueue.engines.contract import KeyOrSelector, KeyValue, Transaction, Watch
from fdbqueue.engines.transactional import run_transaction

T = TypeVar("T")


class DatabaseConveniences:
    """FoundationDB's Database convenience calls: each is its own retried, committed transaction.

    Mixed into every engine's Database (it needs only ``create_transaction``).
    """

    __slots__ = ()
    principal: str = "anonymous"  # the layer's, set by open_database (see Database.principal)

    def get(self, key: bytes) -> bytes | None:
        return _db_call(self, lambda tr: tr.get(key))

    def __getitem__(self, key: bytes) -> bytes | None:
        return self.get(key)

    def set(self, key: bytes, value: bytes) -> None:
        _db_call(self, lambda tr: tr.set(key, value))

    __setitem__ = set

    def clear(self, key: bytes) -> None:
        _db_call(self, lambda tr: tr.clear(key))

    __delitem__ = clear

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        return _db_call(self, lambda tr: tr.get_range(begin, end, limit, reverse))

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        return _db_call(self, lambda tr: tr.get_range_startswith(prefix, limit, reverse))

    def clear_range(self, begin: bytes, end: bytes) -> None:
        _db_call(self, lambda tr: tr.clear_range(begin, end))

    def get_and_watch(self, key: bytes) -> tuple[bytes | None, Watch]:
        """The value of ``key`` and a watch armed from that value (one committed transaction)."""
        return _db_call(self, lambda tr: (tr.get(key), tr.watch(key)))


def _db_call(db: Any, body: Callable[[Transaction], T]) -> T:
    # The conveniences live in a mixin, which the type checker cannot see as a Database.
    return run_transaction(db, body)
