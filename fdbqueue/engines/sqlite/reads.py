"""The embedded engine's reads (:class:`StoredReads`, a base of
:class:`~.transaction.SqliteTransaction`): a key, several keys, a key selector or a range,
each answered by the first that knows it: the transaction's own buffered writes (the write
map), the values it has read already, the values its handle's last commit wrote (while that is
still the store's last commit: ``Store.take_kept``), and only then SQLite, whose statements
are here.

Apart from :mod:`.transaction`, which holds what the reads rely on (the store lock taken at
the begin, ``BEGIN`` before the first statement) and the buffered writes and the commit.
"""

from __future__ import annotations

import sqlite3
from itertools import repeat
from typing import TYPE_CHECKING

from fdbqueue.engines.contract import SYSTEM_KEYS, KeySelector, KeyValue
from fdbqueue.engines.sqlite.writes import GET_IN, IN_BATCH, get_in
from fdbqueue.errors import EngineError

if TYPE_CHECKING:
    from fdbqueue.engines.local.writemap import WriteMap
    from fdbqueue.engines.sqlite.store import Store

_GET = "SELECT v FROM kv WHERE k = ?"
_RANGE = (
    "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k LIMIT ?",
    "SELECT k, v FROM kv WHERE k >= ? AND k < ? ORDER BY k DESC LIMIT ?",
)
# Key selectors, indexed by or_equal: the n-th key after, or before, the anchor.
_AFTER = (
    "SELECT k FROM kv WHERE k >= ? ORDER BY k LIMIT 1 OFFSET ?",
    "SELECT k FROM kv WHERE k > ? ORDER BY k LIMIT 1 OFFSET ?",
)
_BEFORE = (
    "SELECT k FROM kv WHERE k < ? ORDER BY k DESC LIMIT 1 OFFSET ?",
    "SELECT k FROM kv WHERE k <= ? ORDER BY k DESC LIMIT 1 OFFSET ?",
)


class StoredReads:
    """The storage primitives of :class:`~.transaction.SqliteTransaction` that read (a base of
    it: the fields and methods declared below are the transaction's)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _store: Store
        _cur: sqlite3.Cursor
        _sql: bool
        _all: bool
        _kept_at: int | None
        _values: dict[bytes, bytes | None]
        _seen: dict[bytes, bytes | None]
        _wrote: dict[bytes, bytes | None]

        def _map(self) -> WriteMap[bytes | None]: ...
        def _open_sql(self) -> None: ...
        def _fail(self, exc: sqlite3.Error) -> Exception: ...
        def _abort(self, code: int) -> None: ...

    def _check_kept(self) -> None:
        """After the first statement that read the store, in a transaction that began with kept
        values: SQLite's snapshot began at that statement, not at BEGIN, so it matches the kept
        values only while the store's last commit is still theirs. A holder that sat on the
        store lock past the window can have been taken over and another commit made meanwhile:
        then the two would mix two versions in one transaction's reads, which a FoundationDB
        transaction (its reads at one read version) never sees; refused as too old (1007), as
        its commit's pin would refuse it."""
        version, self._kept_at = self._kept_at, None  # type: ignore[misc]  # the transaction's field
        _, last, _, pending, _ = self._store.page.clock()  # type: ignore[attr-defined]
        if last != version or pending:
            self._abort(1007)
            raise EngineError(
                1007,
                f"transaction_too_old: another transaction committed to {self._store.path} while this one "
                "held the store lock past the 5-second window",
            )

    def _get(self, key: bytes, snapshot: bool) -> bytes | None:
        values = self._values
        if key in values:  # WriteMap.get's steps: this transaction's writes decide first
            return values[key]
        if self._all and self._map().cleared(key):
            return None
        seen = self._seen
        if key in seen:
            return seen[key]
        wrote = self._wrote
        if key in wrote:  # written by this handle's last commit, the store's last
            value = seen[key] = wrote[key]
            return value
        try:
            if not self._sql:
                self._open_sql()
            row = self._cur.execute(_GET, (key,)).fetchone()
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        if self._kept_at is not None:
            self._check_kept()
        value = None if row is None else row[0]
        seen[key] = value
        return value

    def _get_many(self, keys: list[bytes], snapshot: bool) -> dict[bytes, bytes | None]:
        """One statement for the keys the write map does not decide, not one a key: the
        statements of an operation's reads, not their rows, are what it pays for."""
        out: dict[bytes, bytes | None] = {}
        ask: list[bytes] = []
        values, seen = self._values, self._seen
        cleared = self._map().cleared if self._all else None
        for key in dict.fromkeys(keys):
            if key in values:  # WriteMap.get's steps, as in _get
                out[key] = values[key]
                continue
            if cleared is not None and cleared(key):
                out[key] = None
                continue
            if key in seen:
                out[key] = seen[key]
                continue
            ask.append(key)
        if ask:
            self._select(ask)
            for key in ask:
                out[key] = seen[key]
        return out

    def _select(self, ask: list[bytes]) -> None:
        """Read the stored values of ``ask`` (distinct keys) into :attr:`_seen` (None: absent)."""
        seen = self._seen
        wrote = self._wrote
        if wrote:  # written by this handle's last commit, the store's last: not asked
            found = {k: wrote[k] for k in ask if k in wrote}
            if found:
                seen.update(found)
                ask = [k for k in ask if k not in found]
                if not ask:
                    return
        seen.update(dict.fromkeys(ask))  # None: absent, unless a row says otherwise
        try:
            if not self._sql:
                self._open_sql()
            if len(ask) <= IN_BATCH:  # the common case: one statement, no slices
                n = len(ask)
                seen.update(self._cur.execute(GET_IN.get(n) or GET_IN.setdefault(n, get_in(n)), ask))
            else:
                for lo in range(0, len(ask), IN_BATCH):
                    part = ask[lo : lo + IN_BATCH]
                    sql = GET_IN.get(len(part)) or GET_IN.setdefault(len(part), get_in(len(part)))
                    seen.update(self._cur.execute(sql, part))  # (k, v) rows
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        if self._kept_at is not None:
            self._check_kept()

    def _resolve(self, selector: KeySelector, snapshot: bool) -> bytes:
        if self._values or self._all:  # the write map's __bool__, without a Python call
            return self._map().resolve(self._stored, selector)
        key, or_equal, offset = selector
        try:
            if not self._sql:
                self._open_sql()
            if offset >= 1:
                row = self._cur.execute(_AFTER[or_equal], (key, offset - 1)).fetchone()
            else:
                row = self._cur.execute(_BEFORE[or_equal], (key, -offset)).fetchone()
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        if self._kept_at is not None:
            self._check_kept()
        if offset >= 1:
            return row[0] if row else SYSTEM_KEYS
        return row[0] if row else b""

    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        if self._values or self._all:  # the write map's __bool__, without a Python call
            return self._map().get_range(self._stored, begin, end, limit, reverse)
        return self._stored(begin, end, limit, reverse)

    def _stored(self, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        """The snapshot's pairs of [begin, end), without this transaction's writes."""
        try:
            if not self._sql:
                self._open_sql()
            rows = self._cur.execute(_RANGE[reverse], (begin, end, limit or -1)).fetchall()
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        if self._kept_at is not None:
            self._check_kept()
        # tuple.__new__ straight from C: KeyValue._make would run Python code for every row.
        return list(map(tuple.__new__, repeat(KeyValue, len(rows)), rows))
