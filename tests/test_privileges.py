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
    others = [r for r in fdbqueue.privileges.RIGHTS if r != right]
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
    assert fdbqueue.acl(owner, "jobs") == {"svc-a": frozenset(fdbqueue.privileges.RIGHTS)}
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
