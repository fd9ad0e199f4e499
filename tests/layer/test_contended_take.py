"""The common dequeue among other consumers (``ops/contended.py`` ``take_contended``): what it
still guarantees.

Where other consumers take from the queue between this handle's takes (processes draining
one queue), the kept run is out of date at every take and keeping pauses (``ops/head.py``,
``KEPT_PAUSE``); over the pause a ``dequeue(tr)`` runs a step of its own: the metadata version
and the counters in one read, the head alone, the record's fields, take_short's writes. Each
test puts a handle into the pause with a second handle on the same store (a second process
does the same through the store: ``test_processes_draining_take_every_message_once``), then
checks that the step hands out what the long way would, counts the same, refuses the same.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import AccessDeniedError, Queue
from fdbqueue.api import queue as api
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import QueueStoppedError
from fdbqueue.ops import contended
from fdbqueue.ops.head import KEPT_PAUSE, _kept


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}?sync=normal"


@pytest.fixture
def db(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


@pytest.fixture
def other(url: str) -> Iterator[Database]:
    database = fdbqueue.open(url)
    yield database
    database.close()


@fdbqueue.transactional
def take(tr: Transaction, q: Queue) -> fdbqueue.Message | None:
    return q.dequeue(tr)


class Steps:
    """How many takes the contended step served (``take_contended`` returning a message)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.served = 0
        real = contended.take_contended

        def counted(*args: Any, **kwargs: Any) -> Any:
            msg = real(*args, **kwargs)
            self.served += msg is not None
            return msg

        monkeypatch.setattr(api, "take_contended", counted)


def kept_paused(db: Database, q: Queue) -> bool:
    """Whether ``db``'s own kept run of the queue is paused, not a run an earlier test's closed
    handle left under the same id (``head.kept_paused`` answers for either; the steps check the
    entry's database, so a test that took one for the other found no step to serve it)."""
    entry = _kept.get((id(db), q.keys.packed))
    return entry is not None and entry.db() is db and entry.pause > 0


def paused(db: Database, other: Database, q: Queue) -> list[bytes]:
    """Takes by ``db`` and ``other`` in turn until ``db``'s kept run is paused, then one more by
    ``db`` (the settings this process found for the queue are kept for one handle at a time:
    ``other``'s last take kept them for ``other``, and ``db``'s long way finds them again, as a
    process of its own would not need to); what they took, in order."""
    got = []
    # (Rounds enough for a paused run an earlier test's closed handle left under the same id to
    # be counted down first.)
    for _ in range(2 * KEPT_PAUSE + 4):
        for handle in (db, other):
            m = take(handle, q)
            assert m is not None
            got.append(m.payload)
        if kept_paused(db, q):
            m = take(db, q)
            assert m is not None and kept_paused(db, q)
            return [*got, m.payload]
    raise AssertionError("never paused")


def test_takes_among_another_consumer_are_the_contended_steps_and_hand_out_every_message_once(
    db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(80)])
    steps = Steps(monkeypatch)
    got = paused(db, other, q)
    while (m := take(db if len(got) % 3 else other, q)) is not None:
        got.append(m.payload)
    assert got == [f"m{i}".encode() for i in range(80)]  # in order, once
    assert steps.served >= 8
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.ready, st.inflight, st.done, st.exact) == (0, 0, 80, True)
    assert q.size(db) == 0


def test_a_journaled_queue_journals_every_contended_take(
    db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(60)])
    paused(db, other, q)
    steps = Steps(monkeypatch)
    for _ in range(4):
        assert take(db, q) is not None
    assert steps.served == 4
    entries = [e for e in fdbqueue.journal(db, "jobs") if e.op == "dequeue"]
    assert len(entries) == fdbqueue.queue_stats(db, "jobs").done


def test_an_aborted_contended_take_gives_the_message_back_and_counts_the_failed_delivery(
    db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(60)])
    got = paused(db, other, q)
    steps = Steps(monkeypatch)

    class Boom(Exception):
        pass

    @fdbqueue.transactional
    def take_and_fail(tr: Transaction) -> None:
        assert q.dequeue(tr) is not None
        raise Boom

    with pytest.raises(Boom):
        take_and_fail(db)
    assert steps.served == 1
    again = take(db, q)
    assert again is not None and again.payload == f"m{len(got)}".encode() and again.deliveries == 2
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.ready, st.done) == (60 - len(got) - 1, len(got) + 1)


def test_a_ttl_a_delay_or_a_lease_in_flight_take_the_long_way(
    db: Database, other: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the step does not do - a TTL to check, a due check of leases and delays - the long
    way does: an expired head is moved aside, an expired lease comes back first."""
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(60)])
    n = len(paused(db, other, q))
    steps = Steps(monkeypatch)
    q.enqueue(other, b"short-lived", ttl=0.001, priority=9)
    time.sleep(0.01)
    assert take(db, q).payload == f"m{n}".encode()  # type: ignore[union-attr]
    assert fdbqueue.queue_stats(db, "jobs").expired == 1
    leased = q.lease(other, 0.05)
    assert leased is not None and leased.payload == f"m{n + 1}".encode()
    time.sleep(0.1)
    assert take(db, q).payload == f"m{n + 1}".encode()  # type: ignore[union-attr]  # the lease expired: first again
    assert steps.served == 0
    assert take(db, q).payload == f"m{n + 2}".encode()  # type: ignore[union-attr]  # nothing in flight: the step
    assert steps.served == 1


def test_a_pause_or_an_owner_set_by_another_handle_refuses_the_next_contended_take(
    url: str, db: Database, other: Database
) -> None:
    q = Queue("jobs")
    q.enqueue_many(db, [f"m{i}".encode() for i in range(60)])
    n = len(paused(db, other, q))
    fdbqueue.set_state(other, "jobs", dequeue=False)
    with pytest.raises(QueueStoppedError):
        take(db, q)
    fdbqueue.set_state(other, "jobs", dequeue=True)
    assert take(db, q) is not None
    fdbqueue.create_queue(other, "jobs", owner="svc-a")
    with pytest.raises(AccessDeniedError):
        take(db, q)
    owner = fdbqueue.open(url, principal="svc-a")
    try:
        assert fdbqueue.queue_stats(owner, "jobs").done == n + 1
    finally:
        owner.close()


WORKER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    db = fdbqueue.open(sys.argv[1])
    q = fdbqueue.Queue("jobs")

    @fdbqueue.transactional
    def take(tr):
        return q.dequeue(tr)

    got = []
    while (m := take(db)) is not None:
        got.append(m.payload.decode())
    print(" ".join(got))
    db.close()
    """
)


def test_processes_draining_take_every_message_once(url: str, db: Database) -> None:
    """Three processes draining one queue (each of them in the pause most of the time): every
    message once, each process's in order, the counters exact."""
    q = Queue("jobs")
    n = 600
    q.enqueue_many(db, [f"m{i:04d}".encode() for i in range(n)])
    procs = [
        subprocess.Popen([sys.executable, "-c", WORKER, url], stdout=subprocess.PIPE, text=True)
        for _ in range(3)
    ]
    outs = [p.communicate(timeout=120)[0].split() for p in procs]
    assert all(p.returncode == 0 for p in procs)
    everything = [m for out in outs for m in out]
    assert sorted(everything) == [f"m{i:04d}" for i in range(n)]
    for out in outs:
        assert out == sorted(out)
    st = fdbqueue.queue_stats(db, "jobs")
    assert (st.ready, st.done, st.exact) == (0, n, True)
