"""The encodings under the keyspace (``layout.py``): ``fdb.tuple``'s encoding of one int,
bytes or str written directly (an enqueue builds a dozen keys; the general encoder would cost
more than the rest), versionstamps in journal keys, the 8-byte counters atomic adds take, a
str checked for UTF-8 before it goes into a key, and a hash every process computes alike.

Importing it lets ``fdb.tuple`` pack versionstamps on a machine without libfdb_c.
"""

from __future__ import annotations

import importlib
import struct
import types
import zlib
from typing import Any

import fdb.tuple

from fdbqueue.errors import InvalidTextError, QueueError


def _allow_versionstamps_without_native_client() -> None:
    """Let ``fdb.tuple`` pack Versionstamps when libfdb_c is absent.

    ``Versionstamp.to_bytes`` checks ``isinstance(x, fdb.impl.Value)``; importing
    ``fdb.impl`` loads the native library. Where it cannot load, a stand-in module
    whose ``Value`` nothing is an instance of gives the same result.
    """
    if hasattr(fdb, "impl"):
        return
    try:
        importlib.import_module("fdb.impl")  # loads libfdb_c when it is installed
    except Exception:
        stub = types.ModuleType("fdb.impl")

        class Value(bytes):
            """Never instantiated: no packed value is an fdb future here."""

        setattr(stub, "Value", Value)  # noqa: B010 - a module attribute mypy cannot see
        # The attribute only, not sys.modules: fdb.api_version() must still find the real module.
        setattr(fdb, "impl", stub)  # noqa: B010


_allow_versionstamps_without_native_client()


_BIG = (1 << 64) - 1


def enc_int(n: int) -> bytes:
    """``fdb.tuple.pack((n,))`` for ``|n| < 2**64``, without the general encoder's overhead."""
    if n == 0:
        return b"\x14"
    if not -_BIG < n < _BIG:
        return pack_one(n)  # magnitudes from 2**64 - 1 have their own type codes
    if n > 0:
        size = (n.bit_length() + 7) // 8
        return bytes((0x14 + size,)) + n.to_bytes(size, "big")
    size = ((-n).bit_length() + 7) // 8
    return bytes((0x14 - size,)) + ((1 << (8 * size)) - 1 + n).to_bytes(size, "big")


def enc_bytes(b: bytes) -> bytes:
    """``fdb.tuple.pack((b,))`` for bytes."""
    return b"\x01" + b.replace(b"\x00", b"\x00\xff") + b"\x00"


def enc_str(s: str) -> bytes:
    """``fdb.tuple.pack((s,))`` for str."""
    return b"\x02" + s.encode("utf-8").replace(b"\x00", b"\x00\xff") + b"\x00"


def dec_int(key: bytes, pos: int) -> tuple[int, int]:
    """The tuple-encoded int at ``key[pos:]`` and the position after it."""
    code = key[pos]
    if code == 0x14:
        return 0, pos + 1
    if 0x14 < code <= 0x1C:
        size = code - 0x14
        return int.from_bytes(key[pos + 1 : pos + 1 + size], "big"), pos + 1 + size
    if 0x0C <= code < 0x14:
        size = 0x14 - code
        raw = int.from_bytes(key[pos + 1 : pos + 1 + size], "big")
        return raw - ((1 << (8 * size)) - 1), pos + 1 + size
    value, end = fdb.tuple._decode(key, pos)  # big ints: the general decoder
    return int(value), end


def pack_one(value: Any) -> bytes:
    """``fdb.tuple.pack((value,))``, typed."""
    key: bytes = fdb.tuple.pack((value,))
    return key


def versionstamp(version: bytes | None, order: int = 0) -> fdb.tuple.Versionstamp:
    """A complete versionstamp from a 12-byte journal version, or an incomplete one to fill."""
    if version is None:
        return fdb.tuple.Versionstamp(user_version=order)
    return fdb.tuple.Versionstamp(version[:10], int.from_bytes(version[10:12], "big"))


def version_of(stamp: Any) -> bytes:
    """The 12-byte journal version of a complete versionstamp read back from a key."""
    if not isinstance(stamp, fdb.tuple.Versionstamp) or stamp.tr_version is None:
        raise QueueError("not a journal key: its last element is not a complete versionstamp")
    return bytes(stamp.tr_version) + int(stamp.user_version).to_bytes(2, "big")


_STAMP_CODE = b"\x33"  # fdb.tuple's code for a Versionstamp
_NO_STAMP = b"\xff" * 10  # the ten bytes the commit fills in
_OFFSET = struct.Struct("<I")  # where they are (API version 520 and later)


def incomplete_stamp(prefix: bytes, order: int) -> bytes:
    """``prefix`` + an incomplete versionstamp of ``order`` + its offset, for
    ``set_versionstamped_key`` (``fdb.tuple``'s encoding: code 0x33, ten stamp bytes, the
    two-byte order, then the stamp's offset, four bytes little-endian)."""
    return prefix + _STAMP_CODE + _NO_STAMP + order.to_bytes(2, "big") + _OFFSET.pack(len(prefix) + 1)


ONE = struct.pack("<q", 1)  # the atomic ADD operands of a counter's +1 and -1
MINUS_ONE = struct.pack("<q", -1)


def pack_count(n: int) -> bytes:
    """A counter's value: 8 bytes little-endian, as FoundationDB's atomic ADD takes."""
    return struct.pack("<q", n)


def unpack_count(raw: bytes | None) -> int:
    """A counter's value read back (absent: 0; shorter than 8 bytes: zero-extended, as ADD does)."""
    if not raw:
        return 0
    return int(struct.unpack("<q", raw.ljust(8, b"\x00")[:8])[0])


def utf8(text: str, what: str) -> bytes:
    """``text`` in UTF-8, as the tuple layer packs a str into a key; InvalidTextError (a
    QueueError) for a str UTF-8 cannot encode (a lone surrogate), not UnicodeEncodeError."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"{what} cannot be stored: {text[exc.start : exc.end]!r} at position {exc.start} is a "
            "lone surrogate, which UTF-8 cannot encode"
        ) from None


def stable_hash(value: str) -> int:
    """A hash of ``value`` that every process and Python version computes alike (CRC-32 of its
    UTF-8 bytes: Python's own ``hash`` of a str is salted per process)."""
    return zlib.crc32(value.encode("utf-8"))
