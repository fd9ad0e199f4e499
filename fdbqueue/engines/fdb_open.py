"""How a FoundationDB database comes to be: opened from an ``fdb://`` URL (:func:`open_fdb`:
the API version selected once per process, the cluster file, a tenant, a probe of the
cluster), or adopted from a raw object of the bindings that a caller hands over
(:func:`adopt_fdb_database`, :func:`adopt_fdb_transaction`; ``engines/contract.py``
``adopt``, which this module's import registers them for).

Apart from :mod:`.fdb`, the wrappers every operation runs through, because this runs once per
database. Both call the untyped ``fdb`` package, and no other module does. Every call here
that can raise ``fdb.FDBError`` comes after ``fdb.api_version()``, when the bindings define
it (the wrappers' ``_FDBError``, bound then).
"""

from __future__ import annotations

from typing import Any

import fdb

from fdbqueue.engines.contract import register_bindings_adapter
from fdbqueue.engines.fdb import (
    BINDINGS_VERSION,
    CLIENT_LIBRARY_MISSING,
    DEFAULT_API_VERSION,
    LATEST_API_VERSION,
    FDBDatabase,
    FDBTransaction,
    _bind,
)
from fdbqueue.engines.fdb_support import (
    MIN_API_VERSION,
    default_cluster_file,
    engine_error,
    open_params,
    unreachable,
)
from fdbqueue.engines.url import ParsedURL
from fdbqueue.errors import ClusterUnavailableError, InvalidURLError, QueueError

__all__ = ["adopt_fdb_database", "adopt_fdb_transaction", "open_fdb"]


# ---------------------------------------------------------------------------------------------
# Raw objects of the bindings handed to fdbqueue (engines/contract.py ``adopt``)


def _bindings_selected() -> int:
    if not fdb.is_api_version_selected():
        raise QueueError("an fdb object was passed before fdb.api_version() was called")
    version = int(fdb.get_api_version())
    if version < MIN_API_VERSION:
        raise QueueError(
            f"this process selected FoundationDB API version {version}; fdbqueue needs 710 or newer"
        )
    _bind(fdb)
    return version


def adopt_fdb_database(raw: Any) -> FDBDatabase:
    """A raw ``fdb.Database`` behind the contract: fdbqueue commits and retries its transactions."""
    return FDBDatabase("fdb:// (an fdb.Database of the caller)", raw, "", _bindings_selected())


def adopt_fdb_transaction(raw: Any) -> FDBTransaction:
    """A raw ``fdb.Transaction`` behind the contract, joining it: the caller commits and retries.

    Its ``on_finish`` callbacks never run (the caller's loop commits the raw transaction),
    so what the layer does after a caller's attempt fails (counting a failed delivery)
    does not happen; pass an ``FDBTransaction`` for that.
    """
    return FDBTransaction(adopt_fdb_database(raw.db), raw)


register_bindings_adapter("database", adopt_fdb_database)
register_bindings_adapter("transaction", adopt_fdb_transaction)


# ---------------------------------------------------------------------------------------------
# Opening


def open_fdb(url: str, parsed: ParsedURL) -> FDBDatabase:
    """Open ``fdb://`` (default cluster file) or ``fdb:///path/to/fdb.cluster``.

    Raises :class:`InvalidURLError` for bad parameters and :class:`ClusterUnavailableError`
    when the client library, the cluster file or the cluster itself is missing.
    """
    api_version, timeout, tenant, explicit = open_params(
        url, parsed, DEFAULT_API_VERSION, LATEST_API_VERSION, BINDINGS_VERSION
    )
    _select_api_version(api_version)
    cluster_file = explicit if explicit is not None else default_cluster_file()
    try:
        raw = fdb.open(cluster_file)
    except fdb.FDBError as exc:
        raise ClusterUnavailableError(
            f"cannot open the FoundationDB cluster file {cluster_file}: {engine_error(exc)}"
        ) from exc
    _probe(raw, cluster_file, timeout)
    if tenant:
        # Every transaction then runs in the tenant's key space: FoundationDB's isolation
        # between teams (documentation: tenants.rst), which the layer's privileges are not.
        opener = getattr(raw, "open_tenant", None)
        if opener is None or BINDINGS_VERSION.split(".")[0] not in ("7", "unknown"):
            # The 8.0 bindings keep Database.open_tenant only so that 7.x programs load; it
            # returns None (bindings/python/fdb/impl.py: "clients don't think that they are
            # able to obtain tenant-related functionality"). Refused before anything runs
            # outside the tenant.
            raise InvalidURLError(
                f"tenant={tenant} needs FoundationDB Python bindings with tenants: the installed "
                f"{BINDINGS_VERSION} bindings have none (8.0 dropped them); install the 7.1 or 7.3 "
                "bindings (pip install 'foundationdb>=7.1,<8') or open the URL without tenant="
            )
        try:
            raw = opener(tenant.encode())
        except fdb.FDBError as exc:
            raise ClusterUnavailableError(
                f"cannot open FoundationDB tenant {tenant!r} of {cluster_file}: {exc} (the cluster "
                "needs a tenant_mode that allows tenants, and the tenant made with fdbcli's "
                "'tenant create')"
            ) from exc
        if raw is None or not callable(getattr(raw, "create_transaction", None)):
            raise InvalidURLError(
                f"tenant={tenant}: the {BINDINGS_VERSION} bindings' open_tenant gave no tenant; "
                "install the 7.1 or 7.3 bindings or open the URL without tenant="
            )
    return FDBDatabase(url, raw, cluster_file, api_version)


def _select_api_version(version: int) -> None:
    """``fdb.api_version(version)``, once per process; loads libfdb_c."""
    if fdb.is_api_version_selected():
        current = int(fdb.get_api_version())
        if current != version:
            raise InvalidURLError(
                f"this process already selected FoundationDB API version {current}, which cannot "
                f"change; open fdb:// URLs here with api_version={current}, not {version}"
            )
    else:
        try:
            _load_bindings(version)
        except Exception as exc:  # the bindings raise bare Exception / RuntimeError
            message = str(exc)
            if "Unable to locate the FoundationDB API shared library" in message:
                raise ClusterUnavailableError(CLIENT_LIBRARY_MISSING) from None
            raise ClusterUnavailableError(
                f"cannot start the FoundationDB client (api_version={version}): {message}"
            ) from None
    _bind(fdb)


def _load_bindings(version: int) -> None:
    """``fdb.api_version(version)``.

    ``fdbqueue.store.codec`` may have set a stand-in ``fdb.impl`` attribute (never a
    ``sys.modules`` entry) so that ``fdb.tuple`` packs versionstamps without libfdb_c;
    the import inside ``api_version`` still loads the real module.
    """
    fdb.api_version(version)


def _probe(raw: Any, cluster_file: str, timeout: float) -> None:
    """Get a read version within ``timeout`` seconds, or say the cluster is unreachable."""
    try:
        tr = raw.create_transaction()
        tr.options.set_timeout(max(1, round(timeout * 1000)))
        tr.get_read_version().wait()
    except fdb.FDBError as exc:
        raise unreachable(exc, cluster_file, timeout) from exc
