"""The command line of rate limits and workers: ``create --rate-limit`` and ``workers``."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import fdbqueue

Run = Callable[..., tuple[int, str, str]]


def test_create_sets_changes_and_clears_a_rate_limit(run: Run, db: fdbqueue.Database) -> None:
    code, out, _ = run("create", "emails", "--rate-limit", "50/s")
    assert code == 0 and "rate_limit" in out and "50/s" in out
    assert fdbqueue.queue_config(db, "emails").rate_limit == "50/s"
    code, out, _ = run("create", "emails", "--rate-limit", "1000/m", "--json")
    assert code == 0 and json.loads(out)["rate_limit"] == "1000/m"
    code, out, _ = run("create", "emails", "--rate-limit", "none")
    assert code == 0 and fdbqueue.queue_config(db, "emails").rate_limit is None


def test_a_malformed_rate_limit_is_one_line_and_exit_2(run: Run, db: fdbqueue.Database) -> None:
    fdbqueue.create_queue(db, "emails", rate_limit="10/h")
    code, _, err = run("create", "emails", "--rate-limit", "50 per second")
    assert code == 2 and err.startswith("fdbqueue: error: ") and err.count("\n") == 1, err
    assert "not a rate" in err and "'50/s'" in err
    assert fdbqueue.queue_config(db, "emails").rate_limit == "10/h"  # unchanged


@pytest.mark.parametrize("text", ["", "  "])
def test_an_empty_rate_limit_is_an_error_not_a_clear(run: Run, db: fdbqueue.Database, text: str) -> None:
    fdbqueue.create_queue(db, "emails", rate_limit="10/h")
    code, _, err = run("create", "emails", "--rate-limit", text)
    assert code == 2 and err.startswith("fdbqueue create: error: ") and err.count("\n") == 1, err
    assert "none" in err and "50/s" in err, err
    assert fdbqueue.queue_config(db, "emails").rate_limit == "10/h"  # unchanged


def test_a_rate_limit_above_the_designs_bound_is_refused_saying_it(run: Run, db: fdbqueue.Database) -> None:
    code, _, err = run("create", "emails", "--rate-limit", "1000000/s")
    assert code == 2 and "25,600" in err and err.count("\n") == 1, err
    code, _, _ = run("create", "emails", "--rate-limit", "25600/s")
    assert code == 0 and fdbqueue.queue_config(db, "emails").rate_limit == "25600/s"


def busy_worker(db: Any) -> tuple[fdbqueue.Worker, threading.Thread, threading.Event, str]:
    release = threading.Event()
    mid = fdbqueue.Queue("jobs").enqueue(db, b"x")
    # Beats every half second: shown alive unless one is 1.5 s late (a loaded machine).
    w = fdbqueue.Worker(db, "jobs", lambda m: release.wait(30), registry_interval=0.5)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    end = time.monotonic() + 20
    while not any(x.current for x in fdbqueue.workers(db)):
        assert time.monotonic() < end, "the worker never showed its message"
        time.sleep(0.02)
    return w, t, release, mid


def test_workers_lists_a_running_worker(run: Run, db: fdbqueue.Database) -> None:
    code, out, _ = run("workers")
    assert code == 0 and out.strip() == "no workers"
    w, t, release, mid = busy_worker(db)
    try:
        code, out, _ = run("workers")
        assert code == 0
        assert "host" in out and "current" in out
        assert "alive" in out and mid in out and str(fdbqueue.workers(db)[0].pid) in out
        code, out, _ = run("workers", "--json")
        [record] = json.loads(out)
        assert record["queues"] == ["jobs"] and record["alive"] is True
        assert record["current"]["id"] == mid and record["handled"] == 0
        code, out, _ = run("workers", "--alive", "--json")
        assert len(json.loads(out)) == 1
    finally:
        release.set()
        w.stop()
        t.join(30)
    assert run("workers", "--json")[1].strip() == "[]"
