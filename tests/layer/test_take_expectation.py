"""The common dequeue's one comparison (issue 30, eighth pass: ``ops/head.py`` ``take_short``).

The step compares what it reads - the metadata version and the ready, wake, inflight, delayed
and taken counters - with one list its last take, or the take that kept the run, left
(``_Kept.expect``), and takes the settings that list was made under (``meta.take_plan``) for
as long as that metadata version is the queue's. Each test here changes one of the things the
list stands for, with this process's own handles (the other files try other processes), and
checks that the next ``dequeue(tr)`` hands out what the long way would.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.api.admin import create_queue, set_state
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import QueueStoppedError
from fdbqueue.ops import head
from fdbqueue.store.codec import unpack_count


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


@fdbqueue.transactional
def take(tr: Transaction, q: Queue) -> fdbqueue.Message | None:
    return q.dequeue(tr)


class _Abort(Exception):
    pass


def take_aborted(db: Database, q: Queue) -> bytes | None:
    """A dequeue(tr) whose transaction the caller aborts: what it saw."""
    seen: list[bytes] = []

    @fdbqueue.transactional
    def body(tr: Transaction) -> None:
        m = q.dequeue(tr)
        if m is not None:
            seen.append(m.payload)
        raise _Abort

    with pytest.raises(_Abort):
        body(db)
    return seen[0] if seen else None


def stored_counters(db: Database, q: Queue) -> list[bytes | None]:
    """The six values take_short reads, read afresh."""
    keys = q.keys
    wanted = [
        keys.metadata_version,
        *(keys.counter(c) for c in ("ready", "wake", "inflight", "delayed", "taken")),
    ]
    return run_transaction(db, lambda tr: tr.snapshot.get_many(wanted))


def short_takes(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the dequeues take_short served (its answer not None)."""
    served = [0]
    real = head.take_short

    def counted(*args: object, **kwargs: object) -> fdbqueue.Message | None:
        m = real(*args, **kwargs)  # type: ignore[arg-type]
        served[0] += m is not None
        return m

    monkeypatch.setattr("fdbqueue.api.queue.take_short", counted)
    return served


def test_what_the_step_expects_is_what_the_store_holds_after_each_take(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After every short take the kept list is the store's six values as they are, so that the
    next take's one comparison stands for every check the step made before."""
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(12)])
    served = short_takes(monkeypatch)
    got = []
    for _ in range(10):
        got.append(take(db, q).payload)  # type: ignore[union-attr]
        entry = head._kept.get((id(db), q.keys.packed))
        if entry is not None and entry.expect is not None:
            assert entry.expect == stored_counters(db, q)
    assert got == [f"m{i}".encode() for i in range(10)]
    assert served[0] >= 8  # the first take reads the run; the rest are the step's


def test_a_lease_of_this_handle_between_two_takes_is_never_taken_again(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A lease from the kept run (leasing.lease_short, or the long way's batch) changes the
    counters the list holds: the next dequeue(tr) hands out the message after it, and the
    message leased comes back to the front when released."""
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(10)])
    served = short_takes(monkeypatch)
    assert take(db, q).payload == b"m0"  # type: ignore[union-attr]
    assert take(db, q).payload == b"m1"  # type: ignore[union-attr]
    leased = q.lease(db)
    assert leased is not None and leased.payload == b"m2"
    assert take(db, q).payload == b"m3"  # type: ignore[union-attr]
    two = q.lease_many(db, 2)
    assert [m.payload for m in two] == [b"m4", b"m5"]
    assert take(db, q).payload == b"m6"  # type: ignore[union-attr]
    q.release(db, leased)
    assert take(db, q).payload == b"m2"  # type: ignore[union-attr]
    for m in two:
        q.ack(db, m)
    assert [take(db, q).payload for _ in range(3)] == [b"m7", b"m8", b"m9"]  # type: ignore[union-attr]
    assert take(db, q) is None
    assert served[0] >= 2
    assert q.size(db) == 0


def test_settings_changed_by_this_handle_are_not_the_ones_expected(
    db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change of settings or state writes a new metadata version, which the list holds: a
    pause refuses the next take, a journal set in between journals it."""
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(6)])
    assert take(db, q).payload == b"m0"  # type: ignore[union-attr]
    assert take(db, q).payload == b"m1"  # type: ignore[union-attr]
    set_state(db, "jobs", dequeue=False)
    with pytest.raises(QueueStoppedError):
        take(db, q)
    set_state(db, "jobs", dequeue=True)
    assert take(db, q).payload == b"m2"  # type: ignore[union-attr]
    assert take(db, q).payload == b"m3"  # type: ignore[union-attr]
    create_queue(db, "jobs", journal=True)
    taken = take(db, q)
    assert taken is not None and taken.payload == b"m4"
    taken_ids = [e.message_id for e in fdbqueue.journal(db, "jobs") if e.op == "dequeue"]
    assert taken_ids == [taken.id]


def test_a_walk_of_takes_leases_aborts_and_enqueues_over_two_handles_keeps_fifo(
    url: str, db: Database
) -> None:
    """A seeded random walk over two handles of one store - enqueues, dequeues in a caller's
    transaction (some aborted), leases acked or released - against a model of the ready set:
    every take hands out the model's head, and the counters say what the model holds."""
    other = fdbqueue.open(url)
    try:
        handles = [db, other]
        q = Queue("jobs")
        rnd = random.Random(30)
        ready: list[int] = []  # the model: enqueue numbers, ready
        leased: dict[int, tuple[Database, fdbqueue.Message]] = {}
        made = 0
        for step in range(400):
            h = handles[rnd.random() < 0.25]
            roll = rnd.random()
            if roll < 0.3 or not ready:
                n = rnd.choice((1, 1, 1, 3))
                if n == 1:
                    q.enqueue(h, str(made).encode())
                else:
                    q.enqueue_many(h, [str(made + i).encode() for i in range(n)])
                ready += range(made, made + n)
                made += n
            elif roll < 0.75:
                m = take(h, q)
                assert m is not None and int(m.payload) == ready.pop(0), step
            elif roll < 0.82:
                seen = take_aborted(h, q)
                assert seen is not None and int(seen) == ready[0], step
            elif roll < 0.92 or not leased:
                m = q.lease(h)
                assert m is not None and int(m.payload) == ready.pop(0), step
                leased[int(m.payload)] = (h, m)
            else:
                number = rnd.choice(sorted(leased))
                owner, m = leased.pop(number)
                if rnd.random() < 0.5:
                    q.ack(owner, m)
                else:
                    q.release(owner, m)
                    ready = sorted([*ready, number])
            if step % 50 == 49:
                assert q.size(db) == len(ready), step
        for number in sorted(leased):
            owner, m = leased[number]
            q.ack(owner, m)
        while ready:
            m = take(db, q)
            assert m is not None and int(m.payload) == ready.pop(0)
        assert take(db, q) is None
        counters = stored_counters(db, q)
        counted = run_transaction(db, lambda tr: tr.get(q.keys.counter("counted")))
        # ready - taken + (wake - counted): store/layout.py's ready_count, unclamped
        made_apart = unpack_count(counters[2]) - unpack_count(counted) if counted is not None else 0
        assert unpack_count(counters[1]) - unpack_count(counters[5]) + made_apart == 0
        assert unpack_count(counters[3]) == 0  # nothing in flight
    finally:
        other.close()
