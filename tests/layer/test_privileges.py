"""Owners and privileges: each right refused and granted, for every operation; a refusal writes
nothing; a revoke takes effect in the next transaction, in every process."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, Queue, QueueError
from fdbqueue.types import RIGHTS

Operation = Callable[[Any, Queue, str, Any], object]
NEEDS_LEASE = {"ack", "nack", "release", "extend"}

# (right, name, operation(db, queue, a message id, a message the owner leased)): every
# operation of the API that acts on a queue.
OPERATIONS: list[tuple[str, str, Operation]] = [
    ("enqueue", "enqueue", lambda db, q, mid, m: q.enqueue(db, b"x")),
    ("enqueue", "enqueue_many", lambda db, q, mid, m: q.enqueue_many(db, [b"x", b"y"])),
    ("dequeue", "dequeue", lambda db, q, mid, m: q.dequeue(db)),
    ("dequeue", "lease", lambda db, q, mid, m: q.lease(db)),
    ("dequeue", "lease_many", lambda db, q, mid, m: q.lease_many(db, 2)),
    ("dequeue", "ack", lambda db, q, mid, m: q.ack(db, m)),
    ("dequeue", "nack", lambda db, q, mid, m: q.nack(db, m)),
    ("dequeue", "release", lambda db, q, mid, m: q.release(db, m)),
    ("dequeue", "extend", lambda db, q, mid, m: q.extend(db, m, 10.0)),
    ("browse", "peek", lambda db, q, mid, m: q.peek(db)),
    ("browse", "get", lambda db, q, mid, m: q.get(db, mid)),
    ("browse", "nth", lambda db, q, mid, m: q.nth(db, 1)),
    ("browse", "size", lambda db, q, mid, m: q.size(db)),
    ("browse", "empty", lambda db, q, mid, m: q.empty(db)),
    ("browse", "browse", lambda db, q, mid, m: list(q.browse(db))),
    ("browse", "stats", lambda db, q, mid, m: fdbqueue.queue_stats(db, "jobs")),
    ("browse", "journal", lambda db, q, mid, m: list(fdbqueue.journal(db, "jobs"))),
    ("admin", "settings", lambda db, q, mid, m: fdbqueue.create_queue(db, "jobs", max_deliveries=4)),
    ("admin", "owner", lambda db, q, mid, m: fdbqueue.create_queue(db, "jobs", owner="svc-b")),
    ("admin", "state", lambda db, q, mid, m: fdbqueue.stop_queue(db, "jobs")),
    ("admin", "purge", lambda db, q, mid, m: fdbqueue.purge_queue(db, "jobs")),
    ("admin", "destroy", lambda db, q, mid, m: fdbqueue.destroy_queue(db, "jobs")),
    ("admin", "grant", lambda db, q, mid, m: fdbqueue.grant(db, "jobs", "svc-c", ["browse"])),
    ("admin", "revoke", lambda db, q, mid, m: fdbqueue.revoke(db, "jobs", "svc-a", ["browse"])),
    ("admin", "acl", lambda db, q, mid, m: fdbqueue.acl(db, "jobs")),
    ("admin", "trim_journal", lambda db, q, mid, m: fdbqueue.trim_journal(db, "jobs")),
]


def dump(db: Any) -> list[tuple[bytes, bytes]]:
    @fdbqueue.transactional
    def everything(tr: Any) -> list[tuple[bytes, bytes]]:
        return [(kv.key, kv.value) for kv in tr.get_range(b"", b"\xff")]

    return everything(db)


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[tuple[Any, Any, str]]:
    """The owner's database and another principal's, on one embedded store; a message id."""
    url = f"sqlite:///{tmp_path / 'q.db'}"
    owner = fdbqueue.open(url, principal="svc-a")
    other = fdbqueue.open(url, principal="svc-b")
    fdbqueue.create_queue(owner, "jobs", owner="svc-a", journal=True)
    mid = Queue("jobs").enqueue_many(owner, [b"1", b"2", b"3", b"4", b"5", b"6"])[0]
    yield owner, other, mid
    owner.close()
    other.close()


@pytest.mark.parametrize(("right", "name", "op"), OPERATIONS, ids=[o[1] for o in OPERATIONS])
def test_each_operation_is_refused_without_its_right_and_allowed_with_it(
    stores: tuple[Any, Any, str], right: str, name: str, op: Operation
) -> None:
    owner, other, mid = stores
    q = Queue("jobs")
    others = [r for r in RIGHTS if r != right]
    fdbqueue.grant(owner, "jobs", "svc-b", others)  # every right but this one
    m = q.lease(owner) if name in NEEDS_LEASE else None
    before = dump(owner)
    with pytest.raises(AccessDeniedError) as refused:
        op(other, q, mid, m)
    assert (refused.value.principal, refused.value.queue, refused.value.right) == ("svc-b", "jobs", right)
    assert str(refused.value) == f"principal 'svc-b' lacks right {right!r} on queue 'jobs'"
    assert dump(owner) == before  # nothing written, nothing journaled
    fdbqueue.grant(owner, "jobs", "svc-b", [right])
    op(other, q, mid, m)


def test_the_owner_has_every_right_and_an_unowned_queue_is_open(stores: tuple[Any, Any, str]) -> None:
    owner, other, mid = stores
    q = Queue("jobs")
    assert q.get(owner, mid) is not None
    assert fdbqueue.acl(owner, "jobs") == {"svc-a": frozenset(RIGHTS)}
    with pytest.raises(AccessDeniedError):
        q.size(other)
    fdbqueue.create_queue(owner, "jobs", owner=None)  # open to all again
    assert q.size(other) == 6
    assert fdbqueue.acl(other, "jobs") == {}
    Queue("free").enqueue(other, b"anyone")  # a queue never given an owner
    assert Queue("free").dequeue(owner) is not None


def test_a_revoke_takes_effect_in_the_next_transaction_of_another_process(
    stores: tuple[Any, Any, str], tmp_path: Path
) -> None:
    owner, other, _ = stores
    q = Queue("jobs")
    fdbqueue.grant(owner, "jobs", "svc-b", ["browse"])
    assert q.size(other) == 6  # cached settings in this process now say svc-b may browse
    child = (
        "import sys, fdbqueue\n"
        "db = fdbqueue.open(sys.argv[1], principal='svc-b')\n"
        "q = fdbqueue.Queue('jobs')\n"
        "print(q.size(db), flush=True)\n"
        "sys.stdin.readline()\n"
        "try:\n"
        "    q.size(db)\n"
        "    print('allowed')\n"
        "except fdbqueue.AccessDeniedError as e:\n"
        "    print('refused', e.right)\n"
    )
    url = f"sqlite:///{tmp_path / 'q.db'}"
    p = subprocess.Popen(
        [sys.executable, "-c", child, url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    assert p.stdout is not None and p.stdin is not None
    assert p.stdout.readline().strip() == "6"
    fdbqueue.revoke(owner, "jobs", "svc-b", ["browse"])
    with pytest.raises(AccessDeniedError):
        q.size(other)  # this process: the next transaction
    p.stdin.write("\n")
    p.stdin.flush()
    assert p.stdout.readline().strip() == "refused browse"
    assert p.wait(30) == 0


def test_journal_and_history_show_only_what_the_principal_may_browse(stores: tuple[Any, Any, str]) -> None:
    owner, other, mid = stores
    fdbqueue.create_queue(other, "open", journal=True)
    Queue("open").enqueue(other, b"mine")
    assert {e.queue for e in fdbqueue.journal(owner, None)} == {"jobs", "open"}
    assert {e.queue for e in fdbqueue.journal(other, None)} == {"open"}
    assert fdbqueue.history(other, mid) == []
    assert [e.op for e in fdbqueue.history(owner, mid)] == ["enqueue"]
    assert [e.principal for e in fdbqueue.journal(owner, "jobs")][:2] == ["svc-a", "svc-a"]


def test_grant_and_revoke_are_journaled_and_bad_input_is_refused(stores: tuple[Any, Any, str]) -> None:
    owner, _, _ = stores
    assert fdbqueue.grant(owner, "jobs", "svc-b", ["enqueue", "browse"]) == {"enqueue", "browse"}
    assert fdbqueue.grant(owner, "jobs", "svc-b", ["browse"]) == {"enqueue", "browse"}  # no change
    assert fdbqueue.revoke(owner, "jobs", "svc-b", ["enqueue"]) == {"browse"}
    entries = [e for e in fdbqueue.journal(owner, "jobs") if e.op in ("grant", "revoke")]
    assert [(e.op, e.details) for e in entries] == [
        ("grant", {"principal": "svc-b", "rights": ["browse", "enqueue"]}),
        ("revoke", {"principal": "svc-b", "rights": ["enqueue"]}),
    ]
    with pytest.raises(QueueError, match="unknown right 'write'"):
        fdbqueue.grant(owner, "jobs", "svc-b", ["write"])
    with pytest.raises(QueueError, match="principal"):
        fdbqueue.grant(owner, "jobs", "", ["browse"])
    with pytest.raises(QueueError, match="principal"):
        fdbqueue.open("memory://", principal="bad\nname")
    with pytest.raises(fdbqueue.QueueNotFoundError):
        fdbqueue.grant(owner, "nope", "svc-b", ["browse"])


def test_the_principal_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FDBQUEUE_PRINCIPAL", "svc-env")
    assert fdbqueue.open("memory://").principal == "svc-env"
    assert fdbqueue.open("memory://", principal="svc-arg").principal == "svc-arg"
    monkeypatch.delenv("FDBQUEUE_PRINCIPAL")
    assert fdbqueue.open("memory://").principal == "anonymous"


def test_privileges_on_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    url = f"sqlite:///{tmp_path / 'q.db'}"
    a, b = ["--url", url, "--principal", "svc-a"], ["--url", url, "--principal", "svc-b"]
    assert main([*a, "create", "jobs", "--owner", "svc-a"]) == 0
    capsys.readouterr()
    assert main([*b, "enqueue", "jobs", "x"]) == 1
    assert "principal 'svc-b' lacks right 'enqueue' on queue 'jobs'" in capsys.readouterr().err
    assert main([*a, "grant", "jobs", "svc-b", "enqueue"]) == 0
    assert "svc-b holds enqueue on jobs" in capsys.readouterr().out
    assert main([*b, "enqueue", "jobs", "x"]) == 0
    assert main([*b, "dequeue", "jobs"]) == 1
    assert "lacks right 'dequeue'" in capsys.readouterr().err
    assert main([*a, "acl", "jobs", "--json"]) == 0
    assert capsys.readouterr().out.strip() == (
        '{"svc-a": ["admin", "browse", "dequeue", "enqueue"], "svc-b": ["enqueue"]}'
    )
    assert main([*a, "revoke", "jobs", "svc-b", "enqueue"]) == 0
    capsys.readouterr()
    assert main([*b, "enqueue", "jobs", "y"]) == 1
    assert main([*a, "grant", "jobs", "svc-b", "write"]) == 2
    assert "unknown right 'write'" in capsys.readouterr().err
    assert main([*b, "acl", "jobs"]) == 1
    assert main([*a, "create", "jobs", "--owner", ""]) == 0
    capsys.readouterr()
    assert main([*b, "acl", "jobs"]) == 0
    assert "open to every principal" in capsys.readouterr().out


def test_an_owned_queues_error_queue_is_made_with_its_owner_and_grants(stores: tuple[Any, Any, str]) -> None:
    """Dead letters are as private as the messages they were: the error queue an owned queue
    makes on its first dead letter takes its owner and grants (else any principal could read,
    redrive or delete them)."""
    owner, other, _ = stores
    fdbqueue.grant(owner, "jobs", "svc-c", ["browse"])
    q, errors = Queue("jobs"), Queue("jobs.error")
    m = q.lease(owner)
    assert m is not None
    assert q.nack(owner, m, discard=True) == "dead"
    assert fdbqueue.acl(owner, "jobs.error") == fdbqueue.acl(owner, "jobs")
    with pytest.raises(AccessDeniedError):
        list(errors.browse(other))
    with pytest.raises(AccessDeniedError):
        errors.delete(other, m.id)
    with pytest.raises(AccessDeniedError):
        fdbqueue.redrive(other, "jobs.error")
    assert [x.id for x in errors.browse(owner)] == [m.id]
    fdbqueue.create_queue(owner, "open")  # an unowned queue's error queue stays open
    o = Queue("open")
    o.enqueue(owner, b"x")
    lease = o.lease(owner)
    assert lease is not None and o.nack(owner, lease, discard=True) == "dead"
    assert [x.id for x in Queue("open.error").browse(other)] == [lease.id]


# -- side doors: error queues, routes, dedup lookups (issue 26) -----------------------------------


@pytest.fixture
def ops_eve(tmp_path: Path) -> Iterator[tuple[Any, Any]]:
    """ops' database and eve's (no right on ops' queues), on one embedded store."""
    url = f"sqlite:///{tmp_path / 'q.db'}?sync=normal"
    ops, eve = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="eve")
    yield ops, eve
    ops.close()
    eve.close()


