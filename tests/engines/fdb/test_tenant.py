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
    from fdbqueue.engines.fdb import BINDINGS_VERSION
    from tests.support import fdbdouble

    if BINDINGS_VERSION.startswith("8."):
        pytest.skip("the 8.0 bindings have no tenants: see test_bindings_without_tenants_refuse_a_tenant_url")

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


def test_bindings_without_tenants_refuse_a_tenant_url(tmp_path: Path) -> None:
    """The 8.0 bindings keep ``Database.open_tenant`` only so that 7.x programs load: it
    returns None (bindings/python/fdb/impl.py, "Returning `None` here ... clients don't think
    that they are able to obtain tenant-related functionality"). ``?tenant=`` is refused there
    with a clear error, before anything runs outside the tenant."""
    from fdbqueue.engines.fdb import BINDINGS_VERSION

    if not BINDINGS_VERSION.startswith("8."):
        pytest.skip(f"the {BINDINGS_VERSION} bindings provide tenants (Database.open_tenant)")
    with pytest.raises(InvalidURLError, match=r"tenant=team-a.*8\.0.*7\.1 or 7\.3"):
        fdbqueue.open("fdb://" + fdb_cluster_file(tmp_path) + "?tenant=team-a")
