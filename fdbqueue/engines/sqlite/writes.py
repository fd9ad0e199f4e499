"""The embedded engine's write application: how a commit turns a transaction's buffered
writes into SQLite statements (:class:`WriteApplication`, a part of
:class:`~.transaction.SqliteTransaction`), and the statements it runs.

A commit takes its version and writes in one SQLite transaction (:meth:`WriteApplication._write`):
the sets of an enqueue in one multi-row ``INSERT``, SQLite's own transaction; clears, ranges and
versionstamped rows between ``BEGIN`` and ``COMMIT``. The transaction's guards, its marks and
the store lock stay in :mod:`.transaction`; this module only applies what it buffered.
"""

from __future__ import annotations

import sqlite3
import struct
from itertools import chain
from operator import itemgetter
from typing import TYPE_CHECKING

from fdbqueue.engines.contract import KEY_RANGE_REF_BYTES, MUTATION_REF_BYTES, SYSTEM_KEYS
from fdbqueue.engines.limits import KEY_SIZE_LIMIT, VALUE_SIZE_LIMIT
from fdbqueue.engines.local.mutations import make_versionstamp
from fdbqueue.engines.local.writemap import WriteMap
from fdbqueue.errors import EngineError

if TYPE_CHECKING:
    from fdbqueue.engines.local.transaction import LiveOptions
    from fdbqueue.engines.sqlite.store import Store
    from fdbqueue.engines.sqlite.versionclock import Held

IN_BATCH = 500  # keys a statement asks for at most (SQLite's bound on variables is 999 on old builds)
ONE_UP_TO = IN_BATCH // 2  # rows one INSERT writes at most (two variables a row)
UNION_UP_TO = 16  # keys read by one compound SELECT; more by one "k IN (...)"
GET_IN: dict[int, str] = {}  # SELECT ... WHERE k IN (?, ...), by the number of keys
_PUT = "INSERT OR REPLACE INTO kv (k, v) VALUES (?, ?)"
PUT_N: dict[int, str] = {}  # INSERT ... VALUES (?, ?), ... by the number of rows
_DEL = "DELETE FROM kv WHERE k = ?"
_DEL_RANGE = "DELETE FROM kv WHERE k >= ? AND k < ?"
_FIRST = itemgetter(0)
# How a stamped write is kept (``_stamped``: (at, key, value), filled at commit by
# _apply_stamped): ``at`` >= 0, a key template with the stamp at offset ``at``; ``~at`` for a
# value template's; ``_ENTRY - order`` (at most _ENTRY) a journal row's key prefix, which the
# stamp and the two bytes of ``order`` follow (set_journal_entry); _BELL a key whose value is
# the stamp. Templates' offsets lie within a key or value, far above both.
_ENTRY = -(1 << 40)
_BELL = -(1 << 39)
_SET_BYTES = MUTATION_REF_BYTES + KEY_RANGE_REF_BYTES + 1  # as LocalTransaction counts a set
_PREFIX_MAX = KEY_SIZE_LIMIT - 12  # a journal row's prefix at most: the stamp and order follow
_STAMP_AT = struct.Struct("<I").unpack_from  # a versionstamp template's offset, its last 4 bytes
_STAMPED_KEY_MAX = KEY_SIZE_LIMIT + 4  # a key template's length at most (the offset is not written)
_STAMPED_VALUE_MAX = VALUE_SIZE_LIMIT + 4