def _dead_letter(db: Any, queue: str, payload: object) -> str:
    q = Queue(queue)
    q.enqueue(db, payload)
    m = q.lease(db)
    assert m is not None
    assert q.nack(db, m, discard=True) == "dead"
    return m.id


def test_a_stranger_cannot_make_the_error_queue_of_an_owned_queue(ops_eve: tuple[Any, Any]) -> None:
    """The error queue of an owned queue is reserved to its owner: neither made by first use
    nor by create_queue, whether it has the default name or a configured one."""
    ops, eve = ops_eve
    fdbqueue.create_queue(ops, "payroll", owner="ops")
    fdbqueue.create_queue(ops, "billing", owner="ops", error_queue="billing-dead")
    Queue("eve.src").enqueue(eve, b"x")
    for name in ("payroll.error", "billing-dead"):
        before = dump(ops)
        with pytest.raises(AccessDeniedError) as refused:
            Queue(name).enqueue(eve, b"mine")
        assert (refused.value.principal, refused.value.right) == ("eve", "admin")
        with pytest.raises(AccessDeniedError):
            fdbqueue.create_queue(eve, name, owner="eve")
        with pytest.raises(AccessDeniedError):
            fdbqueue.move(eve, "eve.src", name)
        assert dump(ops) == before
    _dead_letter(ops, "payroll", {"salary": 123456})
    with pytest.raises(AccessDeniedError):
        Queue("payroll.error").dequeue(eve)
    fdbqueue.grant(ops, "billing", "eve", ["admin"])  # the owner's admins may make it
    fdbqueue.create_queue(eve, "billing-dead")


