"""What the FoundationDB engine (``engines/fdb.py``, ``engines/fdb_open.py``) needs that does not
touch the bindings.

The ``fdb://`` URL's parameters checked, the cluster file found as libfdb_c finds it, the
bindings' version read from their metadata, an error's code and description made an
:class:`~fdbqueue.errors.EngineError`, and the journal numbering kept on a raw transaction.
Nothing here imports ``fdb``: ``engines/fdb.py`` and ``engines/fdb_open.py`` stay the modules
that call it, and pass in what they read from it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import weakref
from typing import Any, NamedTuple

from fdbqueue.engines.url import ParsedURL, take_params
from fdbqueue.errors import ClusterUnavailableError, EngineError, InvalidURLError

# API 710 or newer: below 610 ``on_error`` resets the timeout and retry limit, below 700 a
# commit partially resets the transaction (documentation/sphinx/source/api-version-upgrade-guide.rst),
# and 710 is what the oldest supported bindings (7.1) know.
MIN_API_VERSION = 710
DEFAULT_TIMEOUT_SECONDS = 5.0

# Error codes meaning "no answer from the cluster in time" (transaction_timed_out, timed_out).
TIMEOUT_CODES = frozenset({1031, 1004})


def bindings_version(bindings: Any) -> str:
    """The installed ``foundationdb`` wheel's version (``fdb.__version__`` exists only from 8.0)."""
    version = getattr(bindings, "__version__", None)
    if isinstance(version, str):
        return version
    try:
        return importlib.metadata.version("foundationdb")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def latest_api_version(bindings: Any, version: str) -> int:
    """The newest API version the bindings know: ``fdb.LATEST_API_VERSION`` from 7.3; the 7.1
    bindings hard-code their header version (710) in ``api_version``, as major*100 + minor*10."""
    latest = getattr(bindings, "LATEST_API_VERSION", None)
    if isinstance(latest, int):
        return latest
    try:
        major, minor = (int(part) for part in version.split(".")[:2])
    except ValueError:
        return MIN_API_VERSION
    return major * 100 + minor * 10


def client_library_missing(version: str) -> str:
    """What to do when the bindings ``version`` find no libfdb_c."""
    return (
        "the FoundationDB client library (libfdb_c) is not installed on this machine, so the fdb:// "
        "engine cannot run. Install the foundationdb-clients package of a matching version from "
        "the FoundationDB releases (https://github.com/apple/foundationdb/releases); the "
        f"'foundationdb' Python bindings {version} installed here need libfdb_c "
        f"{version.rsplit('.', 1)[0]}. pip cannot install it."
    )


def engine_error(exc: BaseException, during_commit: bool = False) -> EngineError:
    """``exc`` (an ``fdb.FDBError``) as an :class:`EngineError` with its code and description."""
    code = int(getattr(exc, "code", 4100))
    try:
        description: str | None = _text(getattr(exc, "description", "")) or None
    except Exception:  # the description comes from the C library; never mask the code
        description = None
    return EngineError(code, description, during_commit=during_commit)


def _text(description: object) -> str:
    # fdb_get_error's restype is c_char_p: the bindings hand its bytes on as they are.
    return description.decode(errors="replace") if isinstance(description, bytes) else str(description)


# ---------------------------------------------------------------------------------------------
# Opening


class OpenParams(NamedTuple):
    """An ``fdb://`` URL's parameters, checked."""

    api_version: int
    timeout: float
    tenant: str
    cluster_file: str | None  # named in the URL (and present), or None: the default one


def open_params(
    url: str, parsed: ParsedURL, default_api_version: int, latest: int, version: str
) -> OpenParams:
    """Check ``url``'s parameters against the bindings ``version`` (newest API ``latest``).

    Raises :class:`InvalidURLError` for bad parameters and :class:`ClusterUnavailableError`
    when the cluster file it names is missing (that needs no client library to know).
    """
    params = take_params(
        parsed,
        {"api_version": str(default_api_version), "timeout": f"{DEFAULT_TIMEOUT_SECONDS:g}", "tenant": ""},
    )
    tenant = params["tenant"]
    if "tenant" in parsed.params and not tenant:
        raise InvalidURLError(f"tenant= needs a tenant's name in {url}")
    api_version = _parse_api_version(params["api_version"], url, latest, version)
    timeout = _parse_timeout(params["timeout"], url)
    explicit = parsed.path or None
    if explicit is not None and not os.path.isfile(explicit):
        raise ClusterUnavailableError(
            f"FoundationDB cluster file {explicit} does not exist (from {url}); "
            "create it with the cluster's connection string, e.g. docker:docker@127.0.0.1:4500"
        )
    return OpenParams(api_version, timeout, tenant, explicit)


