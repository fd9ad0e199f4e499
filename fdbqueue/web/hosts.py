"""Which requests the dashboard answers: a ``Host`` among the names it serves, and an action's
``Origin`` (when the browser sends one) among them too.

DNS rebinding: a page of ``attacker.example`` has its name re-resolved to 127.0.0.1 and, being
then same-origin with the dashboard in the browser's eyes, reads the queues and posts actions
with the page's own header. What it cannot change is the ``Host`` its requests carry: its own
name. So every route but ``/healthz`` answers only the names the dashboard serves - the address
it listens on, ``localhost``, ``127.0.0.1`` and ``[::1]``, at its port - and those added with
``allowed_hosts`` (``--allowed-host``) for a reverse proxy; anything else is a 400. An action
(a POST) whose ``Origin`` is not one of those names either is a 403: a second check, by the
browser's own account of where the request comes from (OWASP's "Cross-Site Request Forgery
Prevention Cheat Sheet", verifying origin with standard headers). A request without an
``Origin`` is a tool's, not a browser page's, and the ``X-Fdbqueue`` header already keeps
other sites' forms out.

``/healthz`` answers any host: it says only whether the sampler works, and probes (Kubernetes
sends the pod's address) must reach it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from fdbqueue.errors import QueueError

DEFAULT_NAMES = ("localhost", "127.0.0.1", "[::1]")
ANY_HOST_PATHS = frozenset({"/healthz"})
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
_WILDCARDS = ("", "0.0.0.0", "::", "[::]")
# A host name (letters, digits, '-', '_', '.') or a bracketed IPv6 address, then maybe a port.
_ENTRY = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9_](?:[a-z0-9_.-]*[a-z0-9_])?)(?::([0-9]{1,5}))?")


def split_authority(text: str) -> tuple[str, int | None] | None:
    """``name[:port]`` as (lower-case name, port or None); None when it is not one."""
    m = _ENTRY.fullmatch(text.strip().lower())
    if m is None:
        return None
    port = None if m.group(2) is None else int(m.group(2))
    if port is not None and not 0 < port < 65536:
        return None
    return m.group(1), port


class Hosts:
    """The names a dashboard serves: the defaults at the port it listens on (set by
    :meth:`serve_on`) and ``extra`` entries - ``name`` (at any port: a proxy's own) or
    ``name:port`` (at that port only)."""

    def __init__(self, extra: Iterable[str] = ()) -> None:
        if isinstance(extra, str):
            extra = [extra]
        entries: list[str] = []
        self._any_port: set[str] = set()
        self._extra_pairs: set[tuple[str, int]] = set()
        for entry in extra:
            parsed = split_authority(entry) if isinstance(entry, str) else None
            if parsed is None:
                raise QueueError(
                    f"allowed host {entry!r} is not a host name or address with an optional port "
                    "(dash.example, dash.example:8443, [::1]:8080)"
                )
            name, port = parsed
            entries.append(name if port is None else f"{name}:{port}")
            if port is None:
                self._any_port.add(name)
            else:
                self._extra_pairs.add((name, port))
        self.extra = tuple(entries)
        self._served: set[tuple[str, int]] = set()

    def serve_on(self, addr: str, port: int) -> None:
        """The defaults at the address and port the dashboard listens on."""
        names = set(DEFAULT_NAMES)
        if addr.lower() not in _WILDCARDS:  # a wildcard is no name a browser asks for
            names.add(f"[{addr.lower()}]" if ":" in addr else addr.lower())
        self._served = {(n, port) for n in names}

    def allows(self, name: str, port: int) -> bool:
        return name in self._any_port or (name, port) in self._extra_pairs or (name, port) in self._served

    def allows_host(self, host: str) -> bool:
        """Whether a ``Host`` header names this dashboard (no port: HTTP's 80)."""
        parsed = split_authority(host) if host else None
        return parsed is not None and self.allows(parsed[0], 80 if parsed[1] is None else parsed[1])

    def allows_origin(self, origin: str) -> bool:
        """Whether an ``Origin`` header (``scheme://host[:port]``) is one of these names."""
        try:
            url = urlsplit(origin)
            port = url.port
        except ValueError:
            return False
        if url.scheme not in ("http", "https") or not url.hostname or url.path or url.query:
            return False
        name = f"[{url.hostname}]" if ":" in url.hostname else url.hostname
        return self.allows(name, port if port is not None else (443 if url.scheme == "https" else 80))


class HostGuard:
    """ASGI middleware: 400 for a ``Host`` the dashboard does not serve (every route but
    ``/healthz``), 403 for an action whose ``Origin`` it does not serve."""

    def __init__(self, app: ASGIApp, hosts: Hosts) -> None:
        self.app = app
        self.hosts = hosts

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["path"] not in ANY_HOST_PATHS:
            headers = Headers(scope=scope)
            hosts = headers.getlist("host")
            if len(hosts) != 1 or not self.hosts.allows_host(hosts[0]):
                shown = hosts[0] if len(hosts) == 1 else hosts
                refused = JSONResponse(
                    {
                        "error": f"this dashboard does not serve the host {shown!r} (a DNS rebinding "
                        "page's?); behind a proxy, name it with --allowed-host",
                        "kind": "RefusedActionError",
                    },
                    status_code=400,
                )
                await refused(scope, receive, send)
                return
            origin = headers.get("origin")
            if (
                scope["method"] not in SAFE_METHODS
                and origin is not None
                and not self.hosts.allows_origin(origin)
            ):
                refused = JSONResponse(
                    {
                        "error": f"actions come from the dashboard's own page: origin {origin!r} "
                        "is not one it serves (--allowed-host names more)",
                        "kind": "RefusedActionError",
                    },
                    status_code=403,
                )
                await refused(scope, receive, send)
                return
        await self.app(scope, receive, send)
