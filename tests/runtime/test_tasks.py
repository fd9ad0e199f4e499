"""Tasks (fdbqueue.Tasks): defer in the caller's transaction, arguments refused at defer,
results and failures, chains written with the ack, options passed through, unknown tasks
dead-lettered, async tasks on the AsyncWorker; on the embedded and the sim engines."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import aio

CALLS: list[tuple[str, Any]] = []


@pytest.fixture(params=["sqlite", "sim"])
def db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[fdbqueue.Database]:
    url = f"sqlite://{tmp_path / 'store.db'}" if request.param == "sqlite" else "sim://?seed=1&faults=0"
    database = fdbqueue.open(url)
    CALLS.clear()
    try:
        yield database
    finally:
        database.close()


def make_app(db: fdbqueue.Database) -> tuple[fdbqueue.Tasks, dict[str, Any]]:
    app = fdbqueue.Tasks(db)

    @app.task(queue="emails")
    def send(to: str, subject: str = "hi") -> None:
        CALLS.append(("send", (to, subject)))

    @app.task(store_result=True)
    def add(a: int, b: int) -> int:
        CALLS.append(("add", (a, b)))
        return a + b

    @app.task(store_result=True, max_deliveries=2)
    def boom(text: str) -> None:
        CALLS.append(("boom", text))
        raise ValueError(text)

    @app.task(queue="notes")
    def notify(user: int) -> None:
        CALLS.append(("notify", user))

    return app, {"send": send, "add": add, "boom": boom, "notify": notify}


@fdbqueue.transactional
def read(tr: fdbqueue.Transaction, key: bytes) -> bytes | None:
    return tr.get(key)


def run(app: fdbqueue.Tasks) -> fdbqueue.WorkerStats:
    return app.worker(concurrency=2).run(until_empty=True)


def test_the_task_name_is_module_and_qualname(db: fdbqueue.Database) -> None:
    app, t = make_app(db)
    assert t["send"].name == f"{__name__}.make_app.<locals>.send"
    assert t["send"]("x") is None and CALLS == [("send", ("x", "hi"))]  # a direct call runs it now
    named = app.task(name="custom")(lambda: 1)
    assert named.name == "custom" and named.queue == "tasks"


def test_defer_commits_and_aborts_with_the_callers_transaction(db: fdbqueue.Database) -> None:
    _, t = make_app(db)
    emails = fdbqueue.Queue("emails")

    @fdbqueue.transactional
    def place(tr: fdbqueue.Transaction, fail: bool) -> str:
        tr[b"app/order"] = b"placed"
        mid = t["send"].defer(tr, to="a@b.org")
        if fail:
            raise RuntimeError("the application's transaction fails")
        return str(mid)

    with pytest.raises(RuntimeError):
        place(db, True)
    assert emails.size(db) == 0 and read(db, b"app/order") is None
    mid = place(db, False)
    m = emails.peek(db)
    assert m is not None and m.id == mid and read(db, b"app/order") == b"placed"
    assert m.json() == {"task": t["send"].name, "args": [], "kwargs": {"to": "a@b.org"}}


def test_arguments_are_checked_at_defer(db: fdbqueue.Database) -> None:
    app, t = make_app(db)
    for args, kwargs in [((), {}), (("a",), {"cc": 1}), (("a", "b", "c"), {}), ((object(),), {})]:
        with pytest.raises(fdbqueue.TaskArgumentsError):
            t["send"].defer(db, *args, **kwargs)
    with pytest.raises(fdbqueue.TaskArgumentsError):
        t["notify"].s(nobody=1)  # a signature is checked when it is made
    with pytest.raises(fdbqueue.TaskArgumentsError):
        t["send"].defer(db, float("nan"))  # not JSON
    with pytest.raises(fdbqueue.UnknownTaskError):
        app.defer_by_name(db, "no.such.task", 1)
    assert fdbqueue.Queue("emails").size(db) == 0
    mid = app.defer_by_name(db, t["send"].name, "a@b.org", subject="yo")
    assert fdbqueue.Queue("emails").get(db, mid) is not None


def test_a_result_round_trip(db: fdbqueue.Database) -> None:
    app, t = make_app(db)
    mid = t["add"].defer(db, 2, 3)
    with pytest.raises(fdbqueue.TaskTimeoutError):
        app.result(db, mid, timeout=0.05)  # not run yet
    stats = run(app)
    assert stats.processed == 1
    assert app.result(db, mid, timeout=5.0) == 5
    plain = t["send"].defer(db, "x")
    with pytest.raises(fdbqueue.NoResultError):
        app.result(db, plain, timeout=0.05)  # store_result=False keeps nothing


def test_result_waits_on_a_watch_for_a_worker(db: fdbqueue.Database) -> None:
    import threading

    app, t = make_app(db)
    mid = t["add"].defer(db, 20, 22)
    worker = app.worker(concurrency=1)
    thread = threading.Thread(target=worker.run, kwargs={"until_empty": True})
    thread.start()
    try:
        assert app.result(db, mid, timeout=30.0) == 42
    finally:
        thread.join(30)


def test_a_failure_raises_task_failed_error(db: fdbqueue.Database) -> None:
    app, t = make_app(db)
    mid = t["boom"].defer(db, "no such mailbox")
    run(app)
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, mid, timeout=5.0)
    assert (err.value.type, err.value.text, err.value.message_id) == ("ValueError", "no such mailbox", mid)
    assert [c for c in CALLS if c[0] == "boom"] == [("boom", "no such mailbox")] * 2  # max_deliveries=2
    dead = fdbqueue.Queue("tasks.error").get(db, mid)
    assert dead is not None and dead.reason == "ValueError: no such mailbox"


def test_a_chain_is_enqueued_when_the_first_settles_and_not_if_it_fails(db: fdbqueue.Database) -> None:
    app, t = make_app(db)
    notes = fdbqueue.Queue("notes")
    # The next task in a queue the app's worker serves is run by it too; here it is left to
    # another app, so that what the first worker enqueued can be counted.
    other = fdbqueue.Tasks(db)
    other.tasks[t["notify"].name] = t["notify"]
    app.tasks.pop(t["notify"].name)
    ok = t["add"].configure(then=t["notify"].s(user=7)).defer(db, 1, 1)
    bad = t["boom"].configure(then=t["notify"].s(user=8)).defer(db, "down")
    assert notes.size(db) == 0  # nothing before the first settles
    run(app)
    assert app.result(db, ok, timeout=5.0) == 2
    with pytest.raises(fdbqueue.TaskFailedError):
        app.result(db, bad, timeout=5.0)
    assert notes.size(db) == 1  # only the chain of the task that succeeded
    m = notes.peek(db)
    assert m is not None and m.json()["kwargs"] == {"user": 7}
    other.worker(concurrency=1).run(until_empty=True)
    assert ("notify", 7) in CALLS and ("notify", 8) not in CALLS


def test_a_chain_of_chains(db: fdbqueue.Database) -> None:
    app, t = make_app(db)
    third = t["notify"].s(user=3)
    second = t["add"].configure(then=third).s(10, 20)
    t["send"].configure(then=second).defer(db, "first")
    run(app)
    assert [c[0] for c in CALLS] == ["send", "add", "notify"]


def test_options_pass_through(db: fdbqueue.Database) -> None:
    _, t = make_app(db)
    emails = fdbqueue.Queue("emails")
    late = t["send"].configure(delay=60.0).defer(db, "late")
    assert emails.size(db) == 0 and fdbqueue.queue_stats(db, "emails").delayed == 1
    assert emails.get(db, late) is not None
    low = t["send"].defer(db, "low")
    high = t["send"].configure(priority=5).defer(db, "high")
    first = emails.peek(db)
    assert first is not None and first.id == high and first.priority == 5 and low != high
    a = t["send"].configure(dedup_key="k").defer(db, "once")
    b = t["send"].configure(dedup_key="k").defer(db, "twice")
    assert a == b and emails.size(db) == 3
    with pytest.raises(fdbqueue.QueueError):
        t["send"].configure(then="not a signature")  # type: ignore[arg-type]


def test_an_unknown_task_is_dead_lettered_with_a_reason(db: fdbqueue.Database) -> None:
    app, _ = make_app(db)
    mid = fdbqueue.Queue("tasks").enqueue(db, {"task": "gone.away", "args": []})
    junk = fdbqueue.Queue("tasks").enqueue(db, b"not json")
    run(app)
    dead = fdbqueue.Queue("tasks.error").get(db, mid)
    assert dead is not None and dead.reason is not None
    assert dead.reason.startswith("UnknownTaskError: no task named 'gone.away'")
    broken = fdbqueue.Queue("tasks.error").get(db, junk)
    assert broken is not None and "not a task message" in (broken.reason or "")


def test_a_return_value_json_cannot_carry_fails_the_task(db: fdbqueue.Database) -> None:
    app = fdbqueue.Tasks(db)

    @app.task(store_result=True)
    def odd() -> object:
        return object()

    mid = odd.defer(db)
    run(app)
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, mid, timeout=5.0)
    assert err.value.type == "TaskArgumentsError"


def test_async_tasks_run_on_the_async_worker(db: fdbqueue.Database) -> None:
    app = fdbqueue.Tasks(db)

    @app.task(store_result=True)
    async def fetch(n: int) -> int:
        await asyncio.sleep(0)
        return n * 2

    @app.task(store_result=True)
    def plain(n: int) -> int:
        return n + 1

    a, b = fetch.defer(db, 21), plain.defer(db, 1)
    worker = app.worker(concurrency=4)
    assert isinstance(worker.aio, aio.AsyncWorker)  # type: ignore[union-attr]
    worker.run(until_empty=True)
    assert (app.result(db, a), app.result(db, b)) == (42, 2)

    c = fetch.defer(db, 5)

    async def main() -> None:
        await app.aio_worker(concurrency=2).run(until_empty=True)

    asyncio.run(main())
    assert app.result(db, c) == 10


def test_tasks_run_in_a_process_pool_with_their_results_and_chains(db: fdbqueue.Database) -> None:
    """processes=2: the children run the tasks; what commits with the ack (the result, the
    chain's next task) crosses back to the worker, which writes it with the ack."""
    import os

    from tests.support import pool_tasks

    first = pool_tasks.pid_times.configure(then=pool_tasks.pid_times.s(n=5)).defer(db, n=1)
    failed = pool_tasks.fails.configure(then=pool_tasks.pid_times.s(n=7)).defer(db, text="no")
    worker = pool_tasks.app.worker(processes=2, db=db, lease_seconds=30.0)
    assert worker.concurrency == 2
    stats = worker.run(until_empty=True)
    pid, two = pool_tasks.app.result(db, first, timeout=10.0)
    assert two == 2 and pid != os.getpid()
    assert stats.processed == 2  # the first and its chain; the failed one's chain never enqueued
    with pytest.raises(fdbqueue.TaskFailedError, match="no"):
        pool_tasks.app.result(db, failed, timeout=10.0)
    dead = list(fdbqueue.Queue("pool-tasks.error").browse(db))
    assert [m.id for m in dead] == [failed]
    assert fdbqueue.Queue("pool-tasks").size(db) == 0


def test_max_deliveries_raises_the_queues_setting(db: fdbqueue.Database) -> None:
    app = fdbqueue.Tasks(db)

    @app.task(queue="patient", max_deliveries=9)
    def slow() -> None: ...

    app.worker()
    assert fdbqueue.queue_config(db, "patient").max_deliveries == 9


@pytest.mark.parametrize("seed", [3, 11])
def test_chains_and_results_are_written_once_under_injected_faults(seed: int) -> None:
    """On sim:// with not_committed, commit_unknown_result and transaction_too_old injected:
    every defer lands once, every result is kept, every chain is enqueued exactly once."""
    db = fdbqueue.open(f"sim://?seed={seed}&faults=0.2")
    CALLS.clear()
    try:
        app = fdbqueue.Tasks(db)
        later = fdbqueue.Tasks(db)

        @app.task(queue="first", store_result=True)
        def square(n: int) -> int:
            return n * n

        @later.task(queue="second")
        def record(n: int) -> None:
            CALLS.append(("record", n))

        ids = [square.configure(then=record.s(n=n)).defer(db, n) for n in range(20)]
        assert fdbqueue.queue_stats(db, "first").ready == 20
        app.worker(concurrency=2).run(until_empty=True)
        assert [app.result(db, mid, timeout=5.0) for mid in ids] == [n * n for n in range(20)]
        assert fdbqueue.queue_stats(db, "second").ready == 20  # once per first task, no more
        later.worker(concurrency=1).run(until_empty=True)
        assert sorted(n for _, n in CALLS) == list(range(20))
    finally:
        db.close()


@pytest.mark.parametrize("outcome", [("1021", True), ("1021", False), 1020, 1007])
def test_the_ack_that_writes_a_result_and_a_chain_is_exactly_once(outcome: Any) -> None:
    """The commit that acks a task (and writes its result and the next task) ends in
    commit_unknown_result, applied or not, or fails: the result and the chain are there once."""
    from fdbqueue import testing

    db = fdbqueue.open("sim://?seed=1&faults=0")
    try:
        app = fdbqueue.Tasks(db)
        later = fdbqueue.Tasks(db)

        @app.task(queue="first", store_result=True)
        def square(n: int) -> int:
            return n * n

        @later.task(queue="second")
        def record(n: int) -> None: ...

        mid = square.configure(then=record.s(n=4)).defer(db, 4)
        worker = app.worker(concurrency=1, settle_linger=0.0)  # the ack in a commit of its own
        with testing.FaultScript(db) as script:
            script.arm([None, outcome])  # the lease commits; the ack ends as told
            worker.run(until_empty=True)
            assert outcome in script.fired
        assert app.result(db, mid, timeout=5.0) == 16
        assert fdbqueue.queue_stats(db, "second").ready == 1
    finally:
        db.close()


def test_a_task_past_its_time_limit_fails_with_type_time_limit(db: fdbqueue.Database) -> None:
    import time

    app = fdbqueue.Tasks(db)

    @app.task(store_result=True, time_limit=0.2, max_deliveries=1)
    def stuck() -> None:
        time.sleep(1.0)  # abandoned by the worker past 0.2 s

    @app.task(store_result=True, time_limit=0.1, max_deliveries=1)
    def late() -> str:
        time.sleep(0.15)  # returns, but past its own (shorter) limit
        return "too late"

    @app.task(store_result=True, time_limit=5.0)
    def quick() -> str:
        return "ok"

    a, b, c = stuck.defer(db), late.defer(db), quick.defer(db)
    worker = app.worker(concurrency=1)
    assert worker.time_limit == 5.0  # type: ignore[union-attr]  # the longest of the tasks'
    worker = app.worker(concurrency=1, time_limit=0.2)
    worker.run(until_empty=True)
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, a, timeout=5.0)
    assert err.value.type == "time_limit" and "0.2 s" in err.value.text
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, b, timeout=5.0)
    assert err.value.type == "TaskTimeLimitExceeded"
    assert app.result(db, c, timeout=5.0) == "ok"


