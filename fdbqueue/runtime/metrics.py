"""Prometheus metrics: a collector that reads the queues' durable counters at scrape time,
and the handler durations a worker measures.

The depths and totals come from the counters the layer keeps in the database (``admin.queue_stats``),
read when Prometheus scrapes, not counted in the exporting process: they are right across
restarts and whatever number of processes enqueue and consume. Labels are the queue and the
state or outcome only, never a message id (a label value per message would make a series per
message: Prometheus's "Instrumentation" guide, "Do not overuse labels").

    fdbqueue metrics --port 9464            # or: serve(db, 9464); Worker(..., metrics_port=9464)
    fdbqueue metrics --addr 0.0.0.0         # for a Prometheus on another host (default: 127.0.0.1)

The registry of workers too (:class:`WorkerCollector`): ``fdbqueue_workers{state="alive"}``
and ``{state="dead"}``, and each live worker's ``fdbqueue_worker_messages_handled_total`` and
``fdbqueue_worker_messages_failed_total`` (labels ``worker``, ``host``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from typing import Any

from fdbqueue.errors import MissingExtraError

try:
    from prometheus_client import CollectorRegistry, Histogram, start_http_server
    from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
    from prometheus_client.registry import Collector
except ImportError as exc:
    raise MissingExtraError("fdbqueue.runtime.metrics", "metrics", exc.name) from exc

from fdbqueue.api.admin import all_queue_stats
from fdbqueue.api.workers import WorkerInfo, workers
from fdbqueue.engines.contract import Database
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.types import QueueStats

log = logging.getLogger("fdbqueue.runtime.metrics")

# Buckets for handler durations: a millisecond to ten minutes.
DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 300.0, 600.0)


class QueueCollector(Collector):
    """Every queue's depth by state, its oldest message's age and its totals, read from the
    database at each scrape (a short transaction per hundred queues). Queues the principal may not
    browse are left out."""

    def __init__(self, db: Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
        self.db = db
        self.root = tuple(root)

    def stats(self) -> list[QueueStats]:
        return all_queue_stats(self.db, root=self.root)  # leaves out those not ours to see

    def collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        depth = GaugeMetricFamily(
            "fdbqueue_queue_messages", "Messages in a queue, by state", labels=["queue", "state"]
        )
        age = GaugeMetricFamily(
            "fdbqueue_queue_oldest_message_age_seconds",
            "Age of the oldest ready message (0 when none is ready)",
            labels=["queue"],
        )
        completed = CounterMetricFamily(
            "fdbqueue_messages_completed",
            "Messages consumed: acked or dequeued exactly once",
            labels=["queue"],
        )
        dead = CounterMetricFamily(
            "fdbqueue_messages_dead_lettered", "Messages sent to the error queue", labels=["queue"]
        )
        expired = CounterMetricFamily(
            "fdbqueue_messages_expired", "Messages past their TTL", labels=["queue"]
        )
        paused = GaugeMetricFamily(
            "fdbqueue_queue_paused",
            "1 where a direction of the queue is paused",
            labels=["queue", "direction"],
        )
        for st in self.stats():
            q = st.name
            depth.add_metric([q, "ready"], st.ready)
            depth.add_metric([q, "in_flight"], st.inflight)
            depth.add_metric([q, "delayed"], st.delayed)
            depth.add_metric([q, "lease_ended"], st.lease_ended)  # not in flight: released next sweep
            age.add_metric([q], st.oldest_age or 0.0)
            completed.add_metric([q], st.done)
            dead.add_metric([q], st.dead)
            expired.add_metric([q], st.expired)
            paused.add_metric([q, "enqueue"], 0 if st.enqueue_enabled else 1)
            paused.add_metric([q, "dequeue"], 0 if st.dequeue_enabled else 1)
        scrape = GaugeMetricFamily(
            "fdbqueue_scrape_duration_seconds", "Time this scrape spent reading the queues"
        )
        scrape.add_metric([], time.perf_counter() - started)
        yield from (depth, age, completed, dead, expired, paused, scrape)


class WorkerCollector(Collector):
    """The registry of workers (``fdbqueue.workers``) at each scrape: how many are alive and
    dead, and each live worker's handled and failed counts (labels: the worker's id and host;
    a restarted worker is a new id, so each series only grows, as a counter must). Workers of
    queues the principal may not browse are left out."""

    def __init__(self, db: Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
        self.db = db
        self.root = tuple(root)

    def workers(self) -> list[WorkerInfo]:
        return workers(self.db, root=self.root)

    def collect(self) -> Iterator[Metric]:
        count = GaugeMetricFamily(
            "fdbqueue_workers", "Registered workers, alive or dead (not heard of lately)", labels=["state"]
        )
        handled = CounterMetricFamily(
            "fdbqueue_worker_messages_handled",
            "Handler calls a live worker settled (failed ones included)",
            labels=["worker", "host"],
        )
        failed = CounterMetricFamily(
            "fdbqueue_worker_messages_failed",
            "Failed handler calls of a live worker",
            labels=["worker", "host"],
        )
        found = self.workers()
        count.add_metric(["alive"], sum(w.alive for w in found))
        count.add_metric(["dead"], sum(not w.alive for w in found))
        for w in found:
            if w.alive:
                handled.add_metric([w.id, w.host], w.handled)
                failed.add_metric([w.id, w.host], w.failed)
        yield from (count, handled, failed)


def handler_duration(registry: CollectorRegistry) -> Histogram:
    """``fdbqueue_handler_duration_seconds{queue,outcome}``, registered in ``registry``."""
    return Histogram(
        "fdbqueue_handler_duration_seconds",
        "Time a worker's handler ran, by queue and outcome (ok, failed, retried, discarded)",
        ["queue", "outcome"],
        buckets=DURATION_BUCKETS,
        registry=registry,
    )


class Exporter:
    """An HTTP endpoint serving the Prometheus text format: the queues' metrics, and the
    handler durations of a worker when it is given one. ``port`` 0 takes a free port
    (``self.port`` says which). Runs in a daemon thread; :meth:`close` stops it."""

    def __init__(
        self, db: Database, port: int, addr: str = "127.0.0.1", *, root: tuple[Any, ...] = DEFAULT_ROOT
    ) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(QueueCollector(db, root=root))
        self.registry.register(WorkerCollector(db, root=root))
        self.durations = handler_duration(self.registry)
        self._server, self._thread = start_http_server(port, addr, registry=self.registry)
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(5)


def serve(
    db: Database, port: int, addr: str = "127.0.0.1", *, root: tuple[Any, ...] = DEFAULT_ROOT
) -> Exporter:
    """Start the metrics endpoint on ``addr:port`` (see :class:`Exporter`): this host only by
    default, as the dashboard; ``addr="0.0.0.0"`` serves every interface."""
    return Exporter(db, port, addr, root=root)
