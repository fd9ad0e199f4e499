"""The journal against a model, under injected faults: exactly the committed operations.

Random operations on several journaled queues (and their journaled error queues) run on the
sim engine with 5 % of commits failing as FoundationDB's do: 1020 not_committed, 1021
commit_unknown_result (applied or not), 1007 transaction_too_old. Each call is given the
database, so it runs in its own retried transaction and returns once it committed. The model
logs what each returned call did; afterwards the journal equals that log exactly (no entry
missing, none extra, in the order the calls returned), and each message's history equals
its part of the journal.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterator

import pytest

import fdbqueue
from fdbqueue import Message, Queue
from fdbqueue.store.clock import FakeClock, fake_clock

QUEUES = ("a", "b")
TIMEOUT_OPS = {"lease_expired", "promote", "expired", "dead"}


def _entries(db: object) -> list[tuple[str, str, str | None]]:
    return [(e.op, e.queue, e.message_id) for e in fdbqueue.journal(db, None)]  # type: ignore[arg-type]


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with fake_clock() as c:
        yield c


@pytest.mark.parametrize("seed", range(6))
def test_the_journal_is_the_log_of_committed_operations(seed: int, clock: FakeClock) -> None:
    rnd = random.Random(seed)
    db = fdbqueue.open(f"sim://?seed={seed}&faults=0.05")
    log: list[tuple[str, str, str | None]] = []
    for name in QUEUES:
        fdbqueue.create_queue(db, name, journal=True, max_deliveries=2, lease_seconds=5.0, ttl=30.0)
        fdbqueue.create_queue(db, f"{name}.error", journal=True)
        log += [("create", name, None), ("create", f"{name}.error", None)]
    leased: list[tuple[str, Message]] = []
    assert _entries(db) == log
    for _ in range(120):
        name = rnd.choice(QUEUES)
        q = Queue(name)
        op = rnd.random()
        want: list[tuple[str, str, str | None]] = []  # what this call journals, last
        if op < 0.35:
            delay = rnd.choice([0.0, 0.0, 2.0])
            mid = q.enqueue(db, b"x" * rnd.choice([10, 12_000]), delay=delay)
            want.append(("enqueue", name, mid))
        elif op < 0.45:
            m = q.dequeue(db)
            if m is not None:
                want.append(("dequeue", name, m.id))
        elif op < 0.65:
            m = q.lease(db)
            if m is not None:
                want.append(("lease", name, m.id))
                leased.append((name, m))
        elif op < 0.9 and leased:
            lname, m = leased.pop(rnd.randrange(len(leased)))
            lq = Queue(lname)
            what = rnd.random()
            try:
                if what < 0.4:
                    lq.ack(db, m)
                    want.append(("ack", lname, m.id))
                elif what < 0.8:
                    where = lq.nack(db, m, delay=rnd.choice([None, 1.0]), reason="model")
                    if where in ("dead", "expired"):
                        op_name = "dead" if where == "dead" else "expired"
                        want += [(op_name, lname, m.id), ("dead", f"{lname}.error", m.id)]
                    else:
                        want.append(("nack", lname, m.id))
                else:
                    lq.release(db, m)
                    want.append(("release", lname, m.id))
            except fdbqueue.LeaseError:
                pass  # its lease expired and a sweep or dequeue took it back: journaled there
        else:
            clock.advance(rnd.choice([0.5, 3.0, 6.0]))
            q.sweep(db)
        entries = _entries(db)
        assert entries[: len(log)] == log, "an entry changed or went missing"
        new = entries[len(log) :]
        # Besides its own entries (last), a call may first have moved what came due or
        # expired (a sweep does only that): those are the timeouts' entries.
        moved, own = new[: len(new) - len(want)], new[len(new) - len(want) :]
        assert own == want
        assert all(op in TIMEOUT_OPS for op, _, _ in moved), moved
        log = entries
    entries = list(fdbqueue.journal(db, None))
    assert [(e.op, e.queue, e.message_id) for e in entries] == log
    assert [e.version for e in entries] == sorted(e.version for e in entries)
    assert len({e.version for e in entries}) == len(entries)
    assert db.stats.faults  # type: ignore[attr-defined]  # faults were injected
    by_message: dict[str, list[tuple[str, str]]] = {}
    for e in entries:
        if e.message_id is not None:
            by_message.setdefault(e.message_id, []).append((e.op, e.queue))
    for mid, life in by_message.items():
        assert [(e.op, e.queue) for e in fdbqueue.history(db, mid)] == life
        assert life[0] == ("enqueue", life[0][1])
        _consistent(life)


_AFTER = {
    "enqueue": {"dequeue", "lease", "promote", "expired", "purge"},
    "promote": {"dequeue", "lease", "expired"},
    "lease": {"ack", "nack", "release", "lease_expired", "dead", "expired"},
    "nack": {"dequeue", "lease", "promote", "expired"},
    "release": {"dequeue", "lease", "expired"},
    "lease_expired": {"dequeue", "lease", "promote", "expired"},
}


def _consistent(life: list[tuple[str, str]]) -> None:
    """Each message's entries follow its lifecycle in its origin queue."""
    own = [op for op, queue in life if not queue.endswith(".error")]
    for before, after in itertools.pairwise(own):
        assert after in _AFTER.get(before, set()), f"{before} then {after} in {own}"
