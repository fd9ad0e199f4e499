"""Exactly-once workers count every failed handler call, however many run at once.

The handler runs inside the transaction that removes its message, and a failure aborts that
transaction: a count written afterwards let concurrent workers each take the same message
as "delivery 1" (three processes and ``max_deliveries=3`` made 110 calls for 30 messages).
The attempt is claimed before the handler runs, in a transaction of its own: each call has
its own delivery number, and a message that keeps failing is called ``max_deliveries`` times.
"""

from __future__ import annotations

import json
import multiprocessing
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Message, Queue, Worker
from fdbqueue.errors import QueueError
from fdbqueue.runtime.handling import normalise_mode

MAX = 3


def _always_fails(calls: list[tuple[str, int]], lock: threading.Lock) -> Any:
    def handler(tr: Any, m: Message) -> None:
        with lock:
            calls.append((m.id, m.deliveries))
        raise ValueError("always")

    return handler


def _check_calls(calls: list[tuple[str, int]], ids: list[str], db: fdbqueue.Database) -> None:
    per_message = Counter(mid for mid, _ in calls)
    assert set(per_message) == set(ids)
    assert max(per_message.values()) <= MAX, f"{len(calls)} calls for {len(ids)} messages: {per_message}"
    repeated = [pair for pair, n in Counter(calls).items() if n > 1]
    assert not repeated, f"the same delivery ran twice: {repeated[:5]}"
    dead = list(Queue("jobs.error").browse(db, limit=1000))
    assert sorted(m.id for m in dead) == sorted(ids)
    assert all(m.reason == "ValueError: always" for m in dead)


@pytest.mark.parametrize("engine", ["memory", "sqlite"])
def test_concurrent_exactly_once_workers_count_every_failed_call(tmp_path: Path, engine: str) -> None:
    url = "memory://" if engine == "memory" else f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    try:
        fdbqueue.create_queue(db, "jobs", max_deliveries=MAX, retry_delay=0)
        ids = Queue("jobs").enqueue_many(db, [f"m{i}" for i in range(20)])
        calls: list[tuple[str, int]] = []
        lock = threading.Lock()
        workers = [
            Worker(db, "jobs", _always_fails(calls, lock), mode="exactly_once", idle_timeout=0.05)
            for _ in range(3)
        ]
        threads = [threading.Thread(target=w.run, kwargs={"until_empty": True}) for w in workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not any(t.is_alive() for t in threads)
        _check_calls(calls, ids, db)
        assert sum(w.stats.failed for w in workers) == len(calls)
    finally:
        db.close()


def _failing_worker(url: str, out: str) -> None:
    calls: list[tuple[str, int]] = []

    def handler(tr: Any, m: Message) -> None:
        calls.append((m.id, m.deliveries))
        raise ValueError("always")

    db = fdbqueue.open(url)
    try:
        Worker(db, "jobs", handler, mode="exactly-once", idle_timeout=0.05).run(until_empty=True)
    finally:
        db.close()
    Path(out).write_text(json.dumps(calls))


def test_exactly_once_worker_processes_never_run_the_same_delivery_twice(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    try:
        fdbqueue.create_queue(db, "jobs", max_deliveries=MAX, retry_delay=0)
        ids = Queue("jobs").enqueue_many(db, [f"m{i}" for i in range(30)])
        ctx = multiprocessing.get_context("spawn")
        outs = [tmp_path / f"calls{i}.json" for i in range(3)]
        procs = [ctx.Process(target=_failing_worker, args=(url, str(out))) for out in outs]
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
        calls = [(mid, n) for out in outs for mid, n in json.loads(out.read_text())]
        _check_calls(calls, ids, db)
    finally:
        db.close()


def test_both_spellings_of_exactly_once_are_accepted_everywhere(tmp_path: Path) -> None:
    assert normalise_mode("exactly-once") == normalise_mode("exactly_once") == "exactly_once"
    assert normalise_mode("lease") == "lease"
    with pytest.raises(QueueError, match="mode must be one of"):
        normalise_mode("exactly once")
    db = fdbqueue.open("memory://")
    w = Worker(db, "jobs", lambda tr, m: None, mode="exactly-once")
    assert w.mode == "exactly_once"
