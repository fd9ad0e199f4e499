"""OpenTelemetry: the enqueuer's trace carried to the handler in the message's headers.

When the OpenTelemetry API is installed (``pip install opentelemetry-api``, with an SDK to
export), an enqueue made while a span is current adds the W3C Trace Context headers
``traceparent`` (and ``tracestate``) to the message, unless the caller set one; a Worker or
Dispatcher then runs the handler of a message carrying them inside a CONSUMER span
``process <queue>`` whose parent is that span, so the handler's own spans join the producer's
trace (the messaging semantic conventions of OpenTelemetry: "Context propagation"). Without
the API installed, or with no current span, nothing is added and handlers run as they are.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

try:
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # the API is optional: without it there is nothing to carry
    _context = None  # type: ignore[assignment]
    _propagate = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

TRACEPARENT, TRACESTATE = "traceparent", "tracestate"
T = TypeVar("T")


def enabled() -> bool:
    """Whether the OpenTelemetry API is installed."""
    return _trace is not None


def inject(headers: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """``headers`` with the current span's ``traceparent`` (and ``tracestate``) added; as
    they are when OpenTelemetry is not installed, no span is current, or the caller set a
    ``traceparent`` of their own."""
    if _trace is None or (headers is not None and TRACEPARENT in headers):
        return headers
    # An empty context holds no span (every enqueue asks: one call instead of five).
    if not _context.get_current():
        return headers
    if not _trace.get_current_span().get_span_context().is_valid:
        return headers
    carrier: dict[str, str] = {}
    _propagate.inject(carrier)
    if TRACEPARENT not in carrier:
        return headers  # a propagator configured without Trace Context
    out = dict(headers or {})
    out[TRACEPARENT] = carrier[TRACEPARENT]
    if TRACESTATE in carrier:
        out[TRACESTATE] = carrier[TRACESTATE]
    return out


def run(queue: str, message_id: str, headers: Mapping[str, Any], handler: Callable[..., T], *args: Any) -> T:
    """``handler(*args)`` inside :func:`span`."""
    if _trace is None or TRACEPARENT not in headers:
        return handler(*args)
    with span(queue, message_id, headers):
        return handler(*args)


@contextlib.contextmanager
def span(queue: str, message_id: str, headers: Mapping[str, Any]) -> Iterator[None]:
    """A CONSUMER span ``process <queue>``, current inside the block, that continues the trace
    of the message's ``traceparent`` when it has one (and OpenTelemetry is installed; else
    nothing). It records an exception leaving the block, which propagates as it is. A plain
    context manager: ``fdbqueue.aio`` wraps an awaited handler in it too."""
    if _trace is None or TRACEPARENT not in headers:
        yield
        return
    parent = _propagate.extract({k: str(headers[k]) for k in (TRACEPARENT, TRACESTATE) if k in headers})
    tracer = _trace.get_tracer("fdbqueue")
    attributes = {
        "messaging.system": "fdbqueue",
        "messaging.operation.type": "process",
        "messaging.destination.name": queue,
        "messaging.message.id": message_id,
    }
    with tracer.start_as_current_span(
        f"process {queue}", context=parent, kind=_trace.SpanKind.CONSUMER, attributes=attributes
    ):
        yield
