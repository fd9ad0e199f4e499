"""Engines behind one transaction contract, chosen by URL.

``sqlite:///abs/path.db``, ``sqlite://rel/path.db`` or ``sqlite://~/path.db`` (embedded, the
default; ``?sync=full|normal&lock_timeout=10&mode=rw|ro``), ``memory://``,
``sim://?seed=N&faults=P``, ``fdb://`` or ``fdb:///path/to/fdb.cluster``.
"""

from __future__ import annotations

import os

from fdbqueue.engines.contract import Database, register_bindings_loader
from fdbqueue.engines.url import DEFAULT_URL, parse_url
from fdbqueue.types import ANONYMOUS, check_principal

__all__ = ["open_database"]


def open_database(url: str | None = None, *, principal: str | None = None) -> Database:
    """Open the database ``url`` names (default ``$FDBQUEUE_URL``, else ``./fdbqueue.db``),
    acting for ``principal`` (default ``$FDBQUEUE_PRINCIPAL``, else ``anonymous``): the name
    queues with an owner check rights against (``fdbqueue.ops.privileges``)."""
    who = check_principal(
        principal if principal is not None else os.environ.get("FDBQUEUE_PRINCIPAL") or ANONYMOUS
    )
    db = _open(url)
    db.principal = who
    return db


def _load_fdb_adapters() -> None:
    """Import the FoundationDB engine's opening, which registers the adapters of raw ``fdb``
    objects (``fdbqueue.engines.contract.adopt``): it loads the bindings' Python package only."""
    import fdbqueue.engines.fdb_open  # noqa: F401


register_bindings_loader(_load_fdb_adapters)


def _open(url: str | None) -> Database:
    if url is None:
        url = os.environ.get("FDBQUEUE_URL") or DEFAULT_URL
    parsed = parse_url(url)
    if parsed.scheme == "sqlite":
        from fdbqueue.engines.sqlite.database import open_sqlite

        return open_sqlite(url, parsed)
    if parsed.scheme in ("memory", "sim"):
        from fdbqueue.engines.sim.database import open_sim

        return open_sim(url, parsed)
    from fdbqueue.engines.fdb_open import open_fdb

    return open_fdb(url, parsed)
