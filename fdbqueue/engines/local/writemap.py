"""A transaction's buffered writes, read through: the read-your-writes overlay.

A transaction that reads from a snapshot and applies its writes only at commit must still
see its own writes (FoundationDB's ReadYourWritesTransaction, fdbclient/ReadYourWrites.cpp):
a get, a range read (forward or reverse, with a limit) and a key selector answer from the
snapshot overlaid with what this transaction set, cleared and cleared by range.
Versionstamped keys are not kept here (they are known only at commit).

Both in-process engines keep their writes here. The embedded engine resolves atomic ops
against :meth:`WriteMap.get` at the time of the op, so each of its entries is a plain value
or a deletion (None). The sim engine keeps what FoundationDB's own WriteMap keeps per key
(``fdbclient/include/fdbclient/WriteMap.h``): a value, or atomic ops over the stored value, or
a versionstamped value; it gives a ``decide(key, entry)`` that says what a read of such an
entry sees.

The snapshot is given as a function ``base(begin, end, limit, reverse)`` returning up to
``limit`` (0: all) stored pairs of [begin, end) in order; the overlay asks it for more
only when its own clears hid some of what it returned. Not thread-safe: one transaction's.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from sortedcontainers import SortedList

from fdbqueue.engines.contract import SYSTEM_KEYS, KeySelector, KeyValue

Base = Callable[[bytes, bytes, int, bool], list[KeyValue]]
_CHUNK = 64  # the first batch asked of the snapshot when the overlay may hide rows

V = TypeVar("V")


class WriteMap(Generic[V]):
    """Sets and clears of one transaction, in the order they apply at commit.

    ``WriteMap()`` holds plain values (None: cleared); ``WriteMap(decide)`` holds an engine's
    own entries, which ``decide(key, entry)`` turns into what a read sees (None: absent).
    """

    __slots__ = ("_cb", "_ce", "_sorted", "decide", "values")

    @overload
    def __init__(self: WriteMap[bytes | None]) -> None: ...
    @overload
    def __init__(self, decide: Callable[[bytes, V], bytes | None]) -> None: ...

    def __init__(self, decide: Callable[[bytes, V], bytes | None] | None = None) -> None:
        #: key -> entry (a value, or None for a cleared key); applied after the cleared ranges.
        self.values: dict[bytes, V] = {}
        self.decide = decide
        self._sorted: SortedList | None = None  # keys of values, built at the first range read
        self._cb: list[bytes] = []  # cleared ranges: sorted, disjoint begins ...
        self._ce: list[bytes] = []  # ... and their ends

    def __bool__(self) -> bool:
        return bool(self.values or self._cb)

    @property
    def cleared_ranges(self) -> list[tuple[bytes, bytes]]:
        """The cleared ranges, sorted and disjoint: apply them before :attr:`values`."""
        return list(zip(self._cb, self._ce, strict=True))

    # -- writes ----------------------------------------------------------------------------------

    def set(self, key: bytes, value: V) -> None:
        """Write ``value`` at ``key`` (None clears it)."""
        if self._sorted is not None and key not in self.values:
            self._sorted.add(key)
        self.values[key] = value

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Clear [begin, end): earlier writes inside it are dropped, the range is merged."""
        if begin >= end:
            return
        keys = self._keys()
        for k in list(keys.irange(begin, end, (True, False))):
            del self.values[k]
            keys.remove(k)
        # Merge with every overlapping or touching cleared range.
        i = bisect_left(self._ce, begin)  # the first range ending at or after begin
        j = bisect_right(self._cb, end)  # past the last range beginning at or before end
        if i < j:
            begin = min(begin, self._cb[i])
            end = max(end, self._ce[j - 1])
        self._cb[i:j] = [begin]
        self._ce[i:j] = [end]

    # -- reads -----------------------------------------------------------------------------------

    def _keys(self) -> SortedList:
        if self._sorted is None:
            self._sorted = SortedList(self.values)
        return self._sorted

    def cleared(self, key: bytes) -> bool:
        """Whether ``key`` lies in a range this transaction cleared."""
        i = bisect_right(self._cb, key) - 1
        return i >= 0 and key < self._ce[i]

    def get(self, key: bytes) -> tuple[bool, V | None]:
        """(True, entry or None) when this map decides ``key``; (False, None) to read the snapshot."""
        if key in self.values:
            return True, self.values[key]
        if self._cb and self.cleared(key):
            return True, None
        return False, None

    def keys_in(self, begin: bytes, end: bytes) -> Iterator[bytes]:
        """The keys of :attr:`values` in [begin, end), in order."""
        return self._keys().irange(begin, end, (True, False))  # type: ignore[no-any-return]

    def cleared_in(self, begin: bytes, end: bytes) -> Iterator[tuple[bytes, bytes]]:
        """The cleared ranges that overlap [begin, end), in order."""
        cb, ce = self._cb, self._ce
        i = bisect_right(ce, begin)
        while i < len(cb) and cb[i] < end:
            yield cb[i], ce[i]
            i += 1

    def touches(self, begin: bytes, end: bytes) -> bool:
        """Whether a read of [begin, end) may differ from the snapshot's."""
        if self._cb:
            # The ranges are disjoint and sorted: only the last one beginning before end
            # can reach past begin.
            i = bisect_left(self._cb, end)
            if i and self._ce[i - 1] > begin:
                return True
        if not self.values:
            return False
        return any(True for _ in self._keys().irange(begin, end, (True, False)))

    def get_range(self, base: Base, begin: bytes, end: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        """Present pairs of [begin, end) in order, at most ``limit`` (0: all), with own writes."""
        if not self.touches(begin, end):
            return base(begin, end, limit, reverse)
        out: list[KeyValue] = []
        values, decide = self.values, self.decide
        mine = self._keys().irange(begin, end, (True, False), reverse)
        stored = self._stored(base, begin, end, limit, reverse)
        a = next(mine, None)
        b = next(stored, None)
        while a is not None or b is not None:
            if b is None or (a is not None and (a > b.key if reverse else a < b.key)):
                assert a is not None
                # Without decide, V is bytes | None (the overloads of __init__).
                value = values[a] if decide is None else decide(a, values[a])
                if value is not None:
                    out.append(KeyValue(a, value))  # type: ignore[arg-type]
                a = next(mine, None)
            else:
                if a is not None and a == b.key:  # this transaction's write decides
                    value = values[a] if decide is None else decide(a, values[a])
                    if value is not None:
                        out.append(KeyValue(a, value))  # type: ignore[arg-type]
                    a = next(mine, None)
                else:
                    out.append(b)
                b = next(stored, None)
            if limit and len(out) >= limit:
                break
        return out

    def _stored(self, base: Base, begin: bytes, end: bytes, limit: int, reverse: bool) -> Iterator[KeyValue]:
        """The snapshot's pairs of [begin, end) not cleared by this map, fetched in growing batches."""
        want = max(limit, _CHUNK) if limit else 0
        lo, hi = begin, end
        while lo < hi:
            rows = base(lo, hi, want, reverse)
            for kv in rows:
                if not (self._cb and self.cleared(kv.key)):
                    yield kv
            if not want or len(rows) < want:
                return
            if reverse:
                hi = rows[-1].key
            else:
                lo = rows[-1].key + b"\x00"
            want = min(want * 4, 4096)

    def resolve(self, base: Base, selector: KeySelector) -> bytes:
        """The key ``selector`` resolves to over the merged view (b'' or b'\\xff' past either end)."""
        key, or_equal, offset = selector
        if offset >= 1:
            rows = self.get_range(base, key + b"\x00" if or_equal else key, SYSTEM_KEYS, offset, False)
            return rows[offset - 1].key if len(rows) == offset else SYSTEM_KEYS
        rows = self.get_range(base, b"", key + b"\x00" if or_equal else key, 1 - offset, True)
        return rows[-offset].key if len(rows) > -offset else b""
