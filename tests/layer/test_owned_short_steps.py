"""An owned queue on the short steps (issue 30, ninth pass): every privilege side door.

A queue with an owner and grants is served by the short steps of an enqueue
(``enqueuing.enqueue_one``), a dequeue in a caller's transaction (``head.take_short``), a lease
(``leasing.lease_short``) and an ack (``delivery.ack_short``) for a principal that holds the
right, decided once per metadata version and principal (``config._plain_limit``,
``config._take_keys``; the ack's from the guard it reads). Each test here tries a way around
that decision - a principal without the right, a right revoked just after it served (by another
handle, by another process), an owner changed, two handles of different principals taking
turns on one queue, a handle whose principal changes, the anonymous principal - and checks
the operation is refused with AccessDeniedError and the store unchanged, as the long way
refuses it.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
import fdbqueue.api.queue as api
from fdbqueue import AccessDeniedError, Message, Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.ops import enqueuing
from tests.support.ways import Ways

OWNER, USER, STRANGER = "svc-owner", "svc-050", "svc-stranger"
RIGHTS = ["enqueue", "dequeue", "browse"]


class Long:
    """How many enqueues, takes, leases and acks went the long way."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ways = Ways(monkeypatch)
        self.enqueues = 0
        self.takes = 0
        real_attempt, real_take = enqueuing._attempt, api.Queue._take

        def attempt(*args: Any, **kwargs: Any) -> Any:
            self.enqueues += 1
            return real_attempt(*args, **kwargs)

        def take(*args: Any, **kwargs: Any) -> Any:
            self.takes += 1
            return real_take(*args, **kwargs)

        monkeypatch.setattr(enqueuing, "_attempt", attempt)
        monkeypatch.setattr(api.Queue, "_take", take)

    def all(self) -> tuple[int, int, int, int]:
        return self.enqueues, self.takes, self.ways.leases, self.ways.acks


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def admin(url: str) -> Iterator[Database]:
    """The owner's handle, the queue made with 100 grants (bench_journal's third table's)."""
    db = fdbqueue.open(url, principal=OWNER)
    fdbqueue.create_queue(db, "jobs", owner=OWNER)
    for i in range(100):
        if i != 77:  # svc-077: no grant
            fdbqueue.grant(db, "jobs", f"svc-{i:03d}", RIGHTS)
    yield db
    db.close()


@pytest.fixture
def user(url: str, admin: Database) -> Iterator[Database]:
    db = fdbqueue.open(url, principal=USER)
    yield db
    db.close()


def dump(db: Database) -> list[tuple[bytes, bytes]]:
    """Every key of the store and its value."""
    return [(kv.key, kv.value) for kv in run_transaction(db, lambda tr: tr.get_range(b"", b"\xff"))]


def take(db: Database, q: Queue) -> Message | None:
    def body(tr: Transaction) -> Message | None:
        return q.dequeue(tr)

    return run_transaction(db, body)


def warm(db: Database, q: Queue) -> None:
    """Enqueues, takes, a lease and an ack by ``db``: every short step's plan made for it."""
    q.enqueue_many(db, [b"w"] * 8)
    for _ in range(3):
        q.enqueue(db, b"warm")
    for _ in range(2):
        assert take(db, q) is not None
    m = q.lease(db)
    assert m is not None
    q.ack(db, m)


def refused_everywhere(
    db: Database, admin: Database, q: Queue, leased: Message | None = None, first: int = 0
) -> None:
    """Each step by ``db`` refused with AccessDeniedError and the store unchanged; ``leased``:
    a message another principal leased, which ``db`` may not ack either; ``first``: the step
    tried first (0: the enqueue, 1: the take in a transaction, 2: the dequeue, 3: the lease;
    then each in a caller's transaction)."""
    before = dump(admin)
    steps: list[Callable[[], object]] = [
        lambda: q.enqueue(db, b"intruder"),
        lambda: take(db, q),
        lambda: q.dequeue(db),
        lambda: q.lease(db),
        lambda: run_transaction(db, lambda tr: q.enqueue(tr, b"intruder")),
        lambda: run_transaction(db, lambda tr: q.lease(tr)),
    ]
    if leased is not None:
        steps.append(lambda: q.ack(db, leased))
        steps.append(lambda: run_transaction(db, lambda tr: q.ack(tr, leased)))
    steps = steps[first:] + steps[:first]
    # Each step twice, in both orders: right after a refusal too, and each one first (a step
    # first after the change finds the plans as they were before it).
    for step in [*steps, *reversed(steps)]:
        with pytest.raises(AccessDeniedError):
            step()
        assert dump(admin) == before


