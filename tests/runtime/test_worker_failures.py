"""Handler failures are never silent: each is logged once with its traceback (queue, message id
and deliveries in the record's ``extra``), counted in the stats, and its text kept as the reason
(the nack reason in lease mode; the failed delivery's reason, then the dead letter's, in exactly-
once mode). An exactly-once handler that outlives the 5-second transaction limit says so."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Dispatcher, Message, Queue, Worker
from fdbqueue.engines.contract import Database
from fdbqueue.errors import HandlerSignatureError
from fdbqueue.runtime.handling import WorkerStats
from fdbqueue.store.budget import MAX_REASON_BYTES
from fdbqueue.store.clock import fake_clock


@pytest.fixture(params=["memory", "sqlite"])
def fdb_like(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    url = "memory://" if request.param == "memory" else f"sqlite://{tmp_path / 'f.db'}?sync=normal"
    db = fdbqueue.open(url)
    yield db
    db.close()


def failures(caplog: pytest.LogCaptureFixture, logger: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == logger and r.levelno >= logging.WARNING]


def test_exactly_once_handler_outliving_the_transaction_limit_is_said(
    fdb_like: Database, caplog: pytest.LogCaptureFixture
) -> None:
    fdbqueue.create_queue(fdb_like, "jobs", max_deliveries=2)
    q = Queue("jobs")
    mid = q.enqueue(fdb_like, "slow")
    runs: list[int] = []
    with fake_clock() as clock:

        def slow(tr: Any, m: Message) -> None:
            runs.append(m.deliveries)
            tr[b"done/" + m.payload] = b"1"
            clock.advance(6)  # database time moves past the 5-second window: commit gets 1007

        caplog.set_level(logging.WARNING, logger="fdbqueue.runtime.worker")
        stats = Worker(fdb_like, q, slow, mode="exactly_once", idle_timeout=0.05).run(until_empty=True)
    assert runs == [1, 2]
    assert (stats.processed, stats.failed, stats.too_slow) == (0, 2, 2)
    assert fdb_like.get(b"done/slow") is None  # type: ignore[attr-defined]
    logged = failures(caplog, "fdbqueue.runtime.worker")
    assert len(logged) == 2
    for r in logged:
        text = r.getMessage()
        assert r.levelno == logging.WARNING and "'jobs'" in text and mid in text
        assert "outlived FoundationDB's 5-second transaction limit (1007 transaction_too_old)" in text
        assert (r.queue, r.message_id) == ("jobs", mid)  # type: ignore[attr-defined]
    assert [r.deliveries for r in logged] == [1, 2]  # type: ignore[attr-defined]
    dead = Queue("jobs.error").dequeue(fdb_like)
    assert dead is not None and dead.id == mid and dead.extra["deliveries"] == 2
    assert dead.reason is not None and "1007" in dead.reason and "5-second" in dead.reason
    assert "too_slow" not in str(stats) and "outlived the 5 s transaction limit" in str(stats)


def test_exactly_once_handler_failure_is_logged_counted_and_kept(
    fdb_like: Database, caplog: pytest.LogCaptureFixture
) -> None:
    fdbqueue.create_queue(fdb_like, "jobs", max_deliveries=3, retry_delay=0)
    q = Queue("jobs")
    mid = q.enqueue(fdb_like, "bad")

    def handler(tr: Any, m: Message) -> None:
        raise ValueError(f"cannot parse {m.text()!r}")

    caplog.set_level(logging.WARNING, logger="fdbqueue.runtime.worker")
    stats = Worker(fdb_like, q, handler, mode="exactly_once", idle_timeout=0.05).run(until_empty=True)
    assert (stats.processed, stats.failed, stats.too_slow) == (0, 3, 0)
    logged = failures(caplog, "fdbqueue.runtime.worker")
    assert len(logged) == 3  # once per failure, not once per retry layer
    for i, r in enumerate(logged, 1):
        assert r.levelno == logging.ERROR and r.exc_info is not None and r.exc_info[0] is ValueError
        assert "ValueError: cannot parse 'bad'" in r.getMessage()
        assert (r.queue, r.message_id, r.deliveries) == ("jobs", mid, i)  # type: ignore[attr-defined]
    dead = Queue("jobs.error").dequeue(fdb_like)
    assert dead is not None and dead.reason == "ValueError: cannot parse 'bad'"


def test_exactly_once_failure_text_is_kept_as_the_last_error_within_the_size_limit(
    fdb_like: Database,
) -> None:
    fdbqueue.create_queue(fdb_like, "jobs", max_deliveries=5, retry_delay=0)
    q = Queue("jobs")
    q.enqueue(fdb_like, "bad")

    def handler(tr: Any, m: Message) -> None:
        raise RuntimeError("x" * 10_000)  # longer than a reason may be (MAX_REASON_BYTES)

    stats = Worker(fdb_like, q, handler, mode="exactly_once").run(max_messages=1)
    assert stats.failed == 1
    (m,) = q.browse(fdb_like)
    assert m.deliveries == 1 and m.extra["last_error"].startswith("RuntimeError: xxx")
    assert len(m.extra["last_error"]) <= MAX_REASON_BYTES


def test_lease_handler_failure_is_logged_counted_and_kept(
    fdb_like: Database, caplog: pytest.LogCaptureFixture
) -> None:
    fdbqueue.create_queue(fdb_like, "jobs", max_deliveries=2, retry_delay=0)
    q = Queue("jobs")
    mid = q.enqueue(fdb_like, "bad")

    def handler(m: Message) -> None:
        raise KeyError("no such customer")

    caplog.set_level(logging.WARNING, logger="fdbqueue.runtime.worker")
    stats = Worker(fdb_like, q, handler, idle_timeout=0.05).run(until_empty=True)
    assert (stats.processed, stats.failed) == (0, 2)
    logged = failures(caplog, "fdbqueue.runtime.worker")
    assert len(logged) == 2
    for i, r in enumerate(logged, 1):
        assert r.levelno == logging.ERROR and r.exc_info is not None and r.exc_info[0] is KeyError
        assert (r.queue, r.message_id, r.deliveries) == ("jobs", mid, i)  # type: ignore[attr-defined]
    dead = Queue("jobs.error").dequeue(fdb_like)
    assert dead is not None and dead.reason == "KeyError: 'no such customer'"


def test_dispatcher_consumer_failure_is_logged_counted_and_kept(
    fdb_like: Database, caplog: pytest.LogCaptureFixture
) -> None:
    fdbqueue.create_queue(fdb_like, "jobs", max_deliveries=1)
    q = Queue("jobs")
    mid = q.enqueue(fdb_like, "bad")

    def consumer(m: Message) -> None:
        raise OSError("mail server down")

    caplog.set_level(logging.WARNING, logger="fdbqueue.runtime.dispatcher")
    d = Dispatcher(fdb_like, q, idle_timeout=0.05)
    d.add_consumer(consumer)
    stats = d.run(until_empty=True)
    assert (stats.acked, stats.nacked) == (0, 1)
    (r,) = failures(caplog, "fdbqueue.runtime.dispatcher")
    assert r.levelno == logging.ERROR and r.exc_info is not None and r.exc_info[0] is OSError
    assert (r.queue, r.message_id, r.deliveries) == ("jobs", mid, 1)  # type: ignore[attr-defined]
    dead = Queue("jobs.error").dequeue(fdb_like)
    assert dead is not None and dead.reason == "OSError: mail server down"


def test_a_handler_of_the_wrong_arity_is_refused_at_construction(fdb_like: Database) -> None:
    with pytest.raises(HandlerSignatureError, match=r"handler\(message\).*mode='exactly_once'"):
        Worker(fdb_like, "jobs", lambda tr, m: None)  # lease mode (the default) calls f(m)
    with pytest.raises(HandlerSignatureError, match=r"handler\(tr, message\)"):
        Worker(fdb_like, "jobs", lambda m: None, mode="exactly_once")
    with pytest.raises(fdbqueue.QueueError):  # a QueueError, and a TypeError
        Worker(fdb_like, "jobs", lambda: None)
    with pytest.raises(TypeError):
        Dispatcher(fdb_like, "jobs").add_consumer(lambda tr, m: None)

    class Handler:
        def __call__(self, m: Message, *, verbose: bool = False) -> None: ...

    Worker(fdb_like, "jobs", Handler())  # what can be called with one argument is accepted
    Worker(fdb_like, "jobs", lambda *a: None, mode="exactly_once")
    Worker(fdb_like, "jobs", print)  # builtins: accepted when they can be


def test_stats_summary_is_one_readable_line() -> None:
    stats = WorkerStats(processed=1234, failed=3, ingress_rate=812.3456789, egress_rate=0.0123456)
    line = stats.summary()
    assert str(stats) == line and "\n" not in line
    assert "processed 1234" in line and "failed 3" in line
    assert "812/s" in line and "0.0123/s" in line and "812.34" not in line
    assert "{" not in line  # no dict printed raw


def test_stats_summary_leaves_out_what_was_not_measured() -> None:
    line = str(WorkerStats(processed=5, egress_rate=3.0))  # exactly-once: no prefetch, no ingress
    assert "in " not in line and "out 3/s" in line
    d = fdbqueue.DispatcherStats(dispatched=3, acked=2, nacked=1)
    assert str(d) == d.summary() and "acked 2" in str(d) and "nacked 1" in str(d) and "\n" not in str(d)
