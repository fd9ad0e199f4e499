"""``fdb://...?tenant=NAME``: every transaction in a FoundationDB tenant (real isolation between
teams, which the layer's privileges are not)."""

from __future__ import annotations

from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import ClusterUnavailableError, InvalidURLError
from tests.support.engines import fdb_cluster_file


def test_an_empty_tenant_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidURLError, match="tenant= needs a tenant's name"):
        fdbqueue.open("fdb://" + fdb_cluster_file(tmp_path) + "?tenant=")


def test_a_tenant_url_opens_the_tenant_or_says_why_not(tmp_path: Path) -> None:
    url = "fdb://" + fdb_cluster_file(tmp_path) + "?tenant=team-a"
    from tests.support import fdbdouble

    if fdbdouble.installed() is not None:
        pytest.skip(
            "tenants need a real cluster (tenant_mode=optional_experimental, 'tenant create team-a'); "
            "the C-API double has none"
        )
    try:
        db = fdbqueue.open(url)
    except ClusterUnavailableError as exc:
        # The C-API double and clusters without tenant_mode have no tenants: the error says so.
        assert "tenant 'team-a'" in str(exc) and "tenant create" in str(exc)
        pytest.skip(f"no tenants here: {exc}")
    q = fdbqueue.Queue("jobs")
    mid = q.enqueue(db, b"in the tenant")
    got = q.dequeue(db)
    assert got is not None and got.id == mid
    db.close()
