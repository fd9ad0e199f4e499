"""A local transaction's reads and writes (:class:`ReadsAndWrites`, a base of
:class:`~.transaction.LocalTransaction`): each call's arguments checked exactly as FoundationDB
checks them, the transaction's size counted as FoundationDB counts it, then the engine's
storage primitives (``_get``, ``_get_range``, ``_set`` ...) asked.

Apart from :mod:`.transaction`, which holds the transaction's life cycle (its begin, the
5-second window and the timeout, commit, ``on_error``'s backoff, reset, cancel, watches): what
is done between the begin and the commit is here, how an attempt begins and ends is there.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

from fdbqueue.engines.checks import (
    check_bytes,
    check_get_key,
    check_range_end,
    check_read_key,
    check_value,
    check_write_key,
    check_write_range,
    journal_templates,
    key_after,
    strinc,
)
from fdbqueue.engines.contract import (
    BELL_TEMPLATE,
    KEY_RANGE_REF_BYTES,
    MUTATION_REF_BYTES,
    SYSTEM_KEYS,
    KeyOrSelector,
    KeySelector,
    KeyValue,
)
from fdbqueue.engines.limits import KEY_SIZE_LIMIT, VALUE_SIZE_LIMIT
from fdbqueue.engines.local.mutations import check_versionstamp_offset
from fdbqueue.errors import EngineError

# Bytes one write or conflict range adds to a transaction's size as FoundationDB counts it
# (Transaction::getSize, fdbclient/NativeAPI.actor.cpp; see MUTATION_REF_BYTES in base.py).
# A set is a mutation (key + value) and a write conflict range [key, keyAfter(key)).
_SET_BYTES = MUTATION_REF_BYTES + KEY_RANGE_REF_BYTES + 1
_POINT_RANGE_BYTES = KEY_RANGE_REF_BYTES + 1  # [key, keyAfter(key)): plus twice the key


def _plain_write(key: object, value: object) -> bool:
    """True when ``key`` and ``value`` are bytes within the limits, with no system key; the
    full checks (``check_write_key``, ``check_value``) then raise the precise error."""
    return (
        type(key) is bytes
        and type(value) is bytes
        and len(key) <= KEY_SIZE_LIMIT
        and key < SYSTEM_KEYS
        and len(value) <= VALUE_SIZE_LIMIT
    )


class ReadsAndWrites(ABC):
    """The reads, writes and conflict ranges of :class:`~.transaction.LocalTransaction` (a base
    of it: the fields and methods declared below are the transaction's, kept by its life cycle)."""

    __slots__ = ()

    if TYPE_CHECKING:
        _live: bool
        _size: int
        _has_writes: bool

        def _touch(self) -> None: ...
        def _reading(self) -> None: ...

    # -- reads ---------------------------------------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        """The value of ``key`` or None; adds a read conflict on ``key``."""
        return self._read_get(key, False)

    def __getitem__(self, key: bytes) -> bytes | None:
        if isinstance(key, slice):
            return self.get_range(key.start or b"", key.stop or SYSTEM_KEYS, 0, key.step == -1)
        return self._read_get(key, False)

    def get_key(self, selector: KeySelector) -> bytes:
        """The key ``selector`` resolves to; adds a read conflict over what it examined."""
        return self._read_key(selector, False)

    def get_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int = 0, reverse: bool = False
    ) -> list[KeyValue]:
        """Keys in [begin, end) in order (reversed on request), at most ``limit`` (0: all).

        Adds a read conflict over the part actually read (RYWImpl::read, fdbclient/ReadYourWrites.cpp).
        """
        return self._read_range(begin, end, limit, reverse, False)

    def get_range_startswith(self, prefix: bytes, limit: int = 0, reverse: bool = False) -> list[KeyValue]:
        p = check_bytes("prefix", prefix)
        return self._read_range(p, strinc(p) if p else SYSTEM_KEYS, limit, reverse, False)

    def get_many(self, keys: list[bytes]) -> list[bytes | None]:
        """The values of ``keys`` in order, as ``get`` of each, in one read of the engine."""
        return self._read_many(keys, False)

    def _read_many(self, keys: list[bytes], snapshot: bool) -> list[bytes | None]:
        """:meth:`_read_get` of each key, the engine asked once for all (``_get_many``)."""
        if len(keys) < 2:
            return [self._read_get(k, snapshot) for k in keys]
        for key in keys:
            if type(key) is not bytes or key >= SYSTEM_KEYS:
                check_get_key(key)
        if not self._live:
            self._touch()
        self._reading()
        # No stored key is longer than the limit: FoundationDB answers "absent" unread.
        asked = [k for k in keys if len(k) <= KEY_SIZE_LIMIT]
        if not snapshot:
            self._size += sum(_POINT_RANGE_BYTES + 2 * len(k) for k in asked)  # type: ignore[misc]  # the transaction's field
        found = self._get_many(asked, snapshot)
        return [found.get(k) for k in keys]

    def _get_many(self, keys: list[bytes], snapshot: bool) -> dict[bytes, bytes | None]:
        """The engine's values of ``keys`` (the write map's first): ``_get`` of each, unless
        the engine reads many at once (the sqlite engine: one statement)."""
        return {k: self._get(k, snapshot) for k in keys}

    def _read_get(self, key: bytes, snapshot: bool) -> bytes | None:
        if type(key) is not bytes or key >= SYSTEM_KEYS:
            check_get_key(key)
        if not self._live:
            self._touch()
        if len(key) > KEY_SIZE_LIMIT:
            # No stored key is that long: FoundationDB answers "absent" without a read
            # (ReadYourWritesTransaction::get, getMaxReadKeySize).
            return None
        self._reading()
        if not snapshot:
            self._size += _POINT_RANGE_BYTES + 2 * len(key)  # type: ignore[misc]  # the transaction's field
        return self._get(key, snapshot)

    def _read_key(self, selector: KeySelector, snapshot: bool) -> bytes:
        if not isinstance(selector, KeySelector):
            raise TypeError("get_key takes a KeySelector")
        check_read_key(selector.key)
        self._touch()
        self._reading()
        return self._resolved(selector, snapshot)

    def _resolved(self, selector: KeySelector, snapshot: bool) -> bytes:
        key = self._resolve(selector, snapshot)
        if not snapshot:
            # The read conflict range covers what resolution examined, between the anchor
            # and the answer (either may be keyAfter'ed): at most this many bytes.
            self._size += KEY_RANGE_REF_BYTES + 2 + len(selector.key) + len(key)  # type: ignore[misc]  # the transaction's field
        return key

    def _read_range(
        self, begin: KeyOrSelector, end: KeyOrSelector, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]:
        if not isinstance(limit, int) or limit < 0:
            raise EngineError(2006, f"limit must be a non-negative int, got {limit!r}")
        if not self._live:
            self._touch()
        self._reading()
        if type(begin) is bytes and type(end) is bytes and begin <= SYSTEM_KEYS >= end:
            b, e = check_read_key(begin) if len(begin) > KEY_SIZE_LIMIT else begin, end  # plain keys
        else:
            # Selector keys past b'\xff' are refused too (ReadYourWritesTransaction::getRange).
            if isinstance(begin, KeySelector):
                check_read_key(begin.key)
            if isinstance(end, KeySelector):
                check_range_end(end.key)
            b = self._resolved(begin, snapshot) if isinstance(begin, KeySelector) else check_read_key(begin)
            e = self._resolved(end, snapshot) if isinstance(end, KeySelector) else check_range_end(end)
        if b >= e:
            return []
        out = self._get_range(b, e, limit, reverse, snapshot)
        if not snapshot:
            # The part actually read (as fdbclient/ReadYourWrites.cpp): with the limit reached, up to
            # keyAfter(last) forward, from the last key backward.
            if limit and len(out) == limit:
                if reverse:
                    b = out[-1].key
                else:
                    e = out[-1].key + b"\x00"
            self._size += KEY_RANGE_REF_BYTES + len(b) + len(e)  # type: ignore[misc]  # the transaction's field
        return out

    # -- writes --------------------------------------------------------------------------------

    def set(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` (blind: adds a write conflict only)."""
        if not _plain_write(key, value):  # the hot path: two type checks and three comparisons
            key, value = check_write_key(key), check_value(value)
        if not self._live:
            self._touch()
        self._size += _SET_BYTES + 3 * len(key) + len(value)  # type: ignore[misc]  # the transaction's field
        self._has_writes = True  # type: ignore[misc]  # the transaction's field
        self._set(key, value)

    __setitem__ = set

    def clear(self, key: bytes) -> None:
        if not _plain_write(key, b""):
            key = check_write_key(key)
        if not self._live:
            self._touch()
        # A clear is the mutation ClearRange(key, keyAfter(key)) and that write conflict range.
        self._size += _SET_BYTES + 4 * len(key) + 1  # type: ignore[misc]  # the transaction's field
        self._has_writes = True  # type: ignore[misc]  # the transaction's field
        self._clear(key)

    __delitem__ = clear

    def clear_range(self, begin: bytes, end: bytes) -> None:
        """Remove every key in [begin, end); 2005 if end < begin."""
        b, e = check_write_range(begin, end)
        self._touch()
        if b < e:
            self._size += MUTATION_REF_BYTES + KEY_RANGE_REF_BYTES + 2 * (len(b) + len(e))  # type: ignore[misc]  # the transaction's field
            self._has_writes = True  # type: ignore[misc]  # the transaction's field
            self._clear_range(b, e)

    def clear_range_startswith(self, prefix: bytes) -> None:
        p = check_bytes("prefix", prefix)
        self.clear_range(p, strinc(p) if p else SYSTEM_KEYS)

    def _atomic_op(self, op: str, key: bytes, param: bytes) -> None:
        if not _plain_write(key, param):
            key, param = check_write_key(key), check_value(param)
        if not self._live:
            self._touch()
        self._size += _SET_BYTES + 3 * len(key) + len(param)  # type: ignore[misc]  # the transaction's field
        self._has_writes = True  # type: ignore[misc]  # the transaction's field
        self._atomic(op, key, param)

    def add(self, key: bytes, param: bytes) -> None:
        """Little-endian add; never a read conflict, so hot counters do not conflict."""
        self._atomic_op("add", key, param)

    def max(self, key: bytes, param: bytes) -> None:
        self._atomic_op("max", key, param)

    def min(self, key: bytes, param: bytes) -> None:
        self._atomic_op("min", key, param)

    def byte_max(self, key: bytes, param: bytes) -> None:
        self._atomic_op("byte_max", key, param)

    def byte_min(self, key: bytes, param: bytes) -> None:
        self._atomic_op("byte_min", key, param)

    def bit_and(self, key: bytes, param: bytes) -> None:
        self._atomic_op("bit_and", key, param)

    def bit_or(self, key: bytes, param: bytes) -> None:
        self._atomic_op("bit_or", key, param)

    def bit_xor(self, key: bytes, param: bytes) -> None:
        self._atomic_op("bit_xor", key, param)

    def compare_and_clear(self, key: bytes, param: bytes) -> None:
        self._atomic_op("compare_and_clear", key, param)

    def append_if_fits(self, key: bytes, param: bytes) -> None:
        self._atomic_op("append_if_fits", key, param)

    def set_versionstamped_key(self, key: bytes, value: bytes) -> None:
        """Write ``value`` at ``key`` with its 10 stamp bytes filled in at commit."""
        k = check_bytes("key", key)
        if len(k) - 4 > KEY_SIZE_LIMIT:
            raise EngineError(2102, f"key of {len(k) - 4} bytes exceeds {KEY_SIZE_LIMIT}")
        if k[:-4] >= SYSTEM_KEYS:
            raise EngineError(2004, "keys at or after b'\\xff' are reserved")
        v = check_value(value)
        check_versionstamp_offset(k)  # the offset, now rather than at commit
        self._touch()
        # The mutation keeps the offset; the write conflict range spans the possible keys
        # without it (getVersionstampKeyRange, fdbclient/ReadYourWrites.cpp).
        self._size += _SET_BYTES + len(k) + 2 * (len(k) - 4) + len(v)  # type: ignore[misc]  # the transaction's field
        self._has_writes = True  # type: ignore[misc]  # the transaction's field
        self._versionstamped("key", k, v)

    def set_versionstamped_value(self, key: bytes, value: bytes) -> None:
        """Write ``value`` (with its stamp bytes filled in at commit) at ``key``."""
        k = check_write_key(key)
        v = check_bytes("value", value)
        if len(v) - 4 > VALUE_SIZE_LIMIT:
            raise EngineError(2103, f"value of {len(v) - 4} bytes exceeds {VALUE_SIZE_LIMIT}")
        check_versionstamp_offset(v)
        self._touch()
        self._size += _SET_BYTES + 3 * len(k) + len(v)  # type: ignore[misc]  # the transaction's field
        self._has_writes = True  # type: ignore[misc]  # the transaction's field
        self._versionstamped("value", k, v)

    def set_journal_entry(
        self,
        order: int,
        entry: bytes,
        value: bytes,
        pointer: bytes | None = None,
        pointer_value: bytes = b"",
        bell: bytes | None = None,
    ) -> None:
        """A journal entry's rows in one call (``contract.Transaction.set_journal_entry``): its
        templates, every argument checked first, through the two calls above."""
        key, pointer_key = journal_templates(order, entry, value, pointer, pointer_value, bell)
        self.set_versionstamped_key(key, value)
        if pointer_key is not None:
            self.set_versionstamped_key(pointer_key, pointer_value)
        if bell is not None:
            self.set_versionstamped_value(bell, BELL_TEMPLATE)

    # -- conflict ranges -------------------------------------------------------------------------

    def add_read_conflict_range(self, begin: bytes, end: bytes) -> None:
        """Add [begin, end) to the read conflict ranges (no read version is taken for it)."""
        b, e = check_read_key(begin), check_range_end(end)
        if e < b:
            raise EngineError(2005, "conflict range end is before begin")
        self._touch()
        self._size += KEY_RANGE_REF_BYTES + len(b) + len(e)  # type: ignore[misc]  # the transaction's field
        self._conflict_range("read", b, e)

    def add_read_conflict_key(self, key: bytes) -> None:
        k = check_read_key(key)
        self.add_read_conflict_range(k, key_after(k))

    def add_write_conflict_range(self, begin: bytes, end: bytes) -> None:
        b, e = check_read_key(begin), check_range_end(end)
        if e < b:
            raise EngineError(2005, "conflict range end is before begin")
        self._touch()
        self._size += KEY_RANGE_REF_BYTES + len(b) + len(e)  # type: ignore[misc]  # the transaction's field
        if b < e:
            self._has_writes = True  # type: ignore[misc]  # the transaction's field
        self._conflict_range("write", b, e)

    def add_write_conflict_key(self, key: bytes) -> None:
        k = check_read_key(key)
        self.add_write_conflict_range(k, key_after(k))

    # -- the engine's storage primitives -------------------------------------------------------

    @abstractmethod
    def _get(self, key: bytes, snapshot: bool) -> bytes | None: ...

    @abstractmethod
    def _resolve(self, selector: KeySelector, snapshot: bool) -> bytes: ...

    @abstractmethod
    def _get_range(
        self, begin: bytes, end: bytes, limit: int, reverse: bool, snapshot: bool
    ) -> list[KeyValue]: ...

    @abstractmethod
    def _set(self, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def _clear(self, key: bytes) -> None: ...

    @abstractmethod
    def _clear_range(self, begin: bytes, end: bytes) -> None: ...

    @abstractmethod
    def _atomic(self, op: str, key: bytes, param: bytes) -> None: ...

    @abstractmethod
    def _versionstamped(self, kind: str, key: bytes, value: bytes) -> None: ...

    @abstractmethod
    def _conflict_range(self, kind: str, begin: bytes, end: bytes) -> None: ...
