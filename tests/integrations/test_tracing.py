"""OpenTelemetry: an enqueue inside a span carries ``traceparent`` in the message's headers, and
a Worker (lease and exactly-once) or Dispatcher runs its handler in a CONSUMER span whose
parent is that span. With the OpenTelemetry SDK's in-memory exporter; without the API
installed (a subprocess where it cannot be imported) nothing is added."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("opentelemetry.sdk", reason="the dev extra installs opentelemetry-sdk")

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import fdbqueue
from fdbqueue import Database, Dispatcher, Message, Queue, Worker, aio
from fdbqueue.ops.tracing import TRACEPARENT

_EXPORTER = InMemorySpanExporter()
_PROVIDER = TracerProvider()
_PROVIDER.add_span_processor(SimpleSpanProcessor(_EXPORTER))


@pytest.fixture
def spans() -> Iterator[InMemorySpanExporter]:
    # The global provider can be set once a process: this module's, kept for every test here.
    trace.set_tracer_provider(_PROVIDER)
    _EXPORTER.clear()
    yield _EXPORTER


@pytest.fixture(params=["sqlite", "sim"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}" if request.param == "sqlite" else "sim://")
    yield db
    db.close()


def _produce(db: Database, queue: str) -> tuple[str, Any]:
    tracer = trace.get_tracer("app")
    with tracer.start_as_current_span("place-order") as span:
        mid = Queue(queue).enqueue(db, {"order": 1}, headers={"tenant": "a"})
    return mid, span.get_span_context()


@pytest.mark.parametrize("mode", ["lease", "exactly_once", "dispatcher", "async"])
def test_the_handler_runs_in_the_enqueuers_trace(
    store: Database, spans: InMemorySpanExporter, mode: str
) -> None:
    mid, producer = _produce(store, "jobs")
    m = Queue("jobs").peek(store)
    assert m is not None and m.headers["tenant"] == "a"
    flags = int(producer.trace_flags)
    assert m.headers[TRACEPARENT] == f"00-{producer.trace_id:032x}-{producer.span_id:016x}-{flags:02x}"
    seen: list[Any] = []

    def handle(*args: Any) -> None:
        seen.append(trace.get_current_span().get_span_context())
        with trace.get_tracer("app").start_as_current_span("charge-card"):
            pass

    if mode == "async":

        async def async_handle(m: Message) -> None:
            handle(m)

        asyncio.run(aio.AsyncWorker(store, "jobs", async_handle).run(until_empty=True))
    elif mode == "dispatcher":
        d = Dispatcher(store, "jobs")
        d.add_consumer(handle)
        d.run(until_empty=True)
    else:
        Worker(store, "jobs", handle, mode=mode).run(until_empty=True)
    assert len(seen) == 1
    finished = {s.name: s for s in spans.get_finished_spans()}
    consumer = finished["process jobs"]
    assert consumer.kind == trace.SpanKind.CONSUMER
    assert consumer.parent is not None and consumer.parent.span_id == producer.span_id
    assert consumer.context.trace_id == producer.trace_id == seen[0].trace_id
    assert consumer.attributes is not None and consumer.attributes["messaging.message.id"] == mid
    child = finished["charge-card"]
    assert child.parent is not None and child.parent.span_id == consumer.context.span_id


def test_a_failing_handler_is_recorded_on_its_span_and_still_retried(
    store: Database, spans: InMemorySpanExporter
) -> None:
    fdbqueue.create_queue(store, "jobs", max_deliveries=1)
    _produce(store, "jobs")

    def fail(m: Message) -> None:
        raise ValueError("card declined")

    Worker(store, "jobs", fail).run(until_empty=True)
    (span,) = [s for s in spans.get_finished_spans() if s.name == "process jobs"]
    assert span.status.status_code == trace.StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]
    dead = Queue("jobs.error").peek(store)
    assert dead is not None and dead.reason is not None and "card declined" in dead.reason


def test_no_span_no_header_and_the_callers_own_traceparent_is_kept(
    store: Database, spans: InMemorySpanExporter
) -> None:
    q = Queue("jobs")
    q.enqueue(store, b"plain")
    mine = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    with trace.get_tracer("app").start_as_current_span("outer"):
        q.enqueue(store, b"own", headers={TRACEPARENT: mine})
        q.enqueue_many(store, [b"a", fdbqueue.NewMessage(b"b", headers={"k": "v"})])
    got = list(q.browse(store))
    assert TRACEPARENT not in got[0].headers
    assert got[1].headers[TRACEPARENT] == mine
    assert all(TRACEPARENT in m.headers for m in got[2:]) and got[3].headers["k"] == "v"
    Worker(store, "jobs", lambda m: None).run(until_empty=True)
    names = [s.name for s in spans.get_finished_spans()]
    assert names.count("process jobs") == 3  # the plain message ran without a span


def test_without_the_opentelemetry_api_nothing_is_added(tmp_path: Path) -> None:
    code = (
        "import sys; sys.modules['opentelemetry'] = None\n"  # an import of it now fails
        "import fdbqueue\n"
        "from fdbqueue.ops import tracing\n"
        "assert not tracing.enabled()\n"
        f"db = fdbqueue.open('sqlite://{tmp_path / 'q.db'}')\n"
        "q = fdbqueue.Queue('jobs'); q.enqueue(db, b'x', headers={'k': 'v'})\n"
        "seen = []\n"
        "fdbqueue.Worker(db, 'jobs', lambda m: seen.append(dict(m.headers))).run(until_empty=True)\n"
        "assert seen == [{'k': 'v'}], seen\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