def test_a_task_whose_worker_died_on_its_last_delivery_reads_as_failed(db: fdbqueue.Database) -> None:
    """No worker wrote the failure (its lease ran out and a sweep dead-lettered it): the
    result says so from the dead letter once the wait ends."""
    import time

    app = fdbqueue.Tasks(db)

    @app.task(queue="fragile", store_result=True)
    def fragile() -> None: ...

    fdbqueue.create_queue(db, "fragile", max_deliveries=1)
    mid = fragile.defer(db)
    m = fdbqueue.Queue("fragile").lease(db, lease_seconds=0.05)  # a worker that dies holding it
    assert m is not None and m.id == mid
    time.sleep(0.1)
    fdbqueue.Queue("fragile").sweep(db)
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, mid, timeout=0.05)
    assert err.value.message_id == mid


def test_exactly_once_tasks_write_in_the_transaction_that_removes_their_message(
    db: fdbqueue.Database,
) -> None:
    app = fdbqueue.Tasks(db)

    @app.task(queue="ledger", exactly_once=True, store_result=True, max_deliveries=2)
    def credit(tr: fdbqueue.Transaction, account: str, fail: bool = False) -> str:
        tr[b"ledger/" + account.encode()] = b"credited"  # commits with the message's removal
        if fail:
            raise RuntimeError("declined")
        return account

    @app.task(queue="ledger", exactly_once=True)
    def audit(tr: fdbqueue.Transaction, account: str) -> None:
        tr[b"audit/" + account.encode()] = b"seen"

    with pytest.raises(fdbqueue.TaskArgumentsError):
        credit.defer(db)  # the transaction is the worker's: the arguments bind after it
    ok = credit.configure(then=audit.s("a")).defer(db, "a")
    bad = credit.configure(then=audit.s("b")).defer(db, "b", fail=True)
    worker = app.worker(concurrency=1)
    assert worker.mode == "exactly_once"  # type: ignore[union-attr]
    worker.run(until_empty=True)
    assert app.result(db, ok, timeout=5.0) == "a"
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, bad, timeout=5.0)
    assert (err.value.type, err.value.text) == ("RuntimeError", "declined")
    assert read(db, b"ledger/a") == b"credited" and read(db, b"audit/a") == b"seen"
    assert read(db, b"ledger/b") is None and read(db, b"audit/b") is None  # aborted with the failure

    @app.task(queue="plain")
    def plain() -> None: ...

    with pytest.raises(fdbqueue.QueueError, match="two apps"):
        app.worker()  # exactly-once and lease-mode tasks do not share a worker
    with pytest.raises(fdbqueue.QueueError):
        app.task(exactly_once=True)(_async_noop)


