"""``tr.snapshot`` of the in-process engines: a transaction's reads without read conflicts."""

from __future__ import annotations

from typing import Protocol

from fdbqueue.engines.checks import check_bytes, strinc
from fdbqueue.engines.contract import SYSTEM_KEYS, KeyOrSelector, KeySelector, KeyValue


class _Reads(Protocol):
    """What a view reads through (``LocalTransaction``'s read steps)."""

    def _read_get(self, key: bytes, snapshot: bool) -> bytes | None: ...
    def _read_key(self, selector: KeySelector, snapshot: bool) -> bytes: ...
    def _read_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]: ...
    def _read_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]: ...


class Snapshot:
    """``tr.snapshot``: the same reads without read conflicts; still sees the transaction's writes."""

    __slots__ = ("_tr",)

    def __init__(self, tr: _Reads) -> None:
        self._tr = tr

    def get(self, key: bytes) -> bytes | None:
        return self._tr._read_get(key, True)

    def __getitem__(self, key: bytes) -> bytes | None:
        return self._tr._read_get(key, True)

    def get_key(self, selector: KeySelector) -> bytes:
        return self._tr._read_key(selector, True)

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        return self._tr._read_range(begin, end, limit, reverse, True)

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        p = check_bytes("prefix", prefix)
        return self._tr._read_range(p, strinc(p) if p else SYSTEM_KEYS, limit, reverse, True)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        return self._tr._read_many(keys, True)