def test_an_error_queue_made_before_its_queue_was_owned_is_not_handed_to_a_stranger(
    ops_eve: tuple[Any, Any],
) -> None:
    """eve makes payroll.error (open to all) before payroll is owned and waits on it: the first
    dead letter makes it ops' (its owner and grants) in the same commit, so eve never reads it."""
    ops, eve = ops_eve
    Queue("payroll.error").enqueue(eve, b"eve's own")
    fdbqueue.create_queue(ops, "payroll", owner="ops")
    fdbqueue.grant(ops, "payroll", "svc-hr", ["browse"])
    mid = _dead_letter(ops, "payroll", {"salary": 123456})
    with pytest.raises(AccessDeniedError):
        Queue("payroll.error").dequeue(eve)
    assert fdbqueue.acl(ops, "payroll.error") == fdbqueue.acl(ops, "payroll")
    assert mid in [m.id for m in Queue("payroll.error").browse(ops)]


def test_an_error_queue_of_another_owner_is_refused_and_never_given_a_dead_letter(
    ops_eve: tuple[Any, Any],
) -> None:
    """eve owns payroll.error before payroll exists: making payroll owned with that error queue
    is refused (clear error), and a dead letter of a queue whose error queue has another owner
    stays where it was (no queue of eve's ever holds it)."""
    ops, eve = ops_eve
    fdbqueue.create_queue(eve, "payroll.error", owner="eve")
    with pytest.raises(fdbqueue.ForeignQueueError, match=r"payroll\.error.*'eve'"):
        fdbqueue.create_queue(ops, "payroll", owner="ops")
    fdbqueue.create_queue(ops, "payroll", owner="ops", error_queue="payroll.dead")  # another name: fine
    _dead_letter(ops, "payroll", b"ok")
    assert fdbqueue.acl(ops, "payroll.dead") == fdbqueue.acl(ops, "payroll")
    # payroll made (open) by first use, then owned: the same refusal, and its dead letters
    # while still open do not go into eve's queue either.
    fdbqueue.create_queue(eve, "wages.error", owner="eve")
    Queue("wages").enqueue(ops, {"salary": 1})
    with pytest.raises(fdbqueue.ForeignQueueError):
        fdbqueue.create_queue(ops, "wages", owner="ops")
    m = Queue("wages").lease(ops)
    assert m is not None
    with pytest.raises(fdbqueue.ForeignQueueError):
        Queue("wages").nack(ops, m, discard=True)
    assert Queue("wages.error").size(eve) == 0


