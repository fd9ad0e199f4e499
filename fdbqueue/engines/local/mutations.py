"""The mutations of FoundationDB as the in-process engines apply them: atomic ops and versionstamps.

The FoundationDB engine sends mutations to the cluster, which applies them; the sim and
embedded engines apply them here, as FoundationDB does: atomic ops as in
``fdbclient/include/fdbclient/Atomic.h``, versionstamps as ``set_versionstamped_key`` and
``set_versionstamped_value`` describe them (``documentation/sphinx/source/api-python.rst``).
"""

from __future__ import annotations

import struct

from fdbqueue.engines.limits import VALUE_SIZE_LIMIT
from fdbqueue.errors import EngineError


def apply_atomic(op: str, existing: bytes | None, param: bytes) -> bytes | None:
    """FoundationDB's atomic mutation ``op`` applied to ``existing``; None means cleared."""
    if op == "add":
        n = len(param)
        old = _fit(existing, n)
        total = int.from_bytes(old, "little") + int.from_bytes(param, "little")
        return (total % (1 << (8 * n))).to_bytes(n, "little") if n else b""
    if op in ("max", "min"):
        if existing is None:
            return param
        n = len(param)
        old_i = int.from_bytes(_fit(existing, n), "little")
        new_i = int.from_bytes(param, "little")
        pick = max(old_i, new_i) if op == "max" else min(old_i, new_i)
        return pick.to_bytes(n, "little") if n else b""
    if op == "byte_max":
        return param if existing is None else max(existing, param)
    if op == "byte_min":
        return param if existing is None else min(existing, param)
    if op in ("bit_and", "bit_or", "bit_xor"):
        if existing is None:
            return param
        old = _fit(existing, len(param))
        if op == "bit_and":
            return bytes(a & b for a, b in zip(old, param, strict=False))
        if op == "bit_or":
            return bytes(a | b for a, b in zip(old, param, strict=False))
        return bytes(a ^ b for a, b in zip(old, param, strict=False))
    if op == "compare_and_clear":
        return None if existing == param else existing
    if op == "append_if_fits":
        base = existing or b""
        return base + param if len(base) + len(param) <= VALUE_SIZE_LIMIT else base
    raise ValueError(f"unknown atomic op {op!r}")


def _fit(value: bytes | None, n: int) -> bytes:
    v = value or b""
    return v[:n] if len(v) >= n else v + b"\x00" * (n - len(v))


def check_versionstamp_offset(template: bytes) -> None:
    """What :func:`fill_versionstamp` checks, without building the result: a 4-byte offset
    suffix that points at ten bytes inside the rest."""
    if len(template) < 4:
        raise EngineError(2006, "versionstamp template needs a 4-byte offset suffix")
    if _OFFSET(template, len(template) - 4)[0] + 10 > len(template) - 4:
        raise EngineError(2006, "versionstamp offset points past the end of the key or value")


_OFFSET = struct.Struct("<I").unpack_from


def fill_versionstamp(template: bytes, stamp: bytes) -> bytes:
    """Replace the 10 bytes at the little-endian offset in ``template``'s last 4 bytes."""
    if len(template) < 4:
        raise EngineError(2006, "versionstamp template needs a 4-byte offset suffix")
    (offset,) = struct.unpack("<I", template[-4:])
    body = template[:-4]
    if offset + 10 > len(body):
        raise EngineError(2006, "versionstamp offset points past the end of the key or value")
    return body[:offset] + stamp + body[offset + 10 :]


def make_versionstamp(version: int, batch: int = 0) -> bytes:
    return struct.pack(">QH", version, batch)
