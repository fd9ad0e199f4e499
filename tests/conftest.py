"""Shared fixtures: the engine matrix every conformance test runs on."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.base import Database

ENGINES = ["memory", "sim", "sqlite", "fdb"]


def engine_url(engine: str, tmp_path: Path) -> str:
    """The URL a test opens for ``engine``; skips fdb when no cluster is reachable."""
    if engine == "memory":
        return "memory://"
    if engine == "sim":
        # Conformance runs sim without faults: its results must be deterministic.
        return "sim://?seed=1&faults=0"
    if engine == "sqlite":
        return f"sqlite://{tmp_path / 'store.db'}?sync=normal"
    if engine == "fdb":
        from tests.fdb_cluster import find_cluster

        return "fdb://" + find_cluster()
    raise ValueError(engine)


@pytest.fixture(params=ENGINES)
def engine(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def db(engine: str, tmp_path: Path) -> Iterator[Database]:
    database = fdbqueue.open(engine_url(engine, tmp_path))
    if engine == "fdb":
        # A shared cluster: start each test from an empty keyspace.
        database.clear_range(b"", b"\xff")  # type: ignore[attr-defined]
    try:
        yield database
    finally:
        database.close()
