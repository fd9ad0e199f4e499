"""``moves.count_known`` (two counters set as read plus deltas, where nothing conflicts): what
the engine's ``add`` of the deltas leaves, for every length and edge a counter may have; or
False and nothing written where it cannot say (issue 30, fifth pass: its checks moved into
the ``struct.error`` branch)."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.contract import Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.ops.moves.core import count_known

EDGES = [
    None,
    struct.pack("<q", 0),
    struct.pack("<q", 41),
    struct.pack("<q", -3),
    struct.pack("<q", 2**63 - 1),
    struct.pack("<q", -(2**63)),
    b"\x07\x00\x00\x00",
    b"\x01" * 12,
    b"",
]


@pytest.mark.parametrize("a", EDGES)
@pytest.mark.parametrize("b", EDGES)
@pytest.mark.parametrize("deltas", [(1, 1), (-1, 1), (5, -5)])
def test_count_known_leaves_what_add_leaves_or_writes_nothing(
    tmp_path: Path, a: bytes | None, b: bytes | None, deltas: tuple[int, int]
) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    keys = [b"ka", b"kb"]

    def setup(tr: Transaction) -> None:
        for k, v in zip(keys, (a, b), strict=True):
            if v is None:
                tr.clear(k)
            else:
                tr.set(k, v)

    def added(tr: Transaction) -> list[bytes | None]:
        for k, d in zip(keys, deltas, strict=True):
            tr.add(k, struct.pack("<q", d))
        return tr.get_many(keys)

    def known(tr: Transaction) -> tuple[bool, list[bytes | None]]:
        return count_known(tr, keys, tr.get_many(keys), deltas), tr.get_many(keys)

    run_transaction(db, setup)
    want = run_transaction(db, added)
    run_transaction(db, setup)  # back to the values before the adds
    ok, got = run_transaction(db, known)
    eight = all(v is None or len(v) == 8 for v in (a, b))
    assert ok == eight
    assert got == (want if eight else [a, b])
    db.close()