def test_a_granted_principal_is_served_by_the_short_steps(
    admin: Database, user: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The goal: enqueue, dequeue(tr), lease and ack of svc-050 on the owned queue take the long
    ways exactly as often as on an open queue (none for an enqueue, a lease or an ack once warm),
    and count as the long way would."""
    ways = []
    for name in ("plain", "jobs"):  # no owner; the owner's with its 100 grants
        q = Queue(name)
        warm(user, q)
        before = fdbqueue.queue_stats(admin, name)
        with monkeypatch.context() as patched:
            long = Long(patched)
            for _ in range(5):
                q.enqueue(user, b"e")
            got = [take(user, q) for _ in range(4)]
            assert all(m is not None for m in got)
            for _ in range(3):
                m = q.lease(user)
                assert m is not None
                q.ack(user, m)
            ways.append(long.all())
        after = fdbqueue.queue_stats(admin, name)
        assert (after.ready, after.inflight, after.done) == (before.ready + 5 - 7, 0, before.done + 7)
    assert ways[1] == ways[0]
    enqueues, takes, leases, acks = ways[1]
    assert (leases, acks) == (0, 0) and enqueues <= 1 and takes <= 1, ways


def test_a_principal_without_the_right_is_refused_each_step_and_nothing_changes(
    admin: Database, user: Database, url: str
) -> None:
    """svc-077 (no grant), a principal of another name, and the anonymous principal: refused by
    every step, also the ack of a message svc-050 leased in this very process (its lease is
    held process-wide: ``delivery._held``), while svc-050 is served in between."""
    q = Queue("jobs")
    warm(user, q)
    leased = q.lease(user)
    assert leased is not None
    for who in ("svc-077", STRANGER, None):
        other = fdbqueue.open(url, principal=who)
        try:
            refused_everywhere(other, admin, q, leased)
        finally:
            other.close()
        q.enqueue(user, b"still served")
    q.ack(user, leased)


def test_a_right_revoked_by_another_handle_right_after_it_served_refuses_the_next_step(
    admin: Database, user: Database
) -> None:
    q = Queue("jobs")
    warm(user, q)
    held = q.lease(user)
    assert held is not None
    fdbqueue.revoke(admin, "jobs", USER, RIGHTS)
    refused_everywhere(user, admin, q, held)
    fdbqueue.grant(admin, "jobs", USER, RIGHTS)  # given back: served again (the same lease)
    q.ack(user, held)
    q.enqueue(user, b"back")


def test_each_right_revoked_alone_refuses_only_its_steps(admin: Database, user: Database) -> None:
    q = Queue("jobs")
    warm(user, q)
    fdbqueue.revoke(admin, "jobs", USER, ["dequeue"])
    before = dump(admin)
    for step in (lambda: take(user, q), lambda: q.lease(user), lambda: q.dequeue(user)):
        with pytest.raises(AccessDeniedError):
            step()
        assert dump(admin) == before
    q.enqueue(user, b"enqueue still held")
    fdbqueue.grant(admin, "jobs", USER, ["dequeue"])
    m = q.lease(user)
    assert m is not None
    fdbqueue.revoke(admin, "jobs", USER, ["enqueue"])
    with pytest.raises(AccessDeniedError):
        q.enqueue(user, b"x")
    q.ack(user, m)  # dequeue held: the ack goes through
    assert take(user, q) is not None


REVOKE = textwrap.dedent(
    """
    import sys
    import fdbqueue
    db = fdbqueue.open(sys.argv[1], principal=sys.argv[2])
    if sys.argv[3] == "revoke":
        fdbqueue.revoke(db, "jobs", sys.argv[4], ["enqueue", "dequeue", "browse"])
    else:
        fdbqueue.create_queue(db, "jobs", owner=sys.argv[4])
    db.close()
    """
)


def test_a_right_revoked_by_another_process_refuses_the_next_step(
    admin: Database, user: Database, url: str
) -> None:
    q = Queue("jobs")
    warm(user, q)
    held = q.lease(user)
    assert held is not None
    subprocess.run([sys.executable, "-c", REVOKE, url, OWNER, "revoke", USER], check=True, timeout=60)
    refused_everywhere(user, admin, q, held)


def test_an_owner_changed_by_another_process_refuses_the_owner_before(url: str, admin: Database) -> None:
    """The owner served on the short steps; the queue handed to another owner (svc-owner has no
    grant): refused; and the new owner served."""
    q = Queue("jobs")
    warm(admin, q)
    held = q.lease(admin)
    assert held is not None
    subprocess.run([sys.executable, "-c", REVOKE, url, OWNER, "owner", "svc-new"], check=True, timeout=60)
    refused_everywhere(admin, admin_view := fdbqueue.open(url, principal="svc-new"), q, held)
    try:
        warm(admin_view, q)
    finally:
        admin_view.close()


def test_an_owner_changed_in_this_process_serves_the_new_owner_only(
    url: str, admin: Database, user: Database
) -> None:
    q = Queue("jobs")
    warm(admin, q)
    fdbqueue.create_queue(admin, "jobs", owner="svc-077")  # svc-077: no grant, now the owner
    refused_everywhere(admin, user, q)  # svc-owner: no grant (svc-050 keeps its grant: sees)
    new = fdbqueue.open(url, principal="svc-077")
    try:
        warm(new, q)
        warm(user, q)  # the grants kept
        refused_everywhere(admin, new, q)
    finally:
        new.close()


def test_two_handles_of_different_principals_taking_turns_never_share_a_plan(
    url: str, admin: Database, user: Database
) -> None:
    """The process's settings entry is one a queue: the stranger's step right after the granted
    one's (and the other way round) must never be served by what was decided for the other."""
    q = Queue("jobs")
    stranger = fdbqueue.open(url, principal="svc-077")
    try:
        warm(user, q)
        for _ in range(3):
            q.enqueue(user, b"mine")
            m = take(user, q)
            assert m is not None
            held = q.lease(user)
            assert held is not None
            refused_everywhere(stranger, admin, q, held)
            q.ack(user, held)
            warm(user, q)
    finally:
        stranger.close()


def test_a_handle_whose_principal_changes_is_refused_what_the_new_one_lacks(
    admin: Database, user: Database
) -> None:
    """The plan was made for svc-050 on this very handle (one metadata version, one database
    object): a principal set on the handle afterwards is decided for again, not served by it."""
    q = Queue("jobs")
    warm(user, q)
    for who in ("svc-077", ""):  # "": the anonymous principal (principal_of's default)
        for first in range(4):
            # A take right before, nothing in flight: a kept run whose next take
            # (head.take_short) and lease (leasing.lease_short, meta.read_take) were planned
            # for svc-050, and an enqueue's plan (meta.read_plain) made for it.
            q.enqueue(user, b"more")
            assert take(user, q) is not None
            user.principal = who
            refused_everywhere(user, admin, q, first=first)
            user.principal = USER
    held = q.lease(user)
    assert held is not None
    user.principal = "svc-077"
    refused_everywhere(user, admin, q, held)
    user.principal = USER
    q.ack(user, held)
    warm(user, q)


def test_an_open_queue_made_owned_refuses_a_handle_served_while_it_was_open(url: str) -> None:
    q = Queue("jobs")
    anyone = fdbqueue.open(url)  # anonymous
    owner = fdbqueue.open(url, principal=OWNER)
    try:
        warm(anyone, q)
        held = q.lease(anyone)
        assert held is not None
        fdbqueue.create_queue(owner, "jobs", owner=OWNER)
        refused_everywhere(anyone, owner, q, held)
    finally:
        anyone.close()
        owner.close()
