"""Engines behind one transaction contract, chosen by URL.

``sqlite:///abs/path.db``, ``sqlite://rel/path.db`` or ``sqlite://~/path.db`` (embedded, the
default; ``?sync=full|normal&lock_timeout=10&mode=rw|ro``), ``memory://``,
``sim://?seed=N&faults=P``, ``fdb://`` or ``fdb:///path/to/fdb.cluster``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

from fdbqueue.engines.base import Database
from fdbqueue.errors import InvalidURLError

DEFAULT_URL = "sqlite://fdbqueue.db"
SCHEMES = ("sqlite", "memory", "sim", "fdb")


@dataclass(frozen=True)
class ParsedURL:
    """A database URL taken apart: scheme, path (may be empty) and query parameters."""

    scheme: str
    path: str
    params: dict[str, str] = field(default_factory=dict)


def parse_url(url: str) -> ParsedURL:
    """Split ``url``; raises :class:`InvalidURLError` for a malformed or unknown one."""
    if not isinstance(url, str) or not url.strip():
        raise InvalidURLError(f"database URL must be a non-empty string, got {url!r}")
    if "://" not in url:
        raise InvalidURLError(
            f"malformed database URL {url!r}: expected scheme://..., e.g. sqlite:///tmp/q.db"
        )
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise InvalidURLError(
            f"unknown engine {parts.scheme!r} in {url!r}; use one of: "
            + ", ".join(f"{s}://" for s in SCHEMES)
        )
    # sqlite:///abs/path -> '/abs/path'; sqlite://rel/path -> 'rel/path' (netloc + path).
    path = unquote(parts.netloc + parts.path)
    try:
        pairs = parse_qsl(parts.query, keep_blank_values=True, strict_parsing=bool(parts.query))
    except ValueError as exc:
        raise InvalidURLError(f"malformed query string in {url!r}: {exc}") from None
    params: dict[str, str] = {}
    for key, value in pairs:
        if key in params:
            raise InvalidURLError(f"parameter {key!r} given twice in {url!r}")
        params[key] = value
    return ParsedURL(scheme, path, params)


def take_params(parsed: ParsedURL, allowed: dict[str, str]) -> dict[str, str]:
    """Merge ``parsed.params`` over ``allowed`` defaults; unknown names are an error."""
    unknown = sorted(set(parsed.params) - set(allowed))
    if unknown:
        raise InvalidURLError(
            f"unknown parameter(s) {', '.join(unknown)} for {parsed.scheme}://; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}"
        )
    return {**allowed, **parsed.params}


def open_database(url: str | None = None) -> Database:
    """Open the database ``url`` names (default ``$FDBQUEUE_URL``, else ``./fdbqueue.db``)."""
    if url is None:
        url = os.environ.get("FDBQUEUE_URL") or DEFAULT_URL
    parsed = parse_url(url)
    if parsed.scheme == "sqlite":
        from fdbqueue.engines.sqlite import open_sqlite

        return open_sqlite(url, parsed)
    if parsed.scheme in ("memory", "sim"):
        from fdbqueue.engines.sim import open_sim

        return open_sim(url, parsed)
    from fdbqueue.engines.fdb import open_fdb

    return open_fdb(url, parsed)
