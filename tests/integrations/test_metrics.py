"""The Prometheus endpoint, scraped over HTTP: the numbers of ``queue_stats``, right across
processes (durable counters read at scrape time); a worker's handler durations; the CLI."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import fdbqueue
from fdbqueue import Database, Message, Queue, Retry, Worker
from fdbqueue.runtime.metrics import serve


@pytest.fixture(params=["sqlite", "sim"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}" if request.param == "sqlite" else "sim://")
    yield db
    db.close()


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_the_endpoint_gives_the_numbers_of_queue_stats(store: Database) -> None:
    fdbqueue.create_queue(store, "jobs", max_deliveries=1)
    q = Queue("jobs")
    q.enqueue_many(store, [b"x"] * 7)
    q.enqueue(store, b"later", delay=600)
    m = q.lease(store)
    assert m is not None
    q.ack(store, m)
    q.nack(store, q.lease(store), reason="bad")  # type: ignore[arg-type]
    q.lease(store)
    exporter = serve(store, 0, "127.0.0.1")
    try:
        got = scrape(exporter.port)
    finally:
        exporter.close()
    st = fdbqueue.queue_stats(store, "jobs")
    assert got[("fdbqueue_queue_messages", (("queue", "jobs"), ("state", "ready")))] == st.ready == 4
    assert got[("fdbqueue_queue_messages", (("queue", "jobs"), ("state", "in_flight")))] == st.inflight == 1
    assert got[("fdbqueue_queue_messages", (("queue", "jobs"), ("state", "delayed")))] == st.delayed == 1
    assert got[("fdbqueue_messages_completed_total", (("queue", "jobs"),))] == st.done == 1
    assert got[("fdbqueue_messages_dead_lettered_total", (("queue", "jobs"),))] == st.dead == 1
    assert got[("fdbqueue_messages_expired_total", (("queue", "jobs"),))] == st.expired == 0
    assert got[("fdbqueue_queue_messages", (("queue", "jobs.error"), ("state", "ready")))] == 1
    assert got[("fdbqueue_queue_oldest_message_age_seconds", (("queue", "jobs"),))] >= 0
    assert not any("message_id" in dict(labels) for _, labels in got)  # no per-message labels


def test_a_worker_serves_the_endpoint_while_it_runs(store: Database) -> None:
    q = Queue("jobs")
    q.enqueue_many(store, [b"first", b"second"])
    seen: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def handler(m: Message) -> None:
        if m.payload == b"second":  # the first one's duration is observed by now
            seen.update(scrape(w._exporter.port))

    w = Worker(store, "jobs", handler, metrics_port=0)
    w.run(max_messages=2)
    assert seen[("fdbqueue_queue_messages", (("queue", "jobs"), ("state", "in_flight")))] == 1
    key = ("fdbqueue_handler_duration_seconds_count", (("outcome", "ok"), ("queue", "jobs")))
    assert seen[key] == 1
    assert w._exporter is None


def test_handler_durations_are_observed_by_outcome(store: Database) -> None:
    from fdbqueue.runtime.metrics import Exporter

    q = Queue("jobs")
    q.enqueue_many(store, [b"ok", b"ok", b"retry"])

    def handler(m: Message) -> None:
        if m.payload == b"retry":
            raise Retry(delay=600)

    w = Worker(store, "jobs", handler, metrics_port=0)
    captured: list[Exporter] = []
    original = w._observe

    def observe(q: Queue, began: float, outcome: str) -> None:
        captured.append(w._exporter)
        original(q, began, outcome)

    w._observe = observe  # type: ignore[method-assign]
    w.run(max_messages=3)
    registry = captured[0].registry
    ok = registry.get_sample_value(
        "fdbqueue_handler_duration_seconds_count", {"queue": "jobs", "outcome": "ok"}
    )
    retried = registry.get_sample_value(
        "fdbqueue_handler_duration_seconds_count", {"queue": "jobs", "outcome": "retried"}
    )
    assert (ok, retried) == (2.0, 1.0)


def test_cli_metrics_serves_until_sigterm(tmp_path: Path) -> None:
    import socket

    url = f"sqlite://{tmp_path / 'q.db'}"
    Queue("jobs").enqueue_many(fdbqueue.open(url), [b"x"] * 5)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fdbqueue",
            "--url",
            url,
            "metrics",
            "--port",
            str(port),
            "--addr",
            "127.0.0.1",
        ],
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                got = scrape(port)
                break
            except OSError:
                assert time.monotonic() < deadline and p.poll() is None
                time.sleep(0.1)
        assert got[("fdbqueue_queue_messages", (("queue", "jobs"), ("state", "ready")))] == 5
    finally:
        p.send_signal(signal.SIGTERM)
        assert p.wait(10) == 0
    bad = subprocess.run(
        [sys.executable, "-m", "fdbqueue", "--url", url, "metrics", "--port", "70000"], capture_output=True
    )
    assert bad.returncode == 2 and b"--port" in bad.stderr


def test_all_queue_stats_reads_many_queues_as_queue_stats_does_and_leaves_out_the_hidden(
    tmp_path: Path,
) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    ops, viewer = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="viewer")
    try:
        # More queues than one transaction of all_queue_stats reads: the batches join up.
        names = [f"t.q{i:03d}" for i in range(fdbqueue.api.admin.STATS_BATCH + 7)]
        for i, name in enumerate(names):
            fdbqueue.create_queue(ops, name)
            Queue(name).enqueue_many(ops, [b"x"] * (i % 4))
        fdbqueue.create_queue(ops, "secret", owner="ops")
        Queue("secret").enqueue(ops, b"s")
        got = {st.name: st for st in fdbqueue.all_queue_stats(ops)}
        assert set(got) == {*names, "secret"}
        for name in [*names, "secret"]:
            one = fdbqueue.queue_stats(ops, name)
            assert (got[name].ready, got[name].made_ready) == (one.ready, one.made_ready)
        assert [got[n].ready for n in names[:5]] == [0, 1, 2, 3, 0]
        seen = {st.name for st in fdbqueue.all_queue_stats(viewer)}
        assert seen == set(names)  # "secret" is not viewer's to browse
        assert [s.name for s in fdbqueue.all_queue_stats(viewer, ["t.q001", "gone", "secret"])] == ["t.q001"]
    finally:
        ops.close()
        viewer.close()


def test_the_endpoint_counts_the_workers_and_what_each_handled(store: Database) -> None:
    import threading

    q = Queue("jobs")
    q.enqueue_many(store, [b"ok", b"ok", b"bad"])

    def handler(m: Message) -> None:
        if m.payload == b"bad":
            raise fdbqueue.Discard("bad")

    w = Worker(store, "jobs", handler, registry_interval=0.5, settle_linger=0)  # alive: a beat 1.5 s late
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    exporter = serve(store, 0, "127.0.0.1")
    try:
        end = time.monotonic() + 20
        while True:
            got = scrape(exporter.port)
            mine = {k: v for k, v in got.items() if k[0] == "fdbqueue_worker_messages_handled_total"}
            if list(mine.values()) == [3.0]:
                break
            assert time.monotonic() < end, got
            time.sleep(0.05)
        assert got[("fdbqueue_workers", (("state", "alive"),))] == 1
        assert got[("fdbqueue_workers", (("state", "dead"),))] == 0
        [(_, labels)] = mine
        assert dict(labels)["worker"] == fdbqueue.workers(store)[0].id
        assert got[("fdbqueue_worker_messages_failed_total", labels)] == 1
        w.stop()
        t.join(30)
        assert scrape(exporter.port)[("fdbqueue_workers", (("state", "alive"),))] == 0
    finally:
        w.stop()
        exporter.close()
