"""Argument checks shared by the engines, raising FoundationDB's codes for what FoundationDB
refuses (a key or value past its limit: 2102, 2103; a key at or after ``b'\\xff'``: 2004; an
inverted range: 2005), and the key arithmetic they use (``strinc``, ``key_after``).

Apart from :mod:`.contract` (what an engine implements) because only the engines call them:
the in-process engines' transaction (``engines/local/``) and the FoundationDB engine, which
raises at the call what the bindings would raise at the next wait or commit.
"""

from __future__ import annotations

from fdbqueue.engines.contract import SYSTEM_KEYS
from fdbqueue.engines.limits import KEY_SIZE_LIMIT, VALUE_SIZE_LIMIT
from fdbqueue.errors import EngineError


def check_bytes(name: str, value: object) -> bytes:
    if not isinstance(value, bytes):
        raise TypeError(f"{name} must be bytes, not {type(value).__name__}")
    return value


def check_write_key(key: object) -> bytes:
    k = check_bytes("key", key)
    if len(k) > KEY_SIZE_LIMIT:
        raise EngineError(2102, f"key of {len(k)} bytes exceeds {KEY_SIZE_LIMIT}")
    if k >= SYSTEM_KEYS:
        raise EngineError(2004, "keys at or after b'\\xff' are reserved")
    return k


def check_read_key(key: object) -> bytes:
    k = check_bytes("key", key)
    if len(k) > KEY_SIZE_LIMIT:
        raise EngineError(2102, f"key of {len(k)} bytes exceeds {KEY_SIZE_LIMIT}")
    if k > SYSTEM_KEYS:
        raise EngineError(2004, "keys after b'\\xff' are reserved")
    return k


def check_get_key(key: object) -> bytes:
    """A point read's key: 2004 from b'\\xff' on (ReadYourWritesTransaction::get refuses
    ``key >= getMaxReadKey()`` without read_system_keys, fdbclient/ReadYourWrites.cpp).
    A longer key than any stored one is not an error there: the read finds nothing."""
    k = check_bytes("key", key)
    if k >= SYSTEM_KEYS:
        raise EngineError(2004, "keys at or after b'\\xff' are reserved")
    return k


def check_range_end(key: object) -> bytes:
    """A range's end (a read, a clear, a conflict range): 2004 past b'\\xff'.

    FoundationDB refuses ``end > getMaxReadKey()`` (ReadYourWritesTransaction::getRange,
    ::clear, ::addReadConflictRange, ::addWriteConflictRange); only what a key selector
    resolves to is clamped to b'\\xff'.
    """
    k = check_bytes("end", key)
    if k > SYSTEM_KEYS:
        raise EngineError(2004, "range ends after b'\\xff' are reserved")
    return k


def check_value(value: object) -> bytes:
    v = check_bytes("value", value)
    if len(v) > VALUE_SIZE_LIMIT:
        raise EngineError(2103, f"value of {len(v)} bytes exceeds {VALUE_SIZE_LIMIT}")
    return v


# An incomplete versionstamp's 10 bytes in a key template, as fdb.tuple writes them (the
# commit writes the stamp over them): journal_templates' are byte for byte fdb.tuple's.
_NO_STAMP = b"\xff" * 10


def journal_templates(
    order: int, entry: bytes, value: bytes, pointer: bytes | None, pointer_value: bytes, bell: bytes | None
) -> tuple[bytes, bytes | None]:
    """:meth:`Transaction.set_journal_entry`'s arguments checked, every one before any row is
    written (a refused call writes none), as its templates would be checked: the entry's and
    the pointer's key templates (``set_versionstamped_key``'s: the stamp's offset in the last
    four bytes, little-endian)."""
    if type(order) is not int:
        raise TypeError(f"order must be an int, not {type(order).__name__}")
    if not 0 <= order <= 0xFFFF:
        raise EngineError(2006, f"a journal entry's order must be 0 to 65535, got {order}")
    tail = _NO_STAMP + order.to_bytes(2, "big")
    keys = []
    for prefix in (entry,) if pointer is None else (entry, pointer):
        check_bytes("key", prefix)
        if len(prefix) + 12 > KEY_SIZE_LIMIT:
            raise EngineError(2102, f"key of {len(prefix) + 12} bytes exceeds {KEY_SIZE_LIMIT}")
        key = prefix + tail
        if key >= SYSTEM_KEYS:  # as the template is checked: an empty prefix is all 0xff
            raise EngineError(2004, "keys at or after b'\\xff' are reserved")
        keys.append(key + len(prefix).to_bytes(4, "little"))
    check_value(value)
    if pointer is not None:
        check_value(pointer_value)
    if bell is not None:
        check_write_key(bell)
    return keys[0], keys[1] if pointer is not None else None


def check_write_range(begin: object, end: object) -> tuple[bytes, bytes]:
    """A clear range's bounds: each at most b'\\xff' (2004, ReadYourWritesTransaction::clear);
    2005 if inverted."""
    b = check_bytes("key", begin)
    if len(b) > KEY_SIZE_LIMIT:
        raise EngineError(2102, f"key of {len(b)} bytes exceeds {KEY_SIZE_LIMIT}")
    if b > SYSTEM_KEYS:
        raise EngineError(2004, "keys after b'\\xff' are reserved")
    e = check_range_end(end)
    if e < b:
        raise EngineError(2005, "clear_range end is before begin")
    return b, e


def clamp_end(key: bytes) -> bytes:
    """Range ends may be anything up to b'\\xff'; later keys are clamped (as FDB clamps selectors)."""
    return key if key <= SYSTEM_KEYS else SYSTEM_KEYS


def strinc(prefix: bytes) -> bytes:
    """The first key after every key that starts with ``prefix`` (fdb's ``strinc``)."""
    p = prefix.rstrip(b"\xff")
    if not p:
        raise ValueError("prefix must contain a byte other than 0xff")
    return p[:-1] + bytes([p[-1] + 1])


def key_after(key: bytes) -> bytes:
    return key + b"\x00"