class WriteApplication:
    """The commit's write steps of :class:`~.transaction.SqliteTransaction` (a base of it: the
    fields and methods declared below are the transaction's)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _store: Store
        _cur: sqlite3.Cursor
        _sql: bool
        _all: bool
        _kept_at: int | None
        _rv: int | None
        _held: Held | None
        _values: dict[bytes, bytes | None]
        _wm: WriteMap[bytes | None] | None
        _stamped: list[tuple[int, bytes, bytes]]
        _keys: list[bytes]
        _seen: dict[bytes, bytes | None]
        _live: bool
        _size: int
        _has_writes: bool
        _dirty: bool
        _nested: bool
        _options: LiveOptions | None

        def _open_sql(self) -> None: ...
        def _reserved(self) -> int: ...
        def _fail(self, exc: sqlite3.Error) -> Exception: ...
        def _rollback(self) -> None: ...
        def _busy(self, exc: sqlite3.OperationalError) -> EngineError: ...

    def _write(self) -> tuple[int, bool]:
        """The writes, the commit version (and whether it raised meta's reservation), the
        versionstamps, COMMIT: one SQLite write transaction. A failure applies nothing and
        leaves the clock pending: the next commit re-reads meta.

        A transaction that asked SQLite nothing (no BEGIN yet: :meth:`_open_sql`) takes its
        version first, then writes: in one statement, SQLite's own transaction, when one
        holds its writes (sets only, up to a statement's rows, stamped rows among them, no
        reservation to raise: an enqueue, an ack); else BEGIN, the statements, COMMIT.

        Why this keeps every guarantee. *Serializability*: its reads came from what its
        handle's last commit kept, taken at its begin only while the lock file's version clock
        still named that commit as the store's last (``Store.take_kept``), or it read nothing;
        no other commit of any process can have come since, as the store lock is held from the
        begin and :meth:`Store.pin` (just before, under the page mutex) found it never taken
        over - only the current generation's holder commits - and the clock is asked again
        here all the same (:meth:`_kept_overtaken`). Without a snapshot SQLite has
        nothing to refuse (no ``SQLITE_BUSY_SNAPSHOT``): the pin is what refuses a holder
        that was taken over (1007), as it did when the deferred BEGIN began no snapshot
        either. *Atomicity*: one statement is atomic in SQLite (a failed one undoes all its
        rows: https://www.sqlite.org/lang_transaction.html, "autocommit"), and the version's
        reservation, when it must rise, goes in the same SQLite transaction as the rows
        (``begin`` below). *Durability*: the same WAL commit at ``synchronous=NORMAL``, then
        the same fsync after release (sync=full). *The store lock, file identity, the WAL
        record*: the same guards before (files, pin) and marks after (``after_writes``).
        A version taken before writes that then fail is a gap, as a failed COMMIT leaves:
        the page names a version no commit has, so no handle trusts kept values over it."""
        conn = self._cur
        try:
            if self._sql:
                self._apply_writes(conn)
                version, bumped = self._store.clock.next_version(conn, self._reserved, self._rv, self._held)
                if self._stamped:
                    self._apply_stamped(conn, make_versionstamp(version))
                conn.execute("COMMIT")
                return version, bumped
            kept = self._kept_at
            state = None
            if kept is not None:
                # (last commit, pending) on the clock: still the kept values' commit, none
                # pending. The same reading of the page gives the version (next_version's
                # ``state``: under the pin, nobody else writes the clock).
                state = self._store.page.clock()  # type: ignore[attr-defined]
                if state[1] != kept or state[3]:
                    raise self._kept_overtaken()
            version, bumped = self._store.clock.next_version(
                conn, self._reserved, self._rv, self._held, self._open_sql, state
            )
            values = self._values
            stamped = self._stamped
            if (
                not (stamped or self._sql or self._all)
                and 0 < len(values) <= ONE_UP_TO
                and None not in values.values()
            ):
                # Sets only (an enqueue): one INSERT, SQLite's own transaction (_apply_writes'
                # common case, without its second look at the write map)
                n = len(values)
                try:
                    conn.execute(PUT_N.get(n) or put_n(n), list(chain.from_iterable(values.items())))
                except sqlite3.OperationalError as exc:
                    if getattr(exc, "sqlite_errorcode", 0) & 0xFF != 5:  # as _apply_writes
                        raise
                    raise self._busy(exc) from exc
            elif not (stamped or self._sql or self._all) and 0 < len(values) <= ONE_UP_TO:
                # Sets and clears (a dequeue: its record cleared, its counter set): BEGIN, one
                # INSERT, the clears, COMMIT (_apply_writes' steps, without its second look
                # at the write map and _open_sql's call)
                puts: list[bytes] = []
                dels: list[tuple[bytes]] = []
                for k, v in values.items():
                    if v is None:
                        dels.append((k,))
                    else:
                        puts += (k, v)
                conn.execute("BEGIN")
                self._sql = True  # type: ignore[misc]  # (as _open_sql: a failure from here on rolls back)
                try:
                    if puts:
                        n = len(puts) // 2
                        conn.execute(PUT_N.get(n) or put_n(n), puts)
                    conn.executemany(_DEL, dels)
                except sqlite3.OperationalError as exc:
                    if getattr(exc, "sqlite_errorcode", 0) & 0xFF != 5:  # as _apply_writes
                        raise
                    raise self._busy(exc) from exc
                conn.execute("COMMIT")
            elif stamped and not (self._sql or self._all) and len(values) + len(stamped) <= ONE_UP_TO:
                # The sets and the stamped rows in one INSERT (a journaled operation's)
                self._apply_stamped(conn, make_versionstamp(version), values)
            elif self._sql or stamped or self._all or len(values) > ONE_UP_TO or None in values.values():
                if not self._sql:
                    self._open_sql()
                self._apply_writes(conn)
                if stamped:
                    self._apply_stamped(conn, make_versionstamp(version))
                conn.execute("COMMIT")
            else:
                self._apply_writes(conn)  # one statement: SQLite's own transaction
        except sqlite3.Error as exc:
            raise self._fail(exc) from exc
        return version, bumped

    def set_journal_entry(
        self,
        order: int,
        entry: bytes,
        value: bytes,
        pointer: bytes | None = None,
        pointer_value: bytes = b"",
        bell: bytes | None = None,
    ) -> None:
        """A journal entry's rows (``contract.Transaction.set_journal_entry``), kept as their
        key prefixes and filled at commit (:meth:`_apply_stamped`): the checks of
        ``LocalTransaction``'s (the same limits and codes, the same size counted as its
        templates', tested against it in tests/engines/sqlite/test_journal_entry.py) done
        inline for an entry with a pointer; anything they would refuse, a queue's own entry
        (no pointer) or a transaction not yet begun goes the generic way."""
        if (
            self._live
            and type(entry) is bytes
            and type(pointer) is bytes
            and type(value) is bytes
            and type(pointer_value) is bytes
            and type(order) is int
            and 0 <= order <= 0xFFFF
            # the two prefixes and the two values within one's limit: each is (or the generic
            # way decides)
            and (keys := len(entry) + len(pointer)) <= _PREFIX_MAX
            and (values := len(value) + len(pointer_value)) <= VALUE_SIZE_LIMIT
            # below the system keys once their templates' 0xff stamp bytes follow
            and b"" < entry < SYSTEM_KEYS
            and b"" < pointer < SYSTEM_KEYS
        ):
            # Each key's size as set_versionstamped_key counts its template (the prefix, 12
            # bytes of stamp and order, 4 of offset: 3 * len - 8), the bell's as
            # set_versionstamped_value counts its 14-byte template.
            size = 2 * _SET_BYTES + 80 + 3 * keys + values
            at = _ENTRY - order
            if bell is None:
                self._stamped += ((at, entry, value), (at, pointer, pointer_value))
            elif type(bell) is bytes and len(bell) <= KEY_SIZE_LIMIT and bell < SYSTEM_KEYS:
                self._stamped += ((at, entry, value), (at, pointer, pointer_value), (_BELL, bell, b""))
                size += _SET_BYTES + 3 * len(bell) + 14
            else:
                super().set_journal_entry(order, entry, value, pointer, pointer_value, bell)  # type: ignore[misc]
                return
            # (the transaction's fields: this base declares no slots of its own)
            self._size += size  # type: ignore[misc]
            self._has_writes = self._dirty = True  # type: ignore[misc]
            return
        super().set_journal_entry(order, entry, value, pointer, pointer_value, bell)  # type: ignore[misc]

    def _stamped_apart(self) -> bool:
        """After the commit: whether no versionstamped write landed on a key this transaction
        read or wrote otherwise (their keys, known only at commit, are ``_keys``:
        ``_apply_stamped``), so that what :meth:`_commit` keeps is what the store holds."""
        landed = self._keys
        return self._seen.keys().isdisjoint(landed) and self._values.keys().isdisjoint(landed)

    def _kept_overtaken(self) -> EngineError:
        """A commit that asked SQLite nothing found, after its pin, that the clock no longer
        names the commit whose values it took. The pin already implies it does (no holder
        but the current one commits): a check of one read of the page, which refuses as too
        old rather than write over a commit this transaction did not see."""
        self._rollback()
        return EngineError(
            1007,
            f"transaction_too_old: another transaction committed to {self._store.path} while this one "
            "held the store lock",
        )

    # -- versionstamped writes: the common case without the generic path's calls -----------------

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` with its 10 stamp bytes filled in at commit (their offset
        in ``key``'s last 4 bytes, little-endian). A journaled operation writes two or three:
        the checks of ``LocalTransaction``'s (the same limits, codes and size counted, tested
        against it in tests/engines/sqlite/test_versionstamps.py) done inline; anything they
        would refuse, or a transaction not yet begun, goes the generic way."""
        if type(key) is bytes and type(value) is bytes and self._live:
            n = len(key)
            # The offset, the stamp, and a key within the limit once its offset is gone; no
            # system key (as key[:-4] < SYSTEM_KEYS: it keeps the 10 bytes of the stamp).
            if 14 <= n <= _STAMPED_KEY_MAX and len(value) <= VALUE_SIZE_LIMIT and key < SYSTEM_KEYS:
                at = _STAMP_AT(key, n - 4)[0]
                if at + 14 <= n:
                    self._size += _SET_BYTES + 3 * n - 8 + len(value)  # type: ignore[misc]  # the mutation and its range
                    self._has_writes = self._dirty = True  # type: ignore[misc]
                    self._stamped.append((at, key, value))
                    return
        super().set_versionstamped_key(key, value)  # type: ignore[misc]

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """Write ``value`` (its stamp filled in at commit) at ``key``: as
        :meth:`set_versionstamped_key`, the common case inline."""
        if type(key) is bytes and type(value) is bytes and self._live:
            n = len(value)
            if 14 <= n <= _STAMPED_VALUE_MAX and len(key) <= KEY_SIZE_LIMIT and key < SYSTEM_KEYS:
                at = _STAMP_AT(value, n - 4)[0]
                if at + 14 <= n:
                    self._size += _SET_BYTES + 3 * len(key) + n  # type: ignore[misc]
                    self._has_writes = self._dirty = True  # type: ignore[misc]
                    self._stamped.append((~at, key, value))
                    return
        super().set_versionstamped_value(key, value)  # type: ignore[misc]

    def _versionstamped(self, kind: str, key: bytes, value: bytes) -> None:
        # Applied at commit, once the version is known. Like FDB (which raises 1036),
        # this transaction cannot read what it wrote here: it simply does not see it.
        # The caller checked the template: its offset is kept, ~offset for a value's.
        if self._nested:
            raise self._store.no_writes()
        at = _STAMP_AT(key, len(key) - 4)[0] if kind == "key" else ~_STAMP_AT(value, len(value) - 4)[0]
        self._stamped.append((at, key, value))
        self._dirty = True  # type: ignore[misc]

    def _only_volatile(self) -> bool:
        """Whether every key this transaction writes lies under a declared volatile prefix."""
        options = self._options
        if options is None or not options.volatile:
            return False
        prefixes = options.volatile
        inside = [*self._values, *(key for _, key, _ in self._stamped)]
        if not all(k.startswith(prefixes) for k in inside):
            return False
        ranges = self._wm.cleared_ranges if self._wm is not None else []
        return all(any(p <= b and e <= _end_of(p) for p in prefixes) for b, e in ranges)

    def _apply_writes(self, conn: sqlite3.Cursor) -> None:
        """Apply the buffered writes: the first one turns the read snapshot into a write
        transaction, which SQLite refuses (SQLITE_BUSY_SNAPSHOT) when another connection
        committed since the snapshot began (https://www.sqlite.org/rescode.html#busy_snapshot):
        then nothing was applied, and the commit fails with 1020 not_committed."""
        values = self._values
        try:
            if values or self._all:
                if self._all:  # ranges are cleared only through _clear_range, which sets it (and the map)
                    for begin, end in self._wm.cleared_ranges:  # type: ignore[union-attr]
                        conn.execute(_DEL_RANGE, (begin, end))
                puts: list[bytes] = []
                dels: list[tuple[bytes]] = []
                if None in values.values():
                    for k, v in values.items():
                        if v is None:
                            dels.append((k,))  # executemany's rows, made here: no second pass
                        else:
                            puts += (k, v)
                else:  # sets only (an enqueue): the pairs flattened in C
                    # (values None only where "None in values" said; mypy cannot know)
                    puts = list(chain.from_iterable(values.items()))  # type: ignore[arg-type]
                # One statement for all the rows (up to the variable bound), not one stepped
                # per row: fewer instructions per enqueue (scripts/count_instructions.py).
                if len(puts) <= IN_BATCH:  # the common case: one INSERT, no slices
                    if puts:
                        n = len(puts) // 2
                        conn.execute(PUT_N.get(n) or put_n(n), puts)
                else:
                    for lo in range(0, len(puts), IN_BATCH):
                        part = puts[lo : lo + IN_BATCH]
                        conn.execute(put_n(len(part) // 2), part)
                if dels:
                    # One statement stepped per key: "k IN (...)" would build SQLite a
                    # temporary index of the list first (more instructions, measured), and
                    # so does "k = ? OR k = ?" (SQLite makes it an IN); one statement that
                    # both writes and deletes (an INSTEAD OF trigger on a view) costs more
                    # than BEGIN and COMMIT around the two (docs/performance.md, issue 30
                    # fourth pass, "lease + ack to 700k").
                    conn.executemany(_DEL, dels)
            else:  # a write conflict range or versionstamps only: the version still needs the write lock
                conn.execute("UPDATE meta SET value = value WHERE name = 'version'")
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != 5:  # SQLITE_BUSY and its extended codes
                raise
            raise self._busy(exc) from exc

    def _apply_stamped(
        self, conn: sqlite3.Cursor, stamp: bytes, sets: dict[bytes, bytes | None] | None = None
    ) -> None:
        """The stamped writes, each template filled with this commit's one stamp at the offset
        kept when it was written (checked then: inside the template), in one statement.

        With ``sets`` (the write map's values, no range cleared, the rows of both within one
        statement's bound; from :meth:`_write` when it took its version before any statement):
        the sets and the stamped rows in one multi-row ``INSERT``. Sets only (a journaled
        enqueue after its handle's own commit) is that one statement, SQLite's own transaction,
        which applies all its rows or none (https://www.sqlite.org/lang_transaction.html,
        "autocommit"); with clears (a dequeue, a lease, an ack) BEGIN, the clears, the INSERT,
        COMMIT. The stamped rows come after every other write, as when they had a statement of
        their own: ``INSERT OR REPLACE`` takes its rows in order, so a stamped key that fills
        to a key set or cleared in the transaction wins."""
        tail = stamp + b"\x00\x00"  # a journal row's of order 0 (most)
        rows = [
            (key + tail if at == _ENTRY else key + stamp + (_ENTRY - at).to_bytes(2, "big"), value)
            if at <= _ENTRY
            else (key, stamp)
            if at == _BELL
            else (key[:at] + stamp + key[at + 10 : -4], value)
            if at >= 0
            else (key, value[:~at] + stamp + value[~at + 10 : -4])
            for at, key, value in self._stamped
        ]
        self._keys += map(_FIRST, rows)
        if sets is None:
            conn.executemany(_PUT, rows)  # one statement for all (a journaled commit has three or more)
            return
        try:
            if None in sets.values():  # clears too (a dequeue, a lease, an ack): BEGIN .. COMMIT
                self._open_sql()
                dels: list[tuple[bytes]] = []
                puts: list[bytes | None] = []
                for k, v in sets.items():  # one pass: the clears' rows and the sets' pairs
                    if v is None:
                        dels.append((k,))
                    else:
                        puts += (k, v)
                # The clears first: a stamped key that fills to a key cleared wins, as when
                # the stamped rows are applied after every other write.
                conn.executemany(_DEL, dels)
                puts += chain.from_iterable(rows)
                self._put_rows(conn, puts)
                conn.execute("COMMIT")
            else:  # sets only (an enqueue): one statement, SQLite's own transaction
                puts = list(chain.from_iterable(sets.items()))
                puts += chain.from_iterable(rows)
                self._put_rows(conn, puts)
        except sqlite3.OperationalError as exc:
            if getattr(exc, "sqlite_errorcode", 0) & 0xFF != 5:  # as _apply_writes: SQLITE_BUSY is 1020
                raise
            raise self._busy(exc) from exc

    @staticmethod
    def _put_rows(conn: sqlite3.Cursor, puts: list[bytes | None]) -> None:
        """``puts`` (key, value, key, value, ...: at most ONE_UP_TO rows, no value None) in
        one INSERT."""
        n = len(puts) // 2
        conn.execute(PUT_N.get(n) or put_n(n), puts)


def _end_of(prefix: bytes) -> bytes:
    """The end of the range of keys starting with ``prefix`` (FoundationDB's strinc)."""
    stripped = prefix.rstrip(b"\xff")
    return stripped[:-1] + bytes((stripped[-1] + 1,)) if stripped else b"\xff"


def put_n(n: int) -> str:
    """The statement that writes ``n`` rows (made once for each ``n``)."""
    sql = PUT_N.get(n)
    if sql is None:
        sql = PUT_N[n] = "INSERT OR REPLACE INTO kv (k, v) VALUES " + ",".join(["(?,?)"] * n)
    return sql


def get_in(n: int) -> str:
    """The statement that reads ``n`` keys' rows: for a few keys (an operation's metadata and
    counters), one point lookup each joined by UNION ALL, since "k IN (...)" first builds
    SQLite a temporary index of the list (about 40 % more instructions for six keys,
    measured); for more, "k IN (...)", whose index then pays for itself."""
    if n <= UNION_UP_TO:
        return " UNION ALL ".join(["SELECT k, v FROM kv WHERE k = ?"] * n)
    return f"SELECT k, v FROM kv WHERE k IN ({','.join('?' * n)})"
