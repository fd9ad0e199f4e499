"""``Transaction.set_journal_entry``, the contract's one call for a journal entry's rows (an
extension of FoundationDB's API, as ``journal_order`` is): on every engine it writes what its
versionstamped templates write (``set_versionstamped_key`` twice, ``set_versionstamped_value``
once: api-python.rst in FoundationDB's documentation/sphinx/source/), and a call it refuses
writes none of its rows."""

from __future__ import annotations

import struct
from typing import Any

import pytest

from fdbqueue import EngineError
from fdbqueue.engines.contract import Database

Z10 = b"\x00" * 10


def template(prefix: bytes, order: int) -> bytes:
    """The key template ``set_journal_entry`` stands for: the prefix, the stamp, the order."""
    return prefix + Z10 + order.to_bytes(2, "big") + struct.pack("<I", len(prefix))


def rows(db: Database, prefix: bytes, stamp: bytes) -> list[tuple[bytes, bytes]]:
    """The rows under ``prefix``, the prefix cut off and the commit's stamp written ``STAMP``."""
    got = db.get_range_startswith(prefix)  # type: ignore[attr-defined]
    return [(k[len(prefix) :].replace(stamp, b"STAMP"), v.replace(stamp, b"STAMP")) for k, v in got]


# (order, entry, value, pointer, pointer value, bell), after the test's prefix
CALLS: list[tuple[int, bytes, bytes, bytes | None, bytes, bytes | None]] = [
    (0, b"e/q\x00", b"first", b"p/id1\x00", b"q\x00\x00", b"bell/q"),
    (1, b"e/q\x00", b"second", None, b"", None),  # a queue's own entry: no pointer
    (2, b"e/r\x00", b"third", b"p/id\x00\xff2\x00", b"r\x00\x03", b"bell/r"),
    (300, b"e/q\x00", b"", b"p/id3\x00", b"", None),  # an empty value, a larger order
    (65_535, b"", b"no prefix", b"p/", b"v", None),
]


def test_one_call_writes_what_its_templates_write(db: Database) -> None:
    """The same entries, one transaction through ``set_journal_entry`` and one through the
    templates: the same rows (keys and values), each with its own commit's stamp."""
    got = []
    for prefix, through_templates in ((b"A/", False), (b"B/", True)):
        tr: Any = db.create_transaction()
        for order, entry, value, pointer, pointer_value, bell in CALLS:
            if not through_templates:
                tr.set_journal_entry(
                    order,
                    prefix + entry,
                    value,
                    None if pointer is None else prefix + pointer,
                    pointer_value,
                    None if bell is None else prefix + bell,
                )
                continue
            tr.set_versionstamped_key(template(prefix + entry, order), value)
            if pointer is not None:
                tr.set_versionstamped_key(template(prefix + pointer, order), pointer_value)
            if bell is not None:
                tr.set_versionstamped_value(prefix + bell, Z10 + struct.pack("<I", 0))
        stamp = tr.get_versionstamp()
        tr.commit()
        got.append(rows(db, prefix, stamp.wait()))
    assert got[0] == got[1]
    assert sorted(got[0]) == sorted(
        [
            (b"e/q\x00STAMP\x00\x00", b"first"),
            (b"p/id1\x00STAMP\x00\x00", b"q\x00\x00"),
            (b"bell/q", b"STAMP"),
            (b"e/q\x00STAMP\x00\x01", b"second"),
            (b"e/r\x00STAMP\x00\x02", b"third"),
            (b"p/id\x00\xff2\x00STAMP\x00\x02", b"r\x00\x03"),
            (b"bell/r", b"STAMP"),
            (b"e/q\x00STAMP\x01\x2c", b""),
            (b"p/id3\x00STAMP\x01\x2c", b""),
            (b"STAMP\xff\xff", b"no prefix"),
            (b"p/STAMP\xff\xff", b"v"),
        ]
    )