def test_an_error_queue_setting_is_no_way_into_or_out_of_a_foreign_queue(ops_eve: tuple[Any, Any]) -> None:
    """create_queue(..., error_queue=X) naming another principal's queue X is refused; one set
    before X was owned delivers nothing into X."""
    ops, eve = ops_eve
    fdbqueue.create_queue(ops, "payroll", owner="ops")
    Queue("payroll").enqueue(ops, {"salary": 123456})
    with pytest.raises(fdbqueue.ForeignQueueError):
        fdbqueue.create_queue(eve, "evejobs", error_queue="payroll")
    with pytest.raises(fdbqueue.ForeignQueueError):
        fdbqueue.create_queue(eve, "evejobs2", owner="eve", error_queue="payroll")
    fdbqueue.create_queue(eve, "evil", error_queue="later")  # later is nobody's yet
    fdbqueue.create_queue(ops, "later", owner="ops")
    Queue("later").enqueue(ops, {"salary": 1})
    Queue("evil").enqueue(eve, b"planted")
    m = Queue("evil").lease(eve)
    assert m is not None
    with pytest.raises(fdbqueue.ForeignQueueError):
        Queue("evil").nack(eve, m, discard=True)
    assert Queue("later").size(ops) == 1
    assert fdbqueue.queue_stats(eve, "evil").errors == 0  # not even how many ops' queue holds