def _parse_api_version(text: str, url: str, latest: int, bindings: str) -> int:
    try:
        version = int(text)
    except ValueError:
        raise InvalidURLError(
            f"api_version must be an integer such as 800 or 730, got {text!r} in {url}"
        ) from None
    if version < MIN_API_VERSION:
        raise InvalidURLError(
            f"api_version={version} in {url} is out of range: fdbqueue needs 710 or newer (before 610 "
            "on_error resets the timeout and retry limit, before 700 commit resets the transaction)"
        )
    if version > latest:
        raise InvalidURLError(
            f"api_version={version} in {url} is out of range: the installed FoundationDB bindings "
            f"{bindings} support {MIN_API_VERSION}..{latest}"
        )
    return version


def _parse_timeout(text: str, url: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise InvalidURLError(f"timeout must be a positive number of seconds, got {text!r} in {url}")
    return seconds


def default_cluster_file_candidates() -> list[str]:
    """Where libfdb_c looks when no cluster file is named (administration.rst), in order."""
    env = os.environ.get("FDB_CLUSTER_FILE")
    if env:
        return [env]
    system = platform.system()
    if system == "Darwin":
        default = "/usr/local/etc/foundationdb/fdb.cluster"
    elif system == "Windows":
        default = r"C:\ProgramData\foundationdb\fdb.cluster"
    else:
        default = "/etc/foundationdb/fdb.cluster"
    return ["fdb.cluster", default]


def default_cluster_file() -> str:
    """The first of :func:`default_cluster_file_candidates` that exists."""
    candidates = default_cluster_file_candidates()
    for path in candidates:
        if os.path.isfile(path):
            return path
    if os.environ.get("FDB_CLUSTER_FILE"):
        raise ClusterUnavailableError(
            f"FoundationDB cluster file {candidates[0]} (from $FDB_CLUSTER_FILE) does not exist"
        )
    raise ClusterUnavailableError(
        "no FoundationDB cluster file: $FDB_CLUSTER_FILE is not set and neither "
        + " nor ".join(os.path.abspath(p) for p in candidates)
        + " exists; name one as fdb:///path/to/fdb.cluster"
    )


def unreachable(exc: BaseException, cluster_file: str, timeout: float) -> ClusterUnavailableError:
    """What the probe's failure ``exc`` (a read version asked for within ``timeout``) means."""
    if int(getattr(exc, "code", 0)) in TIMEOUT_CODES:
        return ClusterUnavailableError(
            f"cannot reach the FoundationDB cluster described by {cluster_file} within {timeout:g} s "
            "(is it running, is its database created, and does its version match this client?)"
        )
    return ClusterUnavailableError(
        f"the FoundationDB cluster described by {cluster_file} refused a read: {engine_error(exc)}"
    )


# ---------------------------------------------------------------------------------------------
# Raw transactions of the caller (``adopt``)

# The journal numbering of a raw ``fdb.Transaction``'s attempt: an attribute of that object
# (the bindings' Transaction has no __slots__), since wrappers are made afresh per call.
JOURNAL_ORDER = "_fdbqueue_journal_order"


class EndsAttempt:
    """Set on a raw ``fdb.Transaction`` in place of its ``on_error`` or ``reset`` (an instance
    attribute shadows the bindings' method): drops the attempt's journal numbering, then calls
    the bindings' method. A caller's own loop (``@fdb.transactional``) ends attempts through
    these alone, so the next attempt numbers its entries from 0 and rings its bells again."""

    __slots__ = ("_method", "_raw")

    def __init__(self, raw: Any, name: str) -> None:
        self._raw = weakref.ref(raw)  # no cycle: the raw transaction is freed when dropped
        self._method = getattr(type(raw), name)

    def __call__(self, *args: Any) -> Any:
        raw = self._raw()
        setattr(raw, JOURNAL_ORDER, None)
        return self._method(raw, *args)
