"""Database wrappers that measure what each transaction would cost on FoundationDB.

``CountingDatabase(inner)`` wraps any engine's database. Every attempt of every transaction
it creates is recorded as a :class:`TxnCost`:

* ``size``: the transaction's size as FoundationDB counts it at commit
  (``Transaction::getSize`` in ``fdbclient/NativeAPI.actor.cpp`` is
  ``CommitTransactionRef::expectedSize`` in ``fdbclient/include/fdbclient/CommitTransaction.h``:
  every mutation's ``param1 + param2`` bytes, plus the begin + end bytes of every read and
  write conflict range, plus, per element, the ``sizeof`` that ``VectorRef::expectedSize``
  adds in ``flow/include/flow/Arena.h``: 56 bytes a ``MutationRef`` (7.3 and later; 40
  before) and 32 a ``KeyRangeRef``). Conflict ranges are coalesced as the RYW layer does
  before commit; mutations are not (an upper bound where a key is written twice), and read
  conflicts are counted for every serializable read (an upper bound: the RYW layer leaves
  out keys the transaction wrote itself). FoundationDB refuses more than 10,000,000 bytes
  (2101) and advises staying under 1 MB.
* ``reads``: sequential read round trips: one per read call (``get``, ``get_key``,
  ``get_range``, and ``get_many`` where the engine has it: one for all its keys), plus one per
  further ``REPLY_BYTE_LIMIT`` (80,000 bytes, ``fdbclient/ClientKnobs.cpp``) of a range read's
  result, which the client fetches in batches.
* ``grv``: 1 when the attempt needed a read version (its first read, or
  ``get_read_version``); ``commit``: 1 when it committed mutations (a read-only commit is local).

``LoggingDatabase(inner)`` counts the same and also logs, key by key, what each attempt read
(snapshot reads included: they load a storage server all the same) and wrote, and how many
watches a waiter makes, as a :class:`KeyTraffic`: the hot-key measurements.

Only measuring: every call goes to the wrapped engine unchanged, so results are the engine's.
Used by the budget and round-trip tests and by scripts/bench_fdb_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from fdbqueue.engines.contract import KeySelector, KeyValue, register_transaction_type

REPLY_BYTE_LIMIT = 80_000
SIZE_LIMIT = 10_000_000
MUTATION_REF_BYTES = 56  # sizeof(MutationRef), flow/include/flow/Arena.h VectorRef::expectedSize
KEY_RANGE_REF_BYTES = 32  # sizeof(KeyRangeRef)


@dataclass
class TxnCost:
    """One attempt of one transaction."""

    mutations: int = 0  # bytes of mutations (param1 + param2 + sizeof(MutationRef) each)
    reads: int = 0  # sequential read round trips
    grv: int = 0
    commit: int = 0
    committed: bool = False
    error: int | None = None  # the code it ended with, if it failed
    read_ranges: list[tuple[bytes, bytes]] = field(default_factory=list)
    write_ranges: list[tuple[bytes, bytes]] = field(default_factory=list)

    @property
    def size(self) -> int:
        """Bytes as FoundationDB counts them at commit."""
        return self.mutations + _ranges_size(self.read_ranges) + _ranges_size(self.write_ranges)

    @property
    def round_trips(self) -> int:
        """Sequential round trips: read version, reads, commit."""
        return self.grv + self.reads + self.commit


def _ranges_size(ranges: list[tuple[bytes, bytes]]) -> int:
    total = 0
    cur_b: bytes | None = None
    cur_e = b""
    for b, e in sorted(ranges):
        if cur_b is not None and b <= cur_e:
            cur_e = max(cur_e, e)
            continue
        if cur_b is not None:
            total += KEY_RANGE_REF_BYTES + len(cur_b) + len(cur_e)
        cur_b, cur_e = b, e
    if cur_b is not None:
        total += KEY_RANGE_REF_BYTES + len(cur_b) + len(cur_e)
    return total


def _after(key: bytes) -> bytes:
    return key + b"\x00"


class _CountingReads:
    """Reads through ``inner`` (a transaction or its snapshot), counted into ``owner``'s cost."""

    def __init__(self, owner: CountingTransaction, inner: Any, snapshot: bool) -> None:
        self._owner = owner
        self._inner = inner
        self._snapshot = snapshot

    def _read(self, ranges: list[tuple[bytes, bytes]], trips: int = 1) -> None:
        cost = self._owner.cost
        cost.grv = 1
        cost.reads += trips
        if not self._snapshot:
            cost.read_ranges.extend(ranges)

    def get(self, key: bytes) -> bytes | None:
        value = self._inner.get(key)
        self._read([(key, _after(key))])
        return value  # type: ignore[no-any-return]

    def __getitem__(self, key: bytes) -> bytes | None:
        return self.get(key)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        values = self._inner.get_many(keys)
        self._read([(k, _after(k)) for k in keys])
        return values  # type: ignore[no-any-return]

    def get_key(self, selector: KeySelector) -> bytes:
        key: bytes = self._inner.get_key(selector)
        lo, hi = sorted((selector.key, key))
        self._read([(lo, _after(hi))])
        return key

    def get_range(self, begin: Any, end: Any, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        rows: list[KeyValue] = self._inner.get_range(begin, end, limit, reverse)
        b = begin.key if isinstance(begin, KeySelector) else begin
        e = end.key if isinstance(end, KeySelector) else end
        if limit and len(rows) == limit:  # only the part read conflicts
            if reverse:
                b = rows[-1].key
            else:
                e = _after(rows[-1].key)
        returned = sum(len(k) + len(v) for k, v in rows)
        self._read([(b, e)], 1 + returned // REPLY_BYTE_LIMIT)
        return rows

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        from fdbqueue.engines.checks import strinc

        return self.get_range(prefix, strinc(prefix) if prefix else b"\xff", limit, reverse)


class CountingTransaction(_CountingReads):
    """A transaction of the wrapped engine, each attempt's cost recorded on the database."""

    def __init__(self, db: CountingDatabase, inner: Any) -> None:
        super().__init__(self, inner, False)
        self.db = db
        self.snapshot = _CountingReads(self, inner.snapshot, True)
        self.cost = TxnCost()
        db.costs.append(self.cost)

    def _new_attempt(self) -> None:
        self.cost = TxnCost()
        self.db.costs.append(self.cost)

    @property
    def options(self) -> Any:
        return self._inner.options

    # -- writes ------------------------------------------------------------------------------
    def _mutation(self, p1: bytes, p2: bytes, wb: bytes, we: bytes) -> None:
        self.cost.mutations += MUTATION_REF_BYTES + len(p1) + len(p2)
        self.cost.write_ranges.append((wb, we))

    def set(self, key: bytes, value: bytes) -> None:
        self._inner.set(key, value)
        self._mutation(key, value, key, _after(key))

    __setitem__ = set

    def clear(self, key: bytes) -> None:
        self._inner.clear(key)
        # FoundationDB sends a point clear as ClearRange [key, keyAfter(key)).
        self._mutation(key, _after(key), key, _after(key))

    __delitem__ = clear

    def clear_range(self, begin: bytes, end: bytes) -> None:
        self._inner.clear_range(begin, end)
        self._mutation(begin, end, begin, end)

    def clear_range_startswith(self, prefix: bytes) -> None:
        from fdbqueue.engines.checks import strinc

        self.clear_range(prefix, strinc(prefix) if prefix else b"\xff")

    def set_journal_entry(
        self,
        order: int,
        entry: bytes,
        value: bytes,
        pointer: bytes | None = None,
        pointer_value: bytes = b"",
        bell: bytes | None = None,
    ) -> None:
        """The mutations FoundationDB gets for a journal entry: its templates' (the engine's
        ``set_journal_entry`` writes the same rows), each measured as its own call."""
        from fdbqueue.engines.checks import journal_templates
        from fdbqueue.engines.contract import BELL_TEMPLATE

        key, pointer_key = journal_templates(order, entry, value, pointer, pointer_value, bell)
        self.set_versionstamped_key(key, value)
        if pointer_key is not None:
            self.set_versionstamped_key(pointer_key, pointer_value)
        if bell is not None:
            self.set_versionstamped_value(bell, BELL_TEMPLATE)

    def __getattr__(self, name: str) -> Any:
        # Atomic ops and versionstamped writes: one mutation of key + param each.
        atomic = getattr(self._inner, name)
        if name in {
            "add",
            "max",
            "min",
            "byte_max",
            "byte_min",
            "bit_and",
            "bit_or",
            "bit_xor",
            "compare_and_clear",
            "append_if_fits",
            "set_versionstamped_key",
            "set_versionstamped_value",
        }:

            def op(key: bytes, param: bytes) -> None:
                atomic(key, param)
                self._mutation(key, param, key, _after(key))

            return op
        return atomic

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._inner.add_read_conflict_range(begin, end)
        self.cost.read_ranges.append((begin, end))

    def add_read_conflict_key(self, key: bytes) -> None:
        self._inner.add_read_conflict_key(key)
        self.cost.read_ranges.append((key, _after(key)))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        self._inner.add_write_conflict_range(begin, end)
        self.cost.write_ranges.append((begin, end))

    def add_write_conflict_key(self, key: bytes) -> None:
        self._inner.add_write_conflict_key(key)
        self.cost.write_ranges.append((key, _after(key)))

    def get_read_version(self) -> int:
        self.cost.grv = 1
        return int(self._inner.get_read_version())

    # -- life cycle --------------------------------------------------------------------------
    def commit(self) -> None:
        cost = self.cost
        if cost.mutations or cost.write_ranges:
            cost.commit = 1
        try:
            self._inner.commit()
        except Exception as exc:
            cost.error = int(getattr(exc, "code", -1))
            raise
        cost.committed = True

    def on_error(self, error: BaseException) -> None:
        if self.cost.error is None:
            self.cost.error = int(getattr(error, "code", -1))
        self._inner.on_error(error)
        self._new_attempt()

    def reset(self) -> None:
        self._inner.reset()
        self._new_attempt()


register_transaction_type(CountingTransaction)


class CountingDatabase:
    """Wraps ``inner``; ``costs`` lists every attempt of every transaction, in creation order."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.url = inner.url
        self.engine = inner.engine
        self.costs: list[TxnCost] = []

    def create_transaction(self) -> CountingTransaction:
        return CountingTransaction(self, self.inner.create_transaction())

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # may_conflict, clock, sleep, ...

    def close(self) -> None:
        self.inner.close()

    def take(self) -> list[TxnCost]:
        """The costs recorded so far, forgetting them."""
        out, self.costs = self.costs, []
        return out


# -- key by key ------------------------------------------------------------------------------------


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