async def _async_noop(tr: object) -> None: ...


def test_a_runner_and_what_it_returns_pickle_for_a_workers_child_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A process pool sends the handler to its children by reference and gets TaskDone back."""
    import importlib
    import pickle

    from fdbqueue.runtime.tasks import TaskDone, TaskRunner

    monkeypatch.setenv("FDBQUEUE_URL", "memory://")
    task_app = importlib.import_module("tests.support.task_app")
    runner = TaskRunner(task_app.app, task_app.app.db, 5.0)
    again = pickle.loads(pickle.dumps(runner))
    assert type(again) is TaskRunner and again.app is task_app.app and again.worker_time_limit == 5.0
    done = TaskDone(("fdbqueue",), "q", "r1", 60.0, b"4", ({"task": "t", "queue": "q", "args": []},))
    assert pickle.loads(pickle.dumps(done)) == done
    app = fdbqueue.Tasks("memory://")
    local = app.task(lambda: None)  # not findable by its name in another process
    with pytest.raises(pickle.PicklingError):
        pickle.dumps(local)


def test_a_tasks_rate_limit_is_its_queues(db: fdbqueue.Database, caplog: pytest.LogCaptureFixture) -> None:
    app = fdbqueue.Tasks(db)

    @app.task(queue="api", rate_limit="50/s")
    def call_api() -> None: ...

    with pytest.raises(fdbqueue.QueueError, match="rate_limit"):
        app.task(rate_limit="fast")(lambda: None)  # malformed: refused at registration
    app.worker()
    if "rate_limit" in fdbqueue.QueueConfig.__dataclass_fields__:  # queues with rate limits
        assert fdbqueue.queue_config(db, "api").rate_limit == "50/s"  # type: ignore[attr-defined]
    else:
        assert "not enforced" in caplog.text

    @app.task(queue="api")
    def unlimited() -> None: ...

    with pytest.raises(fdbqueue.QueueError, match="a queue of its own"):
        app.worker()  # one queue, one rate limit


def test_a_tasks_rate_limit_is_checked_at_registration_as_its_queue_will_take_it(
    db: fdbqueue.Database,
) -> None:
    """A rate limit the queue would refuse is refused at registration, not at the worker's
    start; one the queue takes is taken."""
    app = fdbqueue.Tasks(db)
    for i, bad in enumerate(["50/sec", " 50/s", "50/ s", "10/hour", "2000000/s"]):
        with pytest.raises(fdbqueue.QueueError, match="rate_limit"):
            app.task(name=f"bad{i}", rate_limit=bad)(lambda: None)
    for i, good in enumerate(["7/d", "0.5/s", "1000/m"]):
        app.task(name=f"good{i}", queue=f"q{i}", rate_limit=good)(lambda: None)
    app.worker()
    if "rate_limit" in fdbqueue.QueueConfig.__dataclass_fields__:  # queues with rate limits
        assert fdbqueue.queue_config(db, "q0").rate_limit == "7/d"  # type: ignore[attr-defined]


def test_tasks_over_something_that_is_no_database_is_refused_at_once(db: fdbqueue.Database) -> None:
    """``Tasks(5)`` or ``Tasks(tr)``: a clear error where the app is made, not at its first use."""
    with pytest.raises(fdbqueue.QueueError, match="expected a Database"):
        fdbqueue.Tasks(5)  # type: ignore[arg-type]

    @fdbqueue.transactional
    def inside(tr: fdbqueue.Transaction) -> None:
        with pytest.raises(fdbqueue.QueueError, match="needs a Database"):
            fdbqueue.Tasks(tr)  # type: ignore[arg-type]

    inside(db)
    assert fdbqueue.Tasks(db).db is db


def test_a_task_that_discards_fails_with_type_discard(db: fdbqueue.Database) -> None:
    """``raise Discard(reason)`` in a task: TaskFailedError's type is "Discard" and its text
    the reason, whatever the reason says (a colon in it is no type)."""
    app = fdbqueue.Tasks(db)

    @app.task(store_result=True)
    def refuse(reason: str | None) -> None:
        raise fdbqueue.Discard(reason)

    a, b = refuse.defer(db, "bad input: no such user"), refuse.defer(db, None)
    run(app)
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, a, timeout=5.0)
    assert (err.value.type, err.value.text) == ("Discard", "bad input: no such user")
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, b, timeout=5.0)
    assert (err.value.type, err.value.text) == ("Discard", "discarded by the handler")


def test_a_tasks_max_deliveries_bounds_its_runs_past_its_time_limit(db: fdbqueue.Database) -> None:
    """ "At most this many runs": a run given up past the time limit counts too, though the
    queue (shared with a task of more deliveries) would deliver it more often."""
    import time

    app = fdbqueue.Tasks(db)

    @app.task(queue="slow", store_result=True, max_deliveries=2)
    def stuck() -> None:
        CALLS.append(("stuck", None))
        time.sleep(0.6)  # abandoned by the worker past 0.2 s

    @app.task(queue="slow", max_deliveries=5)
    def other() -> None: ...

    mid = stuck.defer(db)
    app.worker(concurrency=1, time_limit=0.2).run(until_empty=True)
    assert CALLS == [("stuck", None), ("stuck", None)]
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, mid, timeout=5.0)
    assert err.value.type == "time_limit"
    assert [m.id for m in fdbqueue.Queue("slow.error").browse(db)] == [mid]


def _chained_into(t: dict[str, Any], queue: str, a: int) -> dict[str, Any]:
    """A task message as another principal deferred it: add(a, 1), then notify in ``queue``."""
    then = {"task": t["notify"].name, "queue": queue, "args": [], "kwargs": {"user": a}}
    return {"task": t["add"].name, "args": [a, 1], "result": 60.0, "then": [then]}


@pytest.mark.parametrize("options", [{}, {"settle_linger": 0.0}], ids=["batched", "one-by-one"])
def test_a_chain_the_worker_cannot_enqueue_is_dead_lettered_and_the_worker_runs_on(
    db: fdbqueue.Database, options: dict[str, Any]
) -> None:
    app, t = make_app(db)
    app.tasks.pop(t["notify"].name)  # its queues are not this worker's to prepare
    fdbqueue.create_queue(db, "vault", owner="ops")  # the worker (anonymous) may not enqueue there
    fdbqueue.create_queue(db, "closed")
    fdbqueue.stop_queue(db, "closed")
    tasks = fdbqueue.Queue("tasks")
    denied = tasks.enqueue(db, _chained_into(t, "vault", 1))
    paused = tasks.enqueue(db, _chained_into(t, "closed", 2))
    fine = t["add"].configure(then=t["notify"].s(user=3)).defer(db, 3, 1)
    stats = app.worker(concurrency=2, **options).run(until_empty=True)
    assert app.result(db, fine, timeout=5.0) == 4 and fdbqueue.Queue("notes").size(db) == 1
    dead = fdbqueue.Queue("tasks.error")
    for mid, kind in ((denied, "AccessDeniedError"), (paused, "QueueStoppedError")):
        m = dead.get(db, mid)
        assert m is not None and (m.reason or "").startswith(f"{kind}: "), (m, kind)
        with pytest.raises(fdbqueue.TaskFailedError) as err:
            app.result(db, mid, timeout=5.0)
        assert err.value.type == kind
    assert tasks.size(db) == 0 and fdbqueue.queue_stats(db, "tasks").inflight == 0
    assert (stats.processed, stats.failed) == (1, 2)
    assert [c[0] for c in CALLS].count("add") == 3  # each ran once: none retried


def test_defer_refuses_a_chain_into_a_queue_the_caller_cannot_enqueue_on(db: fdbqueue.Database) -> None:
    _, t = make_app(db)
    fdbqueue.create_queue(db, "vault", owner="ops")
    vaulted = fdbqueue.Tasks(db).task(queue="vault", name="vaulted")(lambda: None)
    with pytest.raises(fdbqueue.AccessDeniedError):
        t["add"].configure(then=vaulted.s()).defer(db, 1, 2)
    with pytest.raises(fdbqueue.AccessDeniedError):
        t["send"].configure(then=t["add"].configure(then=vaulted.s()).s(1, 2)).defer(db, "x")
    assert fdbqueue.Queue("tasks").size(db) == 0 and fdbqueue.Queue("emails").size(db) == 0


def test_a_task_message_whose_arguments_do_not_bind_is_dead_lettered_at_once(
    db: fdbqueue.Database,
) -> None:
    app, t = make_app(db)
    tasks = fdbqueue.Queue("tasks")
    extra = tasks.enqueue(db, {"task": t["add"].name, "args": [1, 2, 3], "result": 60.0})
    unknown = tasks.enqueue(db, {"task": t["add"].name, "args": [1], "kwargs": {"c": 2}})
    stats = run(app)
    assert not [c for c in CALLS if c[0] == "add"] and stats.failed == 2
    for mid in (extra, unknown):
        m = fdbqueue.Queue("tasks.error").get(db, mid)
        assert m is not None and m.extra.get("deliveries") == 1, m  # not retried
        assert (m.reason or "").startswith("TaskArgumentsError: task "), m.reason
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, extra, timeout=5.0)
    assert err.value.type == "TaskArgumentsError"


@pytest.mark.parametrize("linger", [0.005, 0.0], ids=["batched", "one-by-one"])
def test_the_async_worker_dead_letters_a_chain_it_cannot_enqueue_and_runs_on(
    db: fdbqueue.Database, linger: float
) -> None:
    app = fdbqueue.Tasks(db)

    @app.task(store_result=True)
    async def twice(n: int) -> int:
        return 2 * n

    fdbqueue.create_queue(db, "vault", owner="ops")
    then = {"task": "elsewhere", "queue": "vault", "args": []}
    denied = fdbqueue.Queue("tasks").enqueue(
        db, {"task": twice.name, "args": [1], "result": 60.0, "then": [then]}
    )
    fine = twice.defer(db, 2)
    stats = app.worker(concurrency=2, settle_linger=linger).run(until_empty=True)
    assert app.result(db, fine, timeout=5.0) == 4 and (stats.processed, stats.failed) == (1, 1)
    m = fdbqueue.Queue("tasks.error").get(db, denied)
    assert m is not None and (m.reason or "").startswith("AccessDeniedError: "), m
    with pytest.raises(fdbqueue.TaskFailedError) as err:
        app.result(db, denied, timeout=5.0)
    assert err.value.type == "AccessDeniedError"


def test_a_hand_made_message_with_a_malformed_chain_is_dead_lettered_not_a_crash(
    db: fdbqueue.Database,
) -> None:
    app, t = make_app(db)
    tasks = fdbqueue.Queue("tasks")
    bad = [
        tasks.enqueue(db, {"task": t["add"].name, "args": [1, 2], "then": [{"task": "x"}]}),  # no queue
        tasks.enqueue(db, {"task": t["add"].name, "args": [1, 2], "then": "next"}),
        tasks.enqueue(
            db,
            {"task": t["add"].name, "args": [1, 2], "then": [{"task": "x", "queue": "q", "priority": "hi"}]},
        ),
        tasks.enqueue(db, {"task": t["add"].name, "args": [1, 2], "result": "long"}),
    ]
    fine = t["add"].defer(db, 2, 2)
    stats = run(app)
    assert app.result(db, fine, timeout=5.0) == 4 and stats.failed == len(bad)
    for mid in bad:
        m = fdbqueue.Queue("tasks.error").get(db, mid)
        assert m is not None and "not a task message" in (m.reason or ""), m
