"""Database URLs taken apart, for :func:`fdbqueue.engines.open_database` and each engine.

Its own module so that the engines can read their parameters without importing the package
``fdbqueue.engines``, which imports them (an import cycle otherwise).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote, urlsplit

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
