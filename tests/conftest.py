"""Shared fixtures: the engine matrix every conformance test runs on.

The "fdb" engine runs on a real FoundationDB cluster when one is reachable
(tests/fdb_cluster.py) and otherwise through the official bindings over the C-API double
of tests/fdbdouble/ (a fresh sim store per test). Every test that runs on it, and every
test of tests/test_fdb_*.py, carries the ``fdb_engine`` marker: ``-m fdb_engine``
selects them (the bindings matrix of .ci/run).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import fdbqueue
from fdbqueue.engines.contract import Database

if TYPE_CHECKING:
    from fdbqueue.engines.fdb import FDBDatabase
    from tests.fdbdouble import CAPIDouble

ENGINES = ["memory", "sim", "sqlite", "fdb"]


def engine_url(engine: str, tmp_path: Path) -> str:
    """The URL a test opens for ``engine``."""
    if engine == "memory":
        return "memory://"
    if engine == "sim":
        # Conformance runs sim without faults: its results must be deterministic.
        return "sim://?seed=1&faults=0"
    if engine == "sqlite":
        return f"sqlite://{tmp_path / 'store.db'}?sync=normal"
    if engine == "fdb":
        return "fdb://" + fdb_cluster_file(tmp_path)
    raise ValueError(engine)


def fdb_cluster_file(directory: Path) -> str:
    """A real cluster's cluster file when one is reachable, else a fresh store of the double.

    With ``$FDB_CLUSTER_FILE`` set, the tests were asked to run on that cluster: when it cannot
    be reached they skip with the reason rather than quietly run over the double.
    """
    from tests.fdb_cluster import cluster_or_none, find_cluster

    if os.environ.get("FDB_CLUSTER_FILE"):
        try:
            return find_cluster()
        except pytest.skip.Exception as exc:
            if os.environ.get("FDBQUEUE_REQUIRE_FDB"):  # the bindings matrix of .ci/run
                pytest.fail(str(exc))
            raise
    real = cluster_or_none()
    if real is not None:
        return real
    from tests import fdbdouble as fdb_double

    try:
        double = fdb_double.install()
    except RuntimeError as exc:
        reason = f"FoundationDB tests skipped: the C-API double cannot be installed: {exc}"
        if os.environ.get("FDBQUEUE_REQUIRE_FDB"):  # the bindings matrix of .ci/run
            pytest.fail(reason)
        pytest.skip(reason)
    return double.new_cluster_file(str(directory))


def release_fdb(url: str) -> None:
    """Free the double's store behind ``url`` (no-op on a real cluster)."""
    from tests import fdbdouble as fdb_double

    double = fdb_double.installed()
    if double is not None and url.startswith("fdb://"):
        with contextlib.suppress(OSError):
            double.release(url[len("fdb://") :].split("?", 1)[0])


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


def double_only() -> CAPIDouble:
    """The double, for tests that look behind the bindings; skipped on a real cluster."""
    from tests import fdbdouble

    double = fdbdouble.installed()
    if double is None:
        pytest.skip("looks behind the bindings: needs the C-API double, not a real cluster")
    return double


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark what runs on the fdb engine (``-m fdb_engine``)."""
    for item in items:
        callspec = getattr(item, "callspec", None)
        on_fdb = callspec is not None and "fdb" in callspec.params.values()
        if on_fdb or item.path.name.startswith("test_fdb_"):
            item.add_marker(pytest.mark.fdb_engine)
