"""The embedded engine's versionstamped writes: its fast path (``SqliteTransaction``'s
``set_versionstamped_key`` and ``set_versionstamped_value``, the stamps filled at commit) does
exactly what the generic path of ``LocalTransaction`` does: the same refusals with the same
codes, the same size counted against the transaction's limit, the same rows committed.
FoundationDB's own description: ``set_versionstamped_key`` / ``set_versionstamped_value`` in
documentation/sphinx/source/api-python.rst."""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import EngineError, NestedTransactionError
from fdbqueue.engines.local.transaction import LocalTransaction
from fdbqueue.engines.sqlite.database import SqliteDatabase

Z10 = b"\x00" * 10


def off(n: int) -> bytes:
    return struct.pack("<I", n)


OK_KEY = b"vs/" + Z10 + b"!" + off(3)
OK_VALUE = b"head" + Z10 + b"tail" + off(4)

# (kind, key, value): good templates and bad ones (each refused for one reason)
CASES: list[tuple[str, Any, Any]] = [
    ("key", OK_KEY, b"v"),
    ("key", Z10 + off(0), b""),  # the stamp is the whole key
    ("key", b"vs/" + Z10 + off(4), b"v"),  # offset past the end
    ("key", b"vs/" + Z10 + off(2**32 - 1), b"v"),
    ("key", b"abc", b"v"),  # no room for the offset
    ("key", b"vs" + off(0), b"v"),  # no room for the stamp
    ("key", b"\xff/" + Z10 + off(2), b"v"),  # a system key
    ("key", b"\xfe" + Z10 + off(1), b"v"),  # just below the system keys
    ("key", b"k" * 10_001 + Z10 + off(10_001), b"v"),  # too long, once stamped
    ("key", b"k" * 9_990 + Z10 + off(9_990), b"v"),  # as long as a key may be
    ("key", OK_KEY, b"v" * 100_001),  # value too long
    ("key", OK_KEY, b"v" * 100_000),
    ("key", bytearray(OK_KEY), b"v"),
    ("key", OK_KEY, "v"),
    ("key", OK_KEY.decode("latin-1"), b"v"),
    ("value", b"val", OK_VALUE),
    ("value", b"val", Z10 + off(0)),  # the bell's template
    ("value", b"val", b"head" + Z10 + off(5)),  # offset past the end
    ("value", b"val", b"ab"),
    ("value", b"\xff", OK_VALUE),
    ("value", b"", OK_VALUE),
    ("value", b"k" * 10_001, OK_VALUE),
    ("value", b"val", b"v" * 100_001 + Z10 + off(0)),  # too long, once stamped
    ("value", b"val", b"v" * 99_990 + Z10 + off(0)),
    ("value", "val", OK_VALUE),
    ("value", b"val", memoryview(OK_VALUE)),
]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDatabase]:
    database = fdbqueue.open(f"sqlite://{tmp_path / 'store.db'}?sync=normal")
    assert isinstance(database, SqliteDatabase)
    try:
        yield database
    finally:
        database.close()


def fast(tr: Any, kind: str) -> Callable[[Any, Any], None]:
    return tr.set_versionstamped_key if kind == "key" else tr.set_versionstamped_value  # type: ignore[no-any-return]


def generic(tr: Any, kind: str) -> Callable[[Any, Any], None]:
    method = (
        LocalTransaction.set_versionstamped_key
        if kind == "key"
        else LocalTransaction.set_versionstamped_value
    )
    return lambda k, v: method(tr, k, v)


def outcome(
    db: SqliteDatabase,
    write: Callable[[Any, str], Callable[[Any, Any], None]],
    case: tuple[str, Any, Any],
    *,
    live: bool,
) -> tuple[Any, ...]:
    """What one stamped write does: its error (type and code), the size it counts, and the
    rows the commit leaves (the stamp written back as ``STAMP``)."""
    kind, key, value = case
    for k in db.get_range(b"", b"\xff"):  # type: ignore[attr-defined]
        del db[k.key]  # type: ignore[attr-defined]
    tr = db.create_transaction()
    if live:
        tr.get(b"before")  # begun: the transaction's first operation is behind it
    size = tr._size
    try:
        write(tr, kind)(key, value)
    except (EngineError, TypeError) as exc:
        tr.cancel()
        return ("refused", type(exc), getattr(exc, "code", None))
    grown = tr._size - size
    stamp = tr.get_versionstamp()
    tr.commit()
    s = stamp.wait()
    rows = [(k.replace(s, b"STAMP"), v.replace(s, b"STAMP")) for k, v in db.get_range(b"", b"\xff")]  # type: ignore[attr-defined]
    return ("written", grown, rows)


@pytest.mark.parametrize("live", [True, False])
@pytest.mark.parametrize("case", CASES, ids=range(len(CASES)))
def test_a_stamped_write_does_what_the_generic_path_does(
    db: SqliteDatabase, case: tuple[str, Any, Any], live: bool
) -> None:
    expected = outcome(db, generic, case, live=live)
    assert outcome(db, fast, case, live=live) == expected
    assert expected[0] == "refused" or len(expected[2]) == 1, "a good template leaves its row"


def test_many_stamped_writes_in_one_commit_share_its_stamp(db: SqliteDatabase) -> None:
    """Keys and values stamped in one commit, beside plain writes, all take the commit's one
    stamp; the user's bytes after it order them; the next commit's stamp is greater."""
    stamps = []
    for _ in range(2):
        tr = db.create_transaction()
        tr[b"plain"] = b"p"
        for order in (2, 0, 1):
            tr.set_versionstamped_key(b"j/" + Z10 + bytes((order,)) + off(2), b"e%d" % order)
        tr.set_versionstamped_value(b"bell", Z10 + off(0))
        tr.set_versionstamped_value(b"bell2", b"x" + Z10 + b"y" + off(1))
        got = tr.get_versionstamp()
        tr.commit()
        stamps.append(got.wait())
    a, b = stamps
    assert a < b
    rows = db.get_range(b"", b"\xff")  # type: ignore[attr-defined]
    assert [(k, v) for k, v in rows] == [
        (b"bell", b),
        (b"bell2", b"x" + b + b"y"),
        *[(b"j/" + s + bytes((o,)), b"e%d" % o) for s in (a, b) for o in (0, 1, 2)],
        (b"plain", b"p"),
    ]


def test_a_nested_transaction_cannot_stamp(db: SqliteDatabase) -> None:
    outer = db.create_transaction()
    outer[b"k"] = b"v"
    inner = db.create_transaction()
    inner.get(b"k")
    with pytest.raises(NestedTransactionError):
        inner.set_versionstamped_key(OK_KEY, b"v")
    with pytest.raises(NestedTransactionError):
        inner.set_versionstamped_value(b"val", OK_VALUE)
    inner.cancel()
    outer.cancel()
