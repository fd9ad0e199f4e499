"""The engine matrix: the URL a test opens for each engine, and the fdb engine's cluster.

The "fdb" engine runs on a real FoundationDB cluster when one is reachable
(tests/support/fdb_cluster.py) and otherwise through the official bindings over the C-API
double of tests/support/fdbdouble/ (a fresh sim store per test).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from tests.support.fdbdouble import CAPIDouble

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
    from tests.support.fdb_cluster import cluster_or_none, find_cluster

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
    from tests.support import fdbdouble as fdb_double

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
    from tests.support import fdbdouble as fdb_double

    double = fdb_double.installed()
    if double is not None and url.startswith("fdb://"):
        with contextlib.suppress(OSError):
            double.release(url[len("fdb://") :].split("?", 1)[0])


def double_only() -> CAPIDouble:
    """The double, for tests that look behind the bindings; skipped on a real cluster."""
    from tests.support import fdbdouble

    double = fdbdouble.installed()
    if double is None:
        pytest.skip("looks behind the bindings: needs the C-API double, not a real cluster")
    return double