def test_entries_of_two_commits_order_by_commit_then_by_order(db: Database) -> None:
    stamps = []
    for _ in range(2):
        tr: Any = db.create_transaction()
        for order in (1, 0):
            tr.set_journal_entry(order, b"e/", b"%d" % order, b"p/", b"", b"bell")
        stamp = tr.get_versionstamp()
        tr.commit()
        stamps.append(stamp.wait())
    a, b = stamps
    assert a < b
    entries = db.get_range_startswith(b"e/")  # type: ignore[attr-defined]
    assert [(k, v) for k, v in entries] == [
        (b"e/" + s + bytes((0, o)), b"%d" % o) for s in (a, b) for o in (0, 1)
    ]
    assert db[b"bell"] == b  # type: ignore[index]


# (arguments, error type, code): each refused for one reason
BAD: list[tuple[tuple[Any, ...], type[Exception], int | None]] = [
    ((0, "e/", b"v", b"p/", b"", None), TypeError, None),
    ((0, b"e/", "v", b"p/", b"", None), TypeError, None),
    ((0, b"e/", b"v", bytearray(b"p/"), b"", None), TypeError, None),
    ((0, b"e/", b"v", b"p/", "", None), TypeError, None),
    ((0, b"e/", b"v", b"p/", b"", "bell"), TypeError, None),
    (("0", b"e/", b"v", b"p/", b"", None), TypeError, None),
    ((True, b"e/", b"v", b"p/", b"", None), TypeError, None),
    ((-1, b"e/", b"v", b"p/", b"", None), EngineError, 2006),
    ((65_536, b"e/", b"v", b"p/", b"", None), EngineError, 2006),
    ((0, b"\xff/e/", b"v", b"p/", b"", None), EngineError, 2004),
    ((0, b"", b"v", b"p/", b"", None), EngineError, 2004),  # the template: all 0xff up to the order
    ((0, b"e/", b"v", b"", b"", None), EngineError, 2004),
    ((0, b"e/", b"v", b"\xff", b"", None), EngineError, 2004),
    ((0, b"e/", b"v", b"p/", b"", b"\xff\x01"), EngineError, 2004),
    ((0, b"k" * 9_989, b"v", b"p/", b"", None), EngineError, 2102),  # one byte too long once stamped
    ((0, b"e/", b"v", b"k" * 9_989, b"", None), EngineError, 2102),
    ((0, b"e/", b"v", b"p/", b"", b"k" * 10_001), EngineError, 2102),
    ((0, b"e/", b"v" * 100_001, b"p/", b"", None), EngineError, 2103),
    ((0, b"e/", b"v", b"p/", b"v" * 100_001, None), EngineError, 2103),
]


@pytest.mark.parametrize("case", BAD, ids=range(len(BAD)))
def test_a_refused_call_writes_none_of_its_rows(db: Database, case: tuple[Any, ...]) -> None:
    """The call is refused whole, as each of its templates would be (the same error and code);
    the transaction goes on and commits the rest; the bell, the entry and the pointer of the
    refused call are nowhere."""
    args, error, code = case
    tr: Any = db.create_transaction()
    tr[b"kept"] = b"1"
    with pytest.raises(error) as caught:
        tr.set_journal_entry(*args)
    assert getattr(caught.value, "code", None) == code
    tr.commit()
    assert [kv.key for kv in db.get_range(b"", b"\xff")] == [b"kept"]  # type: ignore[attr-defined]


def test_the_longest_prefixes_and_values_are_written(db: Database) -> None:
    tr: Any = db.create_transaction()
    tr.set_journal_entry(7, b"e" * 9_988, b"v" * 100_000, b"p" * 9_988, b"w" * 100_000, b"b" * 10_000)
    stamp = tr.get_versionstamp()
    tr.commit()
    s = stamp.wait()
    got = {kv.key: len(kv.value) for kv in db.get_range(b"", b"\xff")}  # type: ignore[attr-defined]
    assert got == {
        b"b" * 10_000: 10,
        b"e" * 9_988 + s + b"\x00\x07": 100_000,
        b"p" * 9_988 + s + b"\x00\x07": 100_000,
    }
