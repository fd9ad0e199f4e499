"""The dashboard's ASGI app (Starlette): the page and its assets from the package, and a JSON API.

    GET  /                       the page (queues, a queue, a message: routes after '#')
    GET  /api/overview           every queue's figures and rates, and the totals' series
    GET  /api/queue?name=Q       a queue's figures, settings, series and rights
    GET  /api/messages?queue=Q&state=ready|leased|delayed&filter=F&limit=N&after=CURSOR
    GET  /api/message?queue=Q&id=ID      a message and its journal history
    GET  /api/workers            the registry of workers: host, pid, queues, counts, in hand
    POST /api/pause    {"queue", "direction": "enqueue"|"dequeue"|"both", "paused": bool}
    POST /api/redrive  {"queue", "ids": [...]} or {"queue", "filter": "name=value ..."}
    POST /api/delete   {"queue", "ids": [...]}

Reads need ``browse`` and actions ``admin`` on the queue, for the principal the dashboard's
database was opened as (the layer's checks: ``AccessDeniedError`` is a 403). ``read_only``
refuses every action whatever the rights. An action must come from the page itself: a JSON
body with the ``X-Fdbqueue`` header, which a page of another site cannot send without a CORS
preflight this app never grants (OWASP's "Cross-Site Request Forgery Prevention Cheat Sheet",
custom request headers). Every route but ``/healthz`` answers only the names the dashboard
serves, and an action with an ``Origin`` only from one of them (``fdbqueue.web.hosts``: DNS
rebinding).
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable
from importlib import resources
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.responses import JSONResponse as _StarletteJSON
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from fdbqueue.engines.contract import Database
from fdbqueue.errors import (
    AccessDeniedError,
    EngineError,
    QueueError,
    QueueNotFoundError,
    RefusedActionError,
)
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.store.record import json_safe
from fdbqueue.web import views
from fdbqueue.web.hosts import HostGuard, Hosts
from fdbqueue.web.sampler import Sampler, rated

STATIC = Path(str(resources.files("fdbqueue.web") / "static"))
ACTION_HEADER = "x-fdbqueue"


class JSONResponse(_StarletteJSON):
    """Starlette's, but whatever a store holds renders: a lone surrogate (not UTF-8) or a NaN
    (not JSON) in a header or reason written before enqueue refused them is shown escaped
    (:func:`fdbqueue.store.record.json_safe`), not a 500 for every page of its queue."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # UnicodeEncodeError is one, as is json's "Out of range float"
            return super().render(json_safe(content))


