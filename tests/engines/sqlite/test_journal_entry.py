"""The embedded engine's ``set_journal_entry``: its fast path (in ``engines/sqlite/writes.py``,
the rows kept as prefixes and filled at commit) does exactly what the generic path of
``LocalTransaction`` does (the entry's templates through ``set_versionstamped_key`` and
``set_versionstamped_value``): the same refusals with the same codes, the same size counted
against the transaction's limit, the same rows committed, beside other stamped writes and
plain ones in any order."""

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

# set_journal_entry's arguments: good ones and bad ones (each refused for one reason)
CASES: list[tuple[Any, ...]] = [
    (0, b"j/q\x00\x33", b"entry", b"h/id\x00\x33", b"q\x00\x00", b"jn/q"),
    (0, b"j/q\x00\x33", b"entry", b"h/id\x00\x33", b"q\x00\x00", None),
    (5, b"j/q\x00\x33", b"entry", None, b"", b"jn/q"),
    (65_535, b"", b"", b"h", b"", b""),
    (0, b"e" * 9_988, b"v" * 100_000, b"p" * 9_988, b"v" * 100_000, b"b" * 10_000),
    (0, b"k" * 9_989, b"v", b"h/", b"", None),
    (0, b"j/", b"v", b"k" * 9_989, b"", None),
    (0, b"j/", b"v", b"h/", b"", b"k" * 10_001),
    (0, b"j/", b"v" * 100_001, b"h/", b"", None),
    (0, b"j/", b"v", b"h/", b"v" * 100_001, None),
    (0, b"\xff", b"v", b"h/", b"", None),
    (0, b"\xfe", b"v", b"\xfe\xff", b"", b"\xfe"),  # just below the system keys
    (0, b"j/", b"v", b"\xff/", b"", None),
    (0, b"j/", b"v", b"h/", b"", b"\xff"),
    (-1, b"j/", b"v", b"h/", b"", None),
    (65_536, b"j/", b"v", b"h/", b"", None),
    (1.0, b"j/", b"v", b"h/", b"", None),
    (False, b"j/", b"v", b"h/", b"", None),
    (0, bytearray(b"j/"), b"v", b"h/", b"", None),
    (0, b"j/", memoryview(b"v"), b"h/", b"", None),
    (0, b"j/", b"v", "h/", b"", None),
    (0, b"j/", b"v", b"h/", None, None),
    (0, b"j/", b"v", b"h/", b"", bytearray(b"jn")),
]


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDatabase]:
    database = fdbqueue.open(f"sqlite://{tmp_path / 'store.db'}?sync=normal")
    assert isinstance(database, SqliteDatabase)
    try:
        yield database
    finally:
        database.close()


def fast(tr: Any) -> Callable[..., None]:
    return tr.set_journal_entry  # type: ignore[no-any-return]


def generic(tr: Any) -> Callable[..., None]:
    return lambda *args: LocalTransaction.set_journal_entry(tr, *args)


def outcome(
    db: SqliteDatabase,
    write: Callable[[Any], Callable[..., None]],
    args: tuple[Any, ...],
    *,
    live: bool,
    more: bool,
) -> tuple[Any, ...]:
    """What one call does: its error (type and code), the size it counts, and the rows the
    commit leaves (the stamp written back as ``STAMP``). ``more``: other writes around it (a
    set, a clear, a stamped key and value of the generic kind)."""
    for k in db.get_range(b"", b"\xff"):  # type: ignore[attr-defined]
        del db[k.key]  # type: ignore[attr-defined]
    db[b"gone"] = b"x"  # type: ignore[index]
    tr = db.create_transaction()
    if live:
        tr.get(b"before")  # begun: the transaction's first operation is behind it
    if more:
        tr.set_versionstamped_key(b"vs/" + Z10 + struct.pack("<I", 3), b"before")
        tr[b"plain"] = b"p"
        del tr[b"gone"]
    size = tr._size
    try:
        write(tr)(*args)
    except (EngineError, TypeError) as exc:
        tr.cancel()
        return ("refused", type(exc), getattr(exc, "code", None))
    grown = tr._size - size
    if more:
        tr.set_versionstamped_value(b"after", b"<" + Z10 + b">" + struct.pack("<I", 1))
    stamp = tr.get_versionstamp()
    tr.commit()
    s = stamp.wait()
    rows = [(k.replace(s, b"STAMP"), v.replace(s, b"STAMP")) for k, v in db.get_range(b"", b"\xff")]  # type: ignore[attr-defined]
    return ("written", grown, rows)


@pytest.mark.parametrize("more", [False, True])
@pytest.mark.parametrize("live", [True, False])
@pytest.mark.parametrize("args", CASES, ids=range(len(CASES)))
def test_the_fast_path_does_what_the_generic_path_does(
    db: SqliteDatabase, args: tuple[Any, ...], live: bool, more: bool
) -> None:
    expected = outcome(db, generic, args, live=live, more=more)
    assert outcome(db, fast, args, live=live, more=more) == expected
    if expected[0] == "written":  # the entry, its pointer and its bell when given, beside the others
        assert len(expected[2]) == 1 + (args[3] is not None) + (args[5] is not None) + (3 if more else 1)


def test_a_stamped_key_filling_to_an_entrys_key_the_last_written_wins(db: SqliteDatabase) -> None:
    """Two stamped writes that land on one key, a journal entry's and a template's: the later
    call's row is the one left, whichever kind came first (as two templates)."""
    template = b"j/" + Z10 + b"\x00\x00" + struct.pack("<I", 2)
    for first in ("entry", "template"):
        tr: Any = db.create_transaction()
        tr.get(b"begun")  # the fast path's
        for kind in (first, "template" if first == "entry" else "entry"):
            if kind == "entry":
                tr.set_journal_entry(0, b"j/", b"by the entry", b"h/", b"", b"jn")
            else:
                tr.set_versionstamped_key(template, b"by the template")
        stamp = tr.get_versionstamp()
        tr.commit()
        last = b"by the template" if first == "entry" else b"by the entry"
        assert db[b"j/" + stamp.wait() + b"\x00\x00"] == last  # type: ignore[index]


def test_a_nested_transaction_cannot_write_an_entry(db: SqliteDatabase) -> None:
    outer = db.create_transaction()
    outer[b"k"] = b"v"
    inner: Any = db.create_transaction()
    inner.get(b"k")
    with pytest.raises(NestedTransactionError):
        inner.set_journal_entry(0, b"j/", b"v", b"h/", b"", b"jn")
    inner.cancel()
    outer.cancel()
