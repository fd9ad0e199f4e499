"""Shared fixtures: the engine matrix every conformance test runs on (tests/support/engines.py).

Every test that runs on the "fdb" engine, and every test of tests/engines/fdb/, carries the
``fdb_engine`` marker: ``-m fdb_engine`` selects them (the bindings matrix of .ci/run).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import fdbqueue
from fdbqueue.engines.contract import Database
from tests.support.engines import ENGINES, engine_url, fdb_cluster_file, release_fdb

if TYPE_CHECKING:
    from fdbqueue.engines.fdb import FDBDatabase


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db(engine: str, tmp_path: Path) -> Iterator[Database]:
    url = engine_url(engine, tmp_path)
    database = fdbqueue.open(url)
    if engine == "fdb":
        # A shared cluster: start each test from an empty keyspace.
        database.clear_range(b"", b"\xff")  # type: ignore[attr-defined]
    try:
        yield database
    finally:
        database.close()
        if engine == "fdb":
            release_fdb(url)


@pytest.fixture
def fdb_db(tmp_path: Path) -> Iterator[FDBDatabase]:
    """An fdb:// database: a real cluster's (emptied), or a fresh store of the double."""
    url = "fdb://" + fdb_cluster_file(tmp_path)
    db = fdbqueue.open(url)
    from fdbqueue.engines import fdb as fdb_engine

    assert isinstance(db, fdb_engine.FDBDatabase)
    db.clear_range(b"", b"\xff")
    try:
        yield db
    finally:
        db.close()
        release_fdb(url)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark what runs on the fdb engine (``-m fdb_engine``): tests/engines/fdb/ and the matrix's fdb leg."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_fdb = callspec is not None and "fdb" in callspec.params.values()
        if on_fdb or item.path.parts[-3:-1] == ("engines", "fdb"):
            item.add_marker(pytest.mark.fdb_engine)