def create_app(
    db: Database,
    sampler: Sampler,
    *,
    read_only: bool = False,
    root: tuple[Any, ...] = DEFAULT_ROOT,
    hosts: Hosts | None = None,
) -> Starlette:
    """The dashboard over ``db`` (as its principal), its figures from ``sampler``, answering
    the names of ``hosts`` (``fdbqueue.web.hosts``; None: only localhost's, at any port -
    for an app served by other means than :class:`~fdbqueue.web.Dashboard`)."""

    def overview(request: Request) -> JSONResponse:
        s = sampler.latest
        return JSONResponse(
            {
                "time": time.time(),
                "principal": db.principal,
                "read_only": read_only,
                "sampled_at": s.at,
                "sample_seconds": s.took,
                "interval": sampler.interval,
                "error": s.error,
                "queues": [views.stats_dict(st, s.rates.get(st.name)) for st in s.stats],
                "series": rated(sampler.history(None)),
            }
        )

    def queue(request: Request) -> JSONResponse:
        name = request.query_params.get("name", "")
        out = views.queue_detail(db, name, root=root)
        s = sampler.latest
        if name in s.rates:
            out["stats"]["ready_rate"], out["stats"]["done_rate"] = s.rates[name]
        out["series"] = rated(sampler.history(name))
        out["read_only"] = read_only
        out["principal"] = db.principal
        return JSONResponse(out)

    def messages(request: Request) -> JSONResponse:
        p = request.query_params
        try:
            limit = int(p.get("limit", "50"))
        except ValueError:
            raise QueueError(f"limit must be a number, got {p.get('limit')!r}") from None
        out = views.messages(
            db,
            p.get("queue", ""),
            state=p.get("state", "ready"),
            filter=p.get("filter", ""),
            limit=limit,
            after=p.get("after") or None,
            root=root,
        )
        return JSONResponse(out)

    def message(request: Request) -> JSONResponse:
        p = request.query_params
        out = views.message(db, p.get("queue", ""), p.get("id", ""), root=root)
        if out["state"] is not None:
            return JSONResponse(out)
        out["error"] = f"no message {out['id']!r} in queue {out['queue']!r}"  # its history may remain
        return JSONResponse(out, status_code=404)

    def workers(request: Request) -> JSONResponse:
        out = views.workers(db, root=root)
        out["principal"] = db.principal
        out["read_only"] = read_only
        return JSONResponse(out)

    async def action(request: Request) -> dict[str, Any]:
        if read_only:
            raise RefusedActionError("this dashboard is read-only (fdbqueue web --read-only)")
        if request.headers.get(ACTION_HEADER) != "1":
            raise RefusedActionError("actions come from the dashboard's own page (X-Fdbqueue header missing)")
        try:
            body = json.loads(await request.body())
        except ValueError:
            raise QueueError("the request body must be JSON") from None
        if not isinstance(body, dict):
            raise QueueError("the request body must be a JSON object")
        return body

    def ids_of(body: dict[str, Any]) -> list[str]:
        ids = body.get("ids")
        if not isinstance(ids, list) or not ids or not all(isinstance(i, str) and i for i in ids):
            raise QueueError("ids must be a non-empty list of message ids")
        return ids

    def acted(result: dict[str, Any]) -> JSONResponse:
        sampler.wake()  # the overview shows the effect at the next poll
        return JSONResponse(result)

    async def pause(request: Request) -> JSONResponse:
        body = await action(request)
        return acted(
            {
                "paused": await _thread(
                    views.pause, db, body.get("queue"), body.get("direction"), body.get("paused"), root=root
                )
            }
        )

    async def redrive(request: Request) -> JSONResponse:
        body = await action(request)
        ids = ids_of(body) if "ids" in body else None
        flt = body.get("filter", "")
        if not isinstance(flt, str):
            raise QueueError("filter must be a string of name=value terms")
        n = await _thread(views.redrive_dead, db, body.get("queue"), ids, flt, root=root)
        return acted({"redriven": n})

    async def delete(request: Request) -> JSONResponse:
        body = await action(request)
        n = await _thread(views.delete, db, body.get("queue"), ids_of(body), root=root)
        return acted({"deleted": n})

    def index(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"cache-control": "no-cache"})

    def health(request: Request) -> JSONResponse:
        s = sampler.latest
        return JSONResponse(
            {"ok": s.error is None, "error": s.error}, status_code=200 if s.error is None else 503
        )

    routes = [
        Route("/", index),
        Route("/healthz", health),
        Route("/api/overview", overview),
        Route("/api/queue", queue),
        Route("/api/messages", messages),
        Route("/api/message", message),
        Route("/api/workers", workers),
        Route("/api/pause", pause, methods=["POST"]),
        Route("/api/redrive", redrive, methods=["POST"]),
        Route("/api/delete", delete, methods=["POST"]),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        RefusedActionError: _error(403),
        AccessDeniedError: _error(403),
        QueueNotFoundError: _error(404),
        QueueError: _error(400),
        EngineError: _error(503),
    }
    if hosts is None:
        hosts = Hosts(["localhost", "127.0.0.1", "[::1]"])
    return Starlette(
        routes=routes,
        exception_handlers=handlers,
        middleware=[Middleware(HostGuard, hosts=hosts), Middleware(_Timing)],
    )


async def _thread(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Run a blocking database call off the event loop (Starlette's thread pool)."""
    from starlette.concurrency import run_in_threadpool

    return await run_in_threadpool(fn, *args, **kwargs)


def _error(status: int) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def handle(request: Request, exc: Exception) -> Response:
        return JSONResponse({"error": str(exc), "kind": type(exc).__name__}, status_code=status)

    return handle


class _Timing(BaseHTTPMiddleware):
    """``Server-Timing: app;dur=<ms>``: the server's own time for a request, which the
    browser's developer tools and scripts/bench_web.py read."""

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        started = time.perf_counter()
        response = await call_next(request)
        response.headers["server-timing"] = f"app;dur={(time.perf_counter() - started) * 1000:.1f}"
        return response
