"""The engines' clock alias (``LocalDatabase.clock``): ``time.monotonic`` itself while no test
froze or moved the clock, else ``versions.monotonic``. These tests try to break the shortcut:
a clock moved on without freezing, frozen after a transaction began, thawed with what it was
moved by kept; each must still age a transaction past the 5-second window.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines import versions
from fdbqueue.engines.local.transaction import LocalDatabase
from fdbqueue.engines.sqlite.database import SqliteDatabase
from fdbqueue.errors import EngineError
from fdbqueue.store.clock import fake_clock


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDatabase]:
    handle = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    assert isinstance(handle, SqliteDatabase)
    try:
        yield handle
    finally:
        handle.close()


def _too_old(db: SqliteDatabase, move: object) -> int:
    """A transaction that reads, is moved on by ``move()``, writes and commits: the error code."""
    tr = db.create_transaction()
    assert tr.get(b"k") is None  # the read version taken: the window counts from here
    move()  # type: ignore[operator]
    tr[b"k"] = b"v"
    with pytest.raises(EngineError) as err:
        tr.commit()
    return err.value.code


def test_the_alias_agrees_with_the_engines_clock() -> None:
    assert abs(LocalDatabase.clock() - versions.monotonic()) < 0.5


def test_a_clock_moved_on_without_freezing_still_ages_a_transaction(db: SqliteDatabase) -> None:
    # Not frozen, only moved on: the alias must stop being time.monotonic, which knows no advance.
    assert _too_old(db, lambda: versions.advance(6_000_000)) == 1007
    assert abs(db.clock() - versions.monotonic()) < 0.5  # the move kept after it


def test_a_clock_frozen_after_the_transaction_began_still_ages_it(db: SqliteDatabase) -> None:
    def freeze_and_move() -> None:
        clock = fake_clock()
        moved = clock.__enter__()
        try:
            moved.advance(6.0)
        finally:
            clock.__exit__(None, None, None)

    assert _too_old(db, freeze_and_move) == 1007
    # Thawed, with the advance kept: the alias reads the engines' clock, never behind it.
    assert db.clock() >= versions.monotonic() - 0.5
    assert db.clock() >= time.monotonic() + 6.0


def test_a_frozen_clock_is_read_through_the_alias(db: SqliteDatabase) -> None:
    with fake_clock():
        first = db.clock()
        time.sleep(0.05)
        assert db.clock() - first < 0.01  # frozen: only its microsecond ticks
    assert db.clock() - versions.monotonic() < 0.5
