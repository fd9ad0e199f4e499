"""The web dashboard: every queue's depth, rates, oldest age and state, updating live; a queue's
messages (browse with a filter), a message's detail and journal history; dead letters redriven
or deleted and queues paused or resumed by a principal with ``admin`` on them; a chart of depth
and rates over the last minutes.

    fdbqueue web --port 8080 [--read-only] [--allowed-host dash.example]   # or:
    with fdbqueue.web.Dashboard(db).start(port=0) as running:
        print(running.url)

The page, its script and its style ship in the package (``static/``): nothing is fetched from
another host at run time.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from fdbqueue.errors import MissingExtraError

try:  # every module of the dashboard needs both
    import starlette  # noqa: F401
    import uvicorn
except ImportError as exc:
    raise MissingExtraError("fdbqueue.web", "web", exc.name) from exc

from fdbqueue.engines.contract import Database
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.web.app import create_app
from fdbqueue.web.hosts import Hosts
from fdbqueue.web.sampler import Sampler

__all__ = ["Dashboard", "Running"]


class Dashboard:
    """The dashboard over ``db``, acting as ``db``'s principal; ``interval`` seconds between
    samples of every queue, ``window`` seconds of them kept for the chart. It answers requests
    for ``localhost``, ``127.0.0.1``, ``[::1]`` and the address it listens on, at its port,
    and for ``allowed_hosts`` (``name``: at any port, ``name:port``): the names a reverse
    proxy passes on (``fdbqueue.web.hosts``, against DNS rebinding)."""

    def __init__(
        self,
        db: Database,
        *,
        read_only: bool = False,
        interval: float = 2.0,
        window: float = 300.0,
        root: tuple[Any, ...] = DEFAULT_ROOT,
        allowed_hosts: Iterable[str] = (),
    ) -> None:
        self.db = db
        self.hosts = Hosts(allowed_hosts)  # QueueError for an entry that is no host name
        self.sampler = Sampler(db, interval=interval, window=window, root=root)
        self.app = create_app(db, self.sampler, read_only=read_only, root=root, hosts=self.hosts)

    def start(self, port: int = 8080, addr: str = "127.0.0.1") -> Running:
        """Serve in a background thread; returns once it accepts connections."""
        sock = listen(addr, port)
        self.hosts.serve_on(addr, sock.getsockname()[1])
        return Running(self, sock)

    def serve(
        self, port: int = 8080, addr: str = "127.0.0.1", *, announce: Callable[[str], None] | None = None
    ) -> None:
        """Serve in this (main) thread until SIGTERM or SIGINT, then return; ``announce`` is
        called with the URL once listening (the port chosen when ``port`` is 0)."""
        sock = listen(addr, port)
        self.hosts.serve_on(addr, sock.getsockname()[1])
        if announce is not None:
            announce(url_of(sock))
        self.sampler.start()
        # uvicorn stops gracefully on these signals, then raises each again for the handler it
        # found: one that does nothing lets the command end normally (exit 0) instead.
        before = {sig: signal.signal(sig, lambda *_: None) for sig in (signal.SIGTERM, signal.SIGINT)}
        try:
            server = uvicorn.Server(_config(self))
            server.run(sockets=[sock])
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)
            self.sampler.close()
            sock.close()


def listen(addr: str, port: int) -> socket.socket:
    """A listening socket on ``addr:port`` (0: any free port); OSError when it is taken."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((addr, port))
        sock.listen(128)
    except OSError:
        sock.close()
        raise
    return sock


def url_of(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://{host if ':' not in host else f'[{host}]'}:{port}"


def _config(dashboard: Dashboard) -> uvicorn.Config:
    return uvicorn.Config(dashboard.app, lifespan="off", log_level="warning", access_log=False)


class Running:
    """A dashboard serving in a background thread: ``url``, ``port``, ``close()``."""

    def __init__(self, dashboard: Dashboard, sock: socket.socket) -> None:
        self.dashboard = dashboard
        self.sock = sock
        self.port = sock.getsockname()[1]
        self.url = url_of(sock)
        dashboard.sampler.start()
        self.server = uvicorn.Server(_config(dashboard))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [sock]}, name="fdbqueue-web", daemon=True
        )
        self.thread.start()
        while not self.server.started and self.thread.is_alive():
            threading.Event().wait(0.01)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
        self.dashboard.sampler.close()
        self.sock.close()

    def __enter__(self) -> Running:
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
