"""Every public function, method and command, walked as a principal with no right.

ops owns a queue ("vault") holding messages, a dead letter, a delayed and a leased message, a
journal, a dedup key and a schedule, and a partitioned queue ("cards") with a route. eve holds
no right on any of them. Each entry of the public surface - ``fdbqueue.__all__`` (functions and
the methods of the classes that reach a store), ``fdbqueue.aio``, the Spark data source's
readers (``fdbqueue.api.export``), the dashboard's and the exporter's readers, and every command of
the CLI's parser - is called as eve, and must either be refused with AccessDeniedError (the CLI:
exit 1 and one line naming the missing right) or be one of the few that are open to all and
then reveal none of ops' messages and change nothing. The store is compared key by key before
and after each call.

The walk is checked against the live surface: a new public name or command fails
``test_the_walk_covers_the_whole_public_surface`` until it is walked here (or listed, with
the reason, among the names that reach no queue).
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, Queue, aio
from fdbqueue.api import export
from fdbqueue.api.task_results import write_result
from fdbqueue.cli import build_parser, main
from fdbqueue.ops import steps
from fdbqueue.ops.txn import run_once
from fdbqueue.runtime.metrics import QueueCollector, WorkerCollector
from fdbqueue.runtime.registry import Registration
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.web import views

SECRET = "s3cret-4111"
DEDUP = "run-42"
RESULT = "task-of-ops"  # the id of a task of ops' on the vault whose result is kept

# Classes of __all__ that are values (no store access: made from what a call returned), and
# functions that reach no queue. Database and Transaction are the store itself: a client that
# can open it can read every key (docs/security.md, "What the layer enforces").
VALUES = {
    "AutonomousId", "Consumer", "ContentType", "DispatcherStats", "ForwardStats", "JournalEntry",
    "KeySelector", "KeyValue", "Message", "NewMessage", "QueueConfig", "QueueState", "QueueStats",
    "RemoteStats", "Schedule", "SweepStats", "Watch", "WorkerStats", "WorkerInfo", "CurrentMessage",
}  # fmt: skip
NO_QUEUE = {
    "Database": "the store's key-value interface: below the layer's rights (docs/security.md)",
    "Transaction": "the store's key-value interface: below the layer's rights (docs/security.md)",
    "Forwarder.prune_markers": "clears the forwarder's own markers at its destination (walked: OPEN)",
    "open": "opens a store; names no queue",
    "transactional": "a decorator; names no queue",
    "aio.transactional": "a decorator; names no queue",
    "aio.wait_watch": "waits on a Watch the caller made; names no queue",
    "export.option_root": "parses an option",
    "export.open_from": "opens a store from options; names no queue",
    "Worker.stop": "sets a flag of the caller's own worker",
    "Worker.stopping": "reads a flag of the caller's own worker",
    "Dispatcher.stop": "sets a flag of the caller's own dispatcher",
    "Forwarder.stop": "sets a flag of the caller's own forwarder",
    "Scheduler.stop": "sets a flag of the caller's own scheduler",
    "aio.AsyncWorker.stop": "sets a flag of the caller's own worker",
    "PartitionedQueue.partition_of": "a hash of the value: no I/O",
    "cli demo": "runs on a temporary store, or on queues of its own it removes after",
}
# Commands that serve until stopped: walked through what they serve (the same functions).
SERVED_BY = {
    "cli web": ["web.views.queue_detail", "web.views.messages", "web.views.message", "web.views.workers"],
    "cli metrics": ["metrics.QueueCollector", "metrics.WorkerCollector"],
    "cli scheduler": ["Scheduler.run"],
}


@dataclass
class World:
    url: str
    ops: Any
    eve: Any
    ids: list[str]  # every message id of ops' queues
    leased: Any  # a Message ops leased
    tmp: Path


def dump(db: Any) -> list[tuple[bytes, bytes]]:
    @fdbqueue.transactional
    def everything(tr: Any) -> list[tuple[bytes, bytes]]:
        return [(kv.key, kv.value) for kv in tr.get_range(b"", b"\xff")]

    return everything(db)


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    tmp = tmp_path_factory.mktemp("walk")
    url = f"sqlite://{tmp / 'q.db'}?sync=normal"
    ops, eve = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="eve")
    fdbqueue.create_queue(ops, "vault", owner="ops", journal=True, max_deliveries=2)
    q = Queue("vault")
    ids = [q.enqueue(ops, {"secret": SECRET, "n": i}, headers={"h": SECRET}) for i in range(3)]
    ids.append(q.enqueue(ops, {"secret": SECRET}, dedup_key=DEDUP))
    ids.append(q.enqueue(ops, {"secret": SECRET}, delay=3600.0))
    dead = q.lease(ops)
    assert dead is not None and q.nack(ops, dead, discard=True, reason=SECRET) == "dead"
    leased = q.lease(ops, lease_seconds=3600.0)
    assert leased is not None
    cards = fdbqueue.PartitionedQueue("cards", partitions=2, key="customer")
    for p in [*cards.queues, Queue("cards.vip")]:
        fdbqueue.create_queue(ops, p.name, owner="ops")
    ids.append(cards.enqueue(ops, {"card": SECRET}, headers={"customer": "acme"}))
    fdbqueue.set_route(ops, "cards", "vip", "cards.vip")
    fdbqueue.schedule(ops, "vault", "* * * * *", {"secret": SECRET}, name="nightly")
    # A worker of ops' in the registry, a message of the vault in hand, dead at once (its
    # heartbeats said every millisecond): what workers() may show and prune_workers clear.
    reg = Registration(ops, "Worker", ["vault"], lambda: (1, 0), interval=0.001)
    reg.begin("vault", ids[0])
    reg.beat()
    run_once(
        ops,
        lambda t, _: write_result(
            t, DEFAULT_ROOT, RESULT, "vault", 3600.0, value=b'"' + SECRET.encode() + b'"'
        ),
    )
    Queue("eve.box").enqueue(eve, b"eve's own")  # eve's queue: a source for moves into ops'
    own = Queue("eve.job")  # and an error queue of eve's own, holding a dead letter: a redrive's source
    own.enqueue(eve, b"eve's poison")
    mine = own.lease(eve)
    assert mine is not None and own.nack(eve, mine, discard=True, reason="eve's") == "dead"
    yield World(url, ops, eve, ids, leased, tmp)
    ops.close()
    eve.close()


# -- the walk: name -> what eve calls -----------------------------------------------------------

Call = Callable[[World], object]
VAULT, ERRORS = Queue("vault"), Queue("vault.error")
AVAULT = aio.AsyncQueue("vault")
CARDS = fdbqueue.PartitionedQueue("cards", partitions=2, key="customer")


def _aio(make: Callable[[World], Any]) -> Call:
    return lambda w: asyncio.run(make(w))


async def _alist(it: Any) -> list[Any]:
    return [x async for x in it]


def _task_app(db: Any) -> tuple[fdbqueue.Tasks, Any]:
    app = fdbqueue.Tasks(db)

    @app.task(queue="vault", store_result=True)
    def peek(n: int) -> None:
        raise AssertionError(f"a task of eve's ran on ops' queue: {n}")

    return app, peek


def _handler(m: Any) -> None:
    raise AssertionError(f"a handler of eve's got ops' message {m.id}")


REFUSED: dict[str, Call] = {
    # -- Queue ------------------------------------------------------------------------------
    "Queue.enqueue": lambda w: VAULT.enqueue(w.eve, b"x"),
    "Queue.enqueue_many": lambda w: VAULT.enqueue_many(w.eve, [b"x"]),
    "Queue.deduplicated": lambda w: VAULT.deduplicated(w.eve, DEDUP),
    "Queue.dequeue": lambda w: VAULT.dequeue(w.eve),
    "Queue.dequeue_steps": lambda w: steps.drive(VAULT.dequeue_steps(w.eve, 0.05, None, False)),
    "Queue.lease": lambda w: VAULT.lease(w.eve),
    "Queue.lease_many": lambda w: VAULT.lease_many(w.eve, 2),
    "Queue.lease_steps": lambda w: steps.drive(VAULT.lease_steps(w.eve, 1, None, 0.05, None)),
    "Queue.ack": lambda w: VAULT.ack(w.eve, w.leased),
    "Queue.ack_many": lambda w: VAULT.ack_many(w.eve, [w.leased]),
    "Queue.nack": lambda w: VAULT.nack(w.eve, w.leased, discard=True),
    "Queue.nack_many": lambda w: VAULT.nack_many(w.eve, [w.leased]),
    "Queue.release": lambda w: VAULT.release(w.eve, w.leased),
    "Queue.extend": lambda w: VAULT.extend(w.eve, w.leased, 10.0),
    "Queue.wait": lambda w: VAULT.wait(w.eve, 0.05),
    "Queue.peek": lambda w: VAULT.peek(w.eve),
    "Queue.nth": lambda w: VAULT.nth(w.eve, 0),
    "Queue.get": lambda w: VAULT.get(w.eve, w.ids[0]),
    "Queue.delete": lambda w: VAULT.delete(w.eve, w.ids[0]),
    "Queue.size": lambda w: VAULT.size(w.eve),
    "Queue.empty": lambda w: VAULT.empty(w.eve),
    "Queue.browse": lambda w: list(VAULT.browse(w.eve)),
    # -- aio --------------------------------------------------------------------------------
    "aio.AsyncQueue.enqueue": _aio(lambda w: AVAULT.enqueue(w.eve, b"x")),
    "aio.AsyncQueue.enqueue_many": _aio(lambda w: AVAULT.enqueue_many(w.eve, [b"x"])),
    "aio.AsyncQueue.deduplicated": _aio(lambda w: AVAULT.deduplicated(w.eve, DEDUP)),
    "aio.AsyncQueue.dequeue": _aio(lambda w: AVAULT.dequeue(w.eve, timeout=0.05)),
    "aio.AsyncQueue.lease": _aio(lambda w: AVAULT.lease(w.eve, timeout=0.05)),
    "aio.AsyncQueue.lease_many": _aio(lambda w: AVAULT.lease_many(w.eve, 2)),
    "aio.AsyncQueue.wait": _aio(lambda w: AVAULT.wait(w.eve, 0.05)),
    "aio.AsyncQueue.ack": _aio(lambda w: AVAULT.ack(w.eve, w.leased)),
    "aio.AsyncQueue.ack_many": _aio(lambda w: AVAULT.ack_many(w.eve, [w.leased])),
    "aio.AsyncQueue.nack": _aio(lambda w: AVAULT.nack(w.eve, w.leased)),
    "aio.AsyncQueue.nack_many": _aio(lambda w: AVAULT.nack_many(w.eve, [w.leased])),
    "aio.AsyncQueue.release": _aio(lambda w: AVAULT.release(w.eve, w.leased)),
    "aio.AsyncQueue.extend": _aio(lambda w: AVAULT.extend(w.eve, w.leased, 10.0)),
    "aio.AsyncQueue.peek": _aio(lambda w: AVAULT.peek(w.eve)),
    "aio.AsyncQueue.get": _aio(lambda w: AVAULT.get(w.eve, w.ids[0])),
    "aio.AsyncQueue.nth": _aio(lambda w: AVAULT.nth(w.eve, 0)),
    "aio.AsyncQueue.size": _aio(lambda w: AVAULT.size(w.eve)),
    "aio.AsyncQueue.empty": _aio(lambda w: AVAULT.empty(w.eve)),
    "aio.AsyncQueue.delete": _aio(lambda w: AVAULT.delete(w.eve, w.ids[0])),
    "aio.AsyncQueue.browse": _aio(lambda w: _alist(AVAULT.browse(w.eve))),
    "aio.AsyncWorker.run": _aio(
        lambda w: aio.AsyncWorker(w.eve, "vault", _async_handler).run(until_empty=True)
    ),
    "aio.journal": _aio(lambda w: _alist(aio.journal(w.eve, "vault"))),
    # -- PartitionedQueue, routes -------------------------------------------------------------
    "PartitionedQueue.route": lambda w: CARDS.route(w.eve, "vip"),
    "PartitionedQueue.enqueue": lambda w: CARDS.enqueue(w.eve, b"x", headers={"customer": "acme"}),
    "PartitionedQueue.size": lambda w: CARDS.size(w.eve),
    "PartitionedQueue.stats": lambda w: CARDS.stats(w.eve),
    "PartitionedQueue.browse": lambda w: list(CARDS.browse(w.eve)),
    "set_route": lambda w: fdbqueue.set_route(w.eve, "cards", "acme", "eve.box"),
    "routes": lambda w: fdbqueue.routes(w.eve, "cards"),
    # -- administration -------------------------------------------------------------------------
    "acl": lambda w: fdbqueue.acl(w.eve, "vault"),
    "create_queue": lambda w: fdbqueue.create_queue(w.eve, "vault", max_deliveries=9),
    "destroy_queue": lambda w: fdbqueue.destroy_queue(w.eve, "vault"),
    "grant": lambda w: fdbqueue.grant(w.eve, "vault", "eve", ["browse"]),
    "revoke": lambda w: fdbqueue.revoke(w.eve, "vault", "ops", ["browse"]),
    "purge_queue": lambda w: fdbqueue.purge_queue(w.eve, "vault"),
    "queue_stats": lambda w: fdbqueue.queue_stats(w.eve, "vault"),
    "queue_rates": lambda w: fdbqueue.queue_rates(w.eve, "vault", interval=0.01),
    "set_state": lambda w: fdbqueue.set_state(w.eve, "vault", enqueue=False),
    "start_queue": lambda w: fdbqueue.start_queue(w.eve, "vault"),
    "stop_queue": lambda w: fdbqueue.stop_queue(w.eve, "vault"),
    "journal": lambda w: list(fdbqueue.journal(w.eve, "vault")),
    "trim_journal": lambda w: fdbqueue.trim_journal(w.eve, "vault"),
    # -- moving messages --------------------------------------------------------------------------
    "move": lambda w: fdbqueue.move(w.eve, "vault", "eve.box"),
    "move (into)": lambda w: fdbqueue.move(w.eve, "eve.box", "vault"),
    "redrive": lambda w: fdbqueue.redrive(w.eve, "vault.error", to="eve.box"),
    "redrive (into)": lambda w: fdbqueue.redrive(w.eve, "eve.job.error", to="vault"),
    "forward": lambda w: fdbqueue.forward(w.eve, "vault", fdbqueue.open("memory://"), "x"),
    "Forwarder.step": lambda w: fdbqueue.Forwarder(w.eve, "vault", fdbqueue.open("memory://"), "x").step(),
    "Forwarder.run": lambda w: fdbqueue.Forwarder(w.eve, "vault", fdbqueue.open("memory://"), "x").run(),
    "Forwarder.step (named)": lambda w: fdbqueue.Forwarder(
        w.eve, "vault", fdbqueue.open("memory://"), "x", name="outbox-1"
    ).step(),
    "forward (named, limit)": lambda w: fdbqueue.forward(
        w.eve, "vault", fdbqueue.open("memory://"), "x", name="outbox-1", limit=1
    ),
    "Forwarder.recover": lambda w: fdbqueue.Forwarder(
        w.eve, "vault", fdbqueue.open("memory://"), "x"
    ).recover(),
    "RemoteQueue.enqueue": lambda w: fdbqueue.RemoteQueue(
        "vault", remote=w.eve, local=fdbqueue.open("memory://")
    ).enqueue(None, b"x"),
    "RemoteQueue.forwarder": lambda w: _remote_forwarder(w),
    # -- workers and schedules ------------------------------------------------------------------
    "Worker": lambda w: fdbqueue.Worker(w.eve, "vault", _handler).run(until_empty=True),
    "Worker.run": lambda w: fdbqueue.Worker(w.eve, "vault", _handler).run(until_empty=True),
    "Dispatcher": lambda w: _dispatch(w),
    "Tasks.worker": lambda w: _task_app(w.eve)[0].worker().run(until_empty=True),
    "Tasks.aio_worker": _aio(lambda w: _task_app(w.eve)[0].aio_worker().run(until_empty=True)),
    "Tasks.result": lambda w: _task_app(w.eve)[0].result(w.eve, RESULT, timeout=0.1),
    "Tasks.task.defer": lambda w: _task_app(w.eve)[1].defer(w.eve, n=1),
    "Dispatcher.add_consumer": lambda w: _dispatch(w),
    "Dispatcher.run": lambda w: _dispatch(w),
    "schedule": lambda w: fdbqueue.schedule(w.eve, "vault", "* * * * *", b"x", name="eve"),
    "unschedule": lambda w: fdbqueue.unschedule(w.eve, "nightly"),
    # -- readers of the Spark source, the dashboard, the exporter ---------------------------------
    "export.queue_names": lambda w: export.queue_names(w.eve, "vault"),
    "export.plan": lambda w: export.plan(w.eve, ["vault"]),
    "export.read_piece": lambda w: [list(export.read_piece(w.eve, p)) for p in export.plan(w.ops, ["vault"])],
    "export.journal_names": lambda w: export.journal_names(w.eve, "vault"),
    "export.journal_plan": lambda w: export.journal_plan(w.eve, "vault"),
    "export.journal_head": lambda w: export.journal_head(w.eve, ["vault"]),
    "export.read_journal_piece": lambda w: [
        list(export.read_journal_piece(w.eve, p)) for p in export.journal_plan(w.ops, "vault")
    ],
    "web.views.queue_detail": lambda w: views.queue_detail(w.eve, "vault"),
    "web.views.messages": lambda w: views.messages(w.eve, "vault"),
    "web.views.message": lambda w: views.message(w.eve, "vault", w.ids[0]),
}

# Open to every principal: each must reveal none of ops' messages and change nothing.
OPEN: dict[str, Call] = {
    "list_queues": lambda w: fdbqueue.list_queues(w.eve),  # names only
    "queue_config": lambda w: fdbqueue.queue_config(w.eve, "vault"),  # settings, no messages
    "export.error_queues": lambda w: export.error_queues(w.eve, ["vault"]),  # settings
    "partitioned_queues": lambda w: fdbqueue.partitioned_queues(w.eve),  # names only
    "all_queue_stats": lambda w: _none_of_ops(fdbqueue.all_queue_stats(w.eve)),
    "metrics.QueueCollector": lambda w: _none_of_ops(QueueCollector(w.eve).stats()),
    "history": lambda w: _empty(fdbqueue.history(w.eve, w.ids[0])),
    "workers": lambda w: _empty(fdbqueue.workers(w.eve)),  # ops' worker: not eve's to see
    "prune_workers": lambda w: fdbqueue.prune_workers(w.eve, older_than=0),  # not eve's to clear
    "web.views.workers": lambda w: _none_of_ops(views.workers(w.eve)["workers"]),
    "metrics.WorkerCollector": lambda w: _empty(WorkerCollector(w.eve).workers()),
    "journal (every queue)": lambda w: _none_of_ops(list(fdbqueue.journal(w.eve, None))),
    "schedules": lambda w: _none_of_ops(fdbqueue.schedules(w.eve)),
    "run_schedules": lambda w: _empty(fdbqueue.run_schedules(w.eve)),  # eve's rights: enqueues nothing
    "Scheduler": lambda w: _scheduler(w),
    # A sweep does only what the next dequeue would (nothing here is due: it changes nothing).
    "Queue.sweep": lambda w: VAULT.sweep(w.eve),
    "aio.AsyncQueue.sweep": _aio(lambda w: AVAULT.sweep(w.eve)),
    "Forwarder.prune_markers": lambda w: fdbqueue.Forwarder(
        w.eve, "vault", fdbqueue.open("memory://"), "x"
    ).prune_markers(),
    "Scheduler.run": lambda w: _scheduler(w),
}


async def _async_handler(m: Any) -> None:
    raise AssertionError(f"a handler of eve's got ops' message {m.id}")


def _remote_forwarder(w: World) -> object:
    local = fdbqueue.open("memory://", principal="eve")
    Queue("vault").enqueue(local, b"eve's, for ops' queue")
    return fdbqueue.RemoteQueue("vault", remote=w.eve, local=local).forwarder().step()


def _dispatch(w: World) -> object:
    d = fdbqueue.Dispatcher(w.eve, ["vault"])
    d.add_consumer(_handler)
    return d.run(until_empty=True)


def _scheduler(w: World) -> object:
    sched = fdbqueue.Scheduler(w.eve, interval=0.05)
    sched.stop()  # one pass, then stop
    return _empty(sched.run())


def _none_of_ops(items: Any) -> object:
    names = [getattr(x, a, None) for x in items for a in ("name", "queue")]
    assert not {"vault", "vault.error", "cards.p0", "cards.p1", "cards.vip"} & set(names), names
    return items


def _empty(found: Any) -> object:
    assert not found, found
    return found


# CLI: argv after "--url U --principal eve"; every one refused (exit 1, one line).
CLI: dict[str, list[str]] = {
    "create": ["create", "vault", "--max-deliveries", "9"],
    "delete": ["delete", "vault", "--yes"],
    "delete (ids)": ["delete", "vault", "ID0"],
    "stats": ["stats", "vault"],
    "enqueue": ["enqueue", "vault", "x"],
    "dequeue": ["dequeue", "vault"],
    "peek": ["peek", "vault"],
    "browse": ["browse", "vault"],
    "get": ["get", "vault", "ID0"],
    "purge": ["purge", "vault", "--yes"],
    "pause": ["pause", "vault"],
    "resume": ["resume", "vault"],
    "worker": ["worker", "vault", "--handler", "tests.support.cli_handlers:record", "--until-empty"],
    "journal": ["journal", "vault"],
    "grant": ["grant", "vault", "eve", "browse"],
    "revoke": ["revoke", "vault", "ops", "browse"],
    "acl": ["acl", "vault"],
    "redrive": ["redrive", "vault.error", "--to", "eve.box"],
    "move": ["move", "vault", "eve.box"],
    "forward": ["forward", "--from", "URL", "--queue", "vault", "--to", "memory://", "--to-queue", "x"],
    "forward (named)": ["forward", "--from", "URL", "--queue", "vault", "--to", "memory://", "--name", "n"],
    "routes": ["routes", "cards"],
    "route": ["route", "cards", "acme", "eve.box"],
    "audit": ["audit", "--url", "URL", "--queue", "vault", "--out", "OUT"],
    "schedule": ["schedule", "eve", "vault", "* * * * *", "x"],
    "unschedule": ["unschedule", "nightly"],
}
CLI_OPEN: dict[str, list[str]] = {
    "list": ["list"],
    "schedules": ["schedules"],
    "history": ["history", "ID0"],
    "sweep": ["sweep", "vault"],
    "workers": ["workers"],
}


def live_surface() -> set[str]:
    """Every public name that may reach a store, as walked above."""
    out: set[str] = set()

    def members(prefix: str, cls: type) -> None:
        out.add(prefix)
        out.update(f"{prefix}.{m}" for m in vars(cls) if not m.startswith("_"))

    for name in fdbqueue.__all__:
        obj = getattr(fdbqueue, name)
        if inspect.isclass(obj):
            if issubclass(obj, BaseException) or name in VALUES:
                continue
            if name in NO_QUEUE:  # the store's own interface, members and all
                out.add(name)
                continue
            members(name, obj)
        else:
            out.add(name)
    for name in aio.__all__:
        obj = getattr(aio, name)
        if inspect.isclass(obj):
            members(f"aio.{name}", obj)
        else:
            out.add(f"aio.{name}")
    for name, obj in vars(export).items():
        if inspect.isfunction(obj) and obj.__module__ == export.__name__ and not name.startswith("_"):
            out.add(f"export.{name}")
    parser = build_parser()
    for action in parser._actions:  # the subcommands, from the parser itself
        if isinstance(action, argparse._SubParsersAction):
            out.update(f"cli {command}" for command in action.choices)
    return out


def walked() -> set[str]:
    names = set(REFUSED) | set(OPEN) | set(NO_QUEUE)
    names |= {f"cli {c.split(' ')[0]}" for c in [*CLI, *CLI_OPEN]}
    names |= {c for c, by in SERVED_BY.items() if all(b in names for b in by)}
    # "aio.AsyncQueue" and the other classes themselves: walked through their methods.
    names |= {n.rsplit(".", 1)[0] for n in names if n.count(".") >= 1}
    return names


def test_the_walk_covers_the_whole_public_surface() -> None:
    missing = live_surface() - walked()
    assert not missing, f"public names not walked as a principal with no rights: {sorted(missing)}"


def _check(world: World, call: Call, refused: bool) -> None:
    before = dump(world.ops)
    try:
        result = call(world)
    except AccessDeniedError as exc:
        assert exc.principal == "eve", exc
        assert refused, f"refused, but documented as open to all: {exc}"
    else:
        assert not refused, f"allowed a principal with no right: {result!r}"
        shown = repr(result)
        assert SECRET not in shown and not any(i in shown for i in world.ids), shown
    assert dump(world.ops) == before, "the store changed"


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_each_path_is_refused_to_a_principal_with_no_right(world: World, name: str) -> None:
    _check(world, REFUSED[name], True)


@pytest.mark.parametrize("name", sorted(OPEN))
def test_each_open_path_reveals_and_changes_nothing_of_anothers_queue(world: World, name: str) -> None:
    _check(world, OPEN[name], False)


def _argv(world: World, argv: list[str]) -> list[str]:
    out = []
    for a in argv:
        a = {"URL": world.url, "OUT": str(world.tmp / "audit"), "ID0": world.ids[0]}.get(a, a)
        out.append(a)
    return ["--url", world.url, "--principal", "eve", *out]


@pytest.mark.parametrize("name", sorted(CLI))
def test_each_command_is_refused_with_one_line(
    world: World, name: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FDBQUEUE_PRINCIPAL", "eve")  # commands opening stores of their own
    before = dump(world.ops)
    capsys.readouterr()
    code = main(_argv(world, CLI[name]))
    out, err = capsys.readouterr()
    assert code == 1, (code, out, err)
    assert SECRET not in out + err and not any(i in out for i in world.ids), out
    # One line says what was refused (a long-running command may have announced itself first).
    errors = [line for line in err.splitlines() if line.startswith("fdbqueue: error:")]
    assert len(errors) == 1 and errors[0].startswith("fdbqueue: error: principal 'eve' lacks right"), err
    assert err.strip().splitlines()[-1] == errors[0], err
    assert dump(world.ops) == before


@pytest.mark.parametrize("name", sorted(CLI_OPEN))
def test_each_open_command_reveals_and_changes_nothing(
    world: World, name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    before = dump(world.ops)
    capsys.readouterr()
    code = main(_argv(world, CLI_OPEN[name]))
    out, err = capsys.readouterr()
    assert code in (0, 3), (code, out, err)  # 3: nothing to show (history of a message not ours)
    assert SECRET not in out + err and not any(i in out for i in world.ids), out
    assert dump(world.ops) == before
