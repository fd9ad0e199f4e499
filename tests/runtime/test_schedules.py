"""Periodic jobs: each tick enqueued exactly once by any number of schedulers (three
processes), the catch-up policies after downtime, listing, bad input, the CLI."""

from __future__ import annotations

import datetime
import itertools
import multiprocessing as mp
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Database, Queue, QueueError

UTC = datetime.timezone.utc


@pytest.fixture(params=["sqlite", "sim"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}" if request.param == "sqlite" else "sim://")
    yield db
    db.close()


def _made(db: Database, name: str) -> datetime.datetime:
    (s,) = [s for s in fdbqueue.schedules(db) if s.name == name]
    return s.created


@pytest.mark.parametrize(("policy", "expected"), [("latest", 1), ("all", 10), ("none", 0)])
def test_missed_ticks_after_downtime_follow_the_policy(store: Database, policy: str, expected: int) -> None:
    fdbqueue.schedule(store, "reports", "* * * * *", {"report": "daily"}, name="r", catch_up=policy)
    later = _made(store, "r").replace(second=30) + datetime.timedelta(minutes=10)
    assert fdbqueue.run_schedules(store, now=later) == expected
    assert fdbqueue.run_schedules(store, now=later) == 0  # nothing twice
    assert Queue("reports").size(store) == expected
    nxt = (later + datetime.timedelta(minutes=1)).replace(second=0, microsecond=500_000)
    assert fdbqueue.run_schedules(store, now=nxt) == 1  # on time: every policy runs it
    m = Queue("reports").dequeue(store)
    assert m is not None and m.json() == {"report": "daily"} and m.headers["fdbqueue-schedule"] == "r"


def test_schedules_list_replace_and_remove(store: Database) -> None:
    name = fdbqueue.schedule(store, "reports", "*/5 * * * *", b"x")
    assert name == "reports */5 * * * *"
    (s,) = fdbqueue.schedules(store)
    assert (s.queue, s.cron, s.last_run) == ("reports", "*/5 * * * *", None)
    assert s.next_run > datetime.datetime.now(UTC) and s.next_run.minute % 5 == 0
    fdbqueue.schedule(store, "reports", "0 * * * *", b"y", name=name)  # replaced
    assert [x.cron for x in fdbqueue.schedules(store)] == ["0 * * * *"]
    assert fdbqueue.unschedule(store, name) and not fdbqueue.unschedule(store, name)
    assert fdbqueue.schedules(store) == []


def test_bad_schedules_are_refused(store: Database) -> None:
    for args, kwargs, text in (
        (("reports", "every minute", b"x"), {}, "not a cron expression"),
        (("reports", "* * * * *", b"x"), {"catch_up": "some"}, "catch_up must be one of"),
        (("reports", "* * * * *", b"x"), {"priority": "high"}, "priority must be an int"),
        (("", "* * * * *", b"x"), {}, "queue name"),
        (("reports", "* * * * *", object()), {}, "payload"),
    ):
        with pytest.raises(QueueError, match=text):
            fdbqueue.schedule(store, *args, **kwargs)  # type: ignore[arg-type]
    assert fdbqueue.schedules(store) == []


def _scheduler(url: str, seconds: float) -> None:
    sched = fdbqueue.Scheduler(fdbqueue.open(url), interval=0.05)
    stopper = __import__("threading").Timer(seconds, sched.stop)
    stopper.start()
    sched.run()


def test_three_schedulers_in_three_processes_enqueue_each_tick_once(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.schedule(db, "ticks", "* * * * * *", b"tick", name="every-second")  # seconds last
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_scheduler, args=(url, 4.5)) for _ in range(3)]
    started = time.time()
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    elapsed = time.time() - started
    ticks = []
    while (m := Queue("ticks").dequeue(db)) is not None:
        ticks.append(m.headers["fdbqueue-tick"])
    assert len(ticks) == len(set(ticks)) >= 3  # each tick once
    assert len(ticks) <= elapsed + 1
    seconds = sorted(datetime.datetime.fromisoformat(t) for t in ticks)
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(seconds))


def test_cli_schedule_schedules_unschedule(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    url = f"sqlite://{tmp_path / 'q.db'}"
    assert main(["--url", url, "schedule", "nightly", "reports", "0 3 * * *", "run the report"]) == 0
    assert "scheduled 'nightly'" in capsys.readouterr().out
    assert main(["--url", url, "schedules"]) == 0
    out = capsys.readouterr().out
    assert "nightly" in out and "0 3 * * *" in out and "last never" in out and "T03:00:00" in out
    assert main(["--url", url, "schedule", "bad", "reports", "61 * * * *", "x"]) == 2
    assert "not a cron expression" in capsys.readouterr().err
    assert main(["--url", url, "unschedule", "nightly"]) == 0
    assert main(["--url", url, "unschedule", "nightly"]) == 1


def test_a_worker_runs_the_schedules_at_its_sweeps(store: Database) -> None:
    import threading

    fdbqueue.schedule(store, "ticks", "* * * * * *", b"t", name="s")
    w = fdbqueue.Worker(store, "other", lambda m: None, run_schedules=True, sweep_interval=0.2)
    t = threading.Thread(target=w.run)
    t.start()
    time.sleep(2.5)
    w.stop()
    t.join(10)
    assert w.stats.scheduled >= 2 and Queue("ticks").size(store) == w.stats.scheduled


def test_a_schedule_needs_the_enqueue_right_on_its_queue(tmp_path: Path) -> None:
    """A schedule is a standing enqueue, run by whichever scheduler: whoever makes, replaces
    or removes one must hold ``enqueue`` on its queue (else any principal could plant a job
    that a scheduler with the right would run)."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    ops, stranger = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="stranger")
    try:
        fdbqueue.create_queue(ops, "sec", owner="ops")
        denied = "'stranger' lacks right 'enqueue' on queue 'sec'"
        with pytest.raises(fdbqueue.AccessDeniedError, match=denied):
            fdbqueue.schedule(stranger, "sec", "* * * * *", b"planted", name="s1")
        fdbqueue.schedule(ops, "sec", "* * * * *", b"report", name="s2")
        with pytest.raises(fdbqueue.AccessDeniedError):
            fdbqueue.unschedule(stranger, "s2")
        with pytest.raises(fdbqueue.AccessDeniedError):  # replacing it, even towards an open queue
            fdbqueue.schedule(stranger, "free", "* * * * *", b"x", name="s2")
        assert [(s.name, s.queue) for s in fdbqueue.schedules(ops)] == [("s2", "sec")]
        fdbqueue.grant(ops, "sec", "stranger", ["enqueue"])
        fdbqueue.schedule(stranger, "sec", "0 * * * *", b"allowed", name="s3")
        assert fdbqueue.unschedule(stranger, "s3")
    finally:
        ops.close()
        stranger.close()


def test_schedule_names_are_checked(store: Database, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    with pytest.raises(QueueError, match="name must be a non-empty str"):
        fdbqueue.schedule(store, "reports", "* * * * *", b"x", name="")
    with pytest.raises(QueueError, match="name must be a non-empty str"):
        fdbqueue.unschedule(store, 5)  # type: ignore[arg-type]
    assert fdbqueue.schedules(store) == []
    if isinstance(store, fdbqueue.engines.sim.database.SimDatabase):
        return
    url = f"sqlite://{store.path}"  # type: ignore[attr-defined]
    assert main(["--url", url, "schedule", "", "reports", "*/5 * * * *", "x"]) == 2
    assert "name must be a non-empty str" in capsys.readouterr().err
    assert fdbqueue.schedules(store) == []