def test_routes_of_an_owned_partitioned_queue_need_admin_and_browse(ops_eve: tuple[Any, Any]) -> None:
    ops, eve = ops_eve
    cards = fdbqueue.PartitionedQueue("cards", partitions=2, key="customer")
    for q in cards.queues:
        fdbqueue.create_queue(ops, q.name, owner="ops")
    cards.enqueue(ops, {"card": "4242"}, headers={"customer": "acme"})
    fdbqueue.set_route(ops, "cards", "vip", "cards.vip")
    before = dump(ops)
    with pytest.raises(AccessDeniedError) as refused:
        fdbqueue.set_route(eve, "cards", "acme", "eve.inbox")
    assert refused.value.right == "admin"
    with pytest.raises(AccessDeniedError):
        fdbqueue.set_route(eve, "cards", "vip", None)
    with pytest.raises(AccessDeniedError) as refused:
        fdbqueue.routes(eve, "cards")
    assert refused.value.right == "browse"
    assert dump(ops) == before
    assert fdbqueue.routes(ops, "cards") == {"vip": "cards.vip"}
    fdbqueue.grant(ops, "cards.p0", "eve", ["admin"])  # admin on one partition is not enough
    with pytest.raises(AccessDeniedError):
        fdbqueue.set_route(eve, "cards", "acme", "eve.inbox")


def test_a_route_planted_before_the_partitions_were_owned_sends_nothing_to_a_stranger(
    ops_eve: tuple[Any, Any],
) -> None:
    ops, eve = ops_eve
    fdbqueue.set_route(eve, "cards", "acme", "eve.inbox")  # nothing owned yet: allowed
    Queue("eve.inbox").enqueue(eve, b"mine")
    cards = fdbqueue.PartitionedQueue("cards", partitions=2, key="customer")
    for q in cards.queues:
        fdbqueue.create_queue(ops, q.name, owner="ops")
    with pytest.raises(fdbqueue.ForeignQueueError, match=r"eve\.inbox"):
        cards.enqueue(ops, {"card": "4111"}, headers={"customer": "acme"})
    assert Queue("eve.inbox").size(eve) == 1
    fdbqueue.set_route(ops, "cards", "acme", None)
    cards.enqueue(ops, {"card": "4111"}, headers={"customer": "acme"})
    assert cards.size(ops) == 1


def test_a_dedup_lookup_needs_the_enqueue_right(ops_eve: tuple[Any, Any]) -> None:
    ops, eve = ops_eve
    fdbqueue.create_queue(ops, "payroll", owner="ops")
    mid = Queue("payroll").enqueue(ops, b"x", dedup_key="run-42")
    with pytest.raises(AccessDeniedError) as refused:
        Queue("payroll").deduplicated(eve, "run-42")
    assert refused.value.right == "enqueue"
    with pytest.raises(AccessDeniedError):
        Queue("payroll").deduplicated(eve, "never-used")
    fdbqueue.grant(ops, "payroll", "eve", ["enqueue"])
    assert Queue("payroll").deduplicated(eve, "run-42") == mid
