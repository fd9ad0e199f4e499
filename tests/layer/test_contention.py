"""The staged dequeue-request set (fdbqueue/ops/contention.py): high-contention dequeue.

Plain dequeues all read the head and collide (1020); the layer then registers a request
and lets whichever waiter runs next pair requests with messages in batches.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

import fdbqueue
import fdbqueue.ops.contention as contention
from fdbqueue import Queue
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.ops.contention import STALE_REQUEST_VERSIONS, fulfil, staged_dequeue
from fdbqueue.testing import FaultScript, on_backoff


@pytest.fixture
def db() -> Iterator[SimDatabase]:
    database = fdbqueue.open("sim://?seed=5&faults=0")
    assert isinstance(database, SimDatabase)
    yield database
    database.close()


def db_now(db: SimDatabase) -> int:
    """Database time: a fresh read version (requests are made and aged by them)."""
    tr = db.create_transaction()
    try:
        return tr.get_read_version()
    finally:
        tr.cancel()


def leftovers(db: Any, q: Queue) -> dict[str, int]:
    """Keys of requests and results still in the store (none once every waiter is served)."""
    return {tag: len(db.get_range_startswith(q.keys.q.pack((tag,)))) for tag in ("pop", "res")}


def test_contended_dequeues_use_the_staged_set_and_deliver_once(
    db: SimDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    q = Queue("hot")
    ids: list[str] = []
    for start in range(0, 2_000, 500):
        ids += q.enqueue_many(db, [f"{i}" for i in range(start, start + 500)])
    staged_calls = [0]
    pairs: list[int] = []
    real_staged, real_fulfil = contention.staged_dequeue, contention.fulfil

    def counting_staged(*args: Any) -> Any:
        staged_calls[0] += 1  # GIL-atomic enough for a lower bound
        return real_staged(*args)

    def counting_fulfil(*args: Any, **kwargs: Any) -> int:
        made = real_fulfil(*args, **kwargs)
        pairs.append(made)
        return made

    monkeypatch.setattr(contention, "staged_dequeue", counting_staged)
    monkeypatch.setattr(contention, "fulfil", counting_fulfil)

    got: list[list[str]] = [[] for _ in range(8)]
    order: list[list[int]] = [[] for _ in range(8)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(8)

    def consume(i: int) -> None:
        try:
            barrier.wait()
            while (m := q.dequeue(db)) is not None:
                got[i].append(m.id)
                order[i].append(int(m.text()))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=consume, args=(i,)) for i in range(8)]
    # Switch threads often: with the default 5 ms interval a dequeue transaction (a fraction
    # of a millisecond) usually runs without interruption and the threads rarely collide.
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
    finally:
        sys.setswitchinterval(interval)
    assert not any(t.is_alive() for t in threads) and not errors, errors

    delivered = [i for g in got for i in g]
    assert len(delivered) == len(set(delivered)) == 2_000 and set(delivered) == set(ids)
    assert q.size(db) == 0 and q.empty(db)
    assert leftovers(db, q) == {"pop": 0, "res": 0}
    assert sum(1 for g in got if g) >= 2, "one consumer took everything: no concurrency was tested"
    # The staged path was taken, and it did the work: requests were paired with messages.
    assert db.stats.conflicts > 0, "plain dequeues never collided: no contention was tested"
    assert staged_calls[0] > 0 and sum(pairs) > 0, (staged_calls, sum(pairs))
    # Roughly FIFO: each consumer's messages come mostly in enqueue order.
    inversions = sum(sum(1 for a, b in itertools.pairwise(o) if b < a) for o in order)
    assert inversions <= len(delivered) // 20, f"{inversions} out-of-order deliveries"
    print(
        f"staged dequeues {staged_calls[0]}, pairs {sum(pairs)} in {len(pairs)} fulfil calls, "
        f"inversions {inversions}, {db.stats}"
    )


def test_staged_dequeue_in_order_then_none(db: SimDatabase) -> None:
    q = Queue("staged")
    assert staged_dequeue(db, q.keys) is None  # never created: nothing to register
    fdbqueue.create_queue(db, "staged")
    assert staged_dequeue(db, q.keys) is None  # created, empty: the request is cleared, unpaired
    assert leftovers(db, q) == {"pop": 0, "res": 0}
    low = q.enqueue_many(db, [f"low{i}" for i in range(5)], priority=0)
    high = q.enqueue_many(db, [f"high{i}" for i in range(3)], priority=2)
    got = [staged_dequeue(db, q.keys) for _ in range(8)]
    assert [m.id for m in got if m is not None] == high + low
    assert all(m is not None and m.deliveries == 1 for m in got)
    assert [m.text() for m in got if m is not None][:2] == ["high0", "high1"]
    assert staged_dequeue(db, q.keys) is None
    assert q.size(db) == 0 and leftovers(db, q) == {"pop": 0, "res": 0}
    for mid in high + low:
        assert q.get(db, mid) is None


def test_staged_dequeue_carries_large_payloads(db: SimDatabase) -> None:
    q = Queue("staged")
    big = os.urandom(25_000)  # chunked: the result holds the record, the chunks stay put
    mid = q.enqueue(db, big)
    m = staged_dequeue(db, q.keys)
    assert m is not None and m.id == mid and m.payload == big
    assert db.get_range_startswith(q.keys.q.pack(("b",))) == []  # chunks removed on collection


def test_stale_request_is_cleared_without_taking_a_message(db: SimDatabase) -> None:
    q = Queue("staged")
    mid = q.enqueue(db, b"keep me")
    stale = q.keys.pop_key(db_now(db) - STALE_REQUEST_VERSIONS - 1_000_000, os.urandom(8))
    db.set(stale, b"")
    assert fulfil(db, q.keys) == 0
    assert db.get(stale) is None, "the stale request was not cleared"
    assert leftovers(db, q) == {"pop": 0, "res": 0}  # no result written for it
    assert q.size(db) == 1 and q.peek(db).id == mid  # type: ignore[union-attr]


def test_fresh_request_is_paired_with_the_head(db: SimDatabase) -> None:
    q = Queue("staged")
    first, second = q.enqueue_many(db, [b"first", b"second"])
    rand = os.urandom(8)
    fresh = q.keys.pop_key(db_now(db), rand)
    stale = q.keys.pop_key(db_now(db) - STALE_REQUEST_VERSIONS - 1_000_000, os.urandom(8))
    db.set(fresh, b"")
    db.set(stale, b"")
    assert fulfil(db, q.keys) == 1
    assert db.get(fresh) is None and db.get(stale) is None
    assert db.get(q.keys.result_key(rand)) is not None
    assert q.size(db) == 1 and q.peek(db).id == second  # type: ignore[union-attr]
    assert q.get(db, first) is None  # handed to the request: gone from the queue
    assert fulfil(db, q.keys) == 0  # nothing waits


# -- exactly once across injected faults (scripted, deterministic) ---------------------------

OUTCOMES = [1020, 1007, ("1021", True), ("1021", False)]


@pytest.mark.parametrize("outcome", OUTCOMES, ids=str)
@pytest.mark.parametrize("step", ["register", "fulfil", "collect"])
def test_staged_dequeue_exactly_once_under_a_fault(db: SimDatabase, step: str, outcome: Any) -> None:
    """One staged dequeue commits three times: register, fulfil, collect. Fail one of them."""
    faults = FaultScript(db)
    q = Queue("staged")
    a, b = q.enqueue_many(db, [b"A", b"B"])
    script: list[Any] = [None, None, None]
    script[["register", "fulfil", "collect"].index(step)] = outcome
    faults.arm(script)
    first = staged_dequeue(db, q.keys)
    second = staged_dequeue(db, q.keys)
    assert (first and first.id, second and second.id) == (a, b)
    assert staged_dequeue(db, q.keys) is None
    assert q.size(db) == 0 and leftovers(db, q) == {"pop": 0, "res": 0}


def test_register_retry_after_another_waiter_fulfilled_it(db: SimDatabase) -> None:
    """The request's commit ends in 1021 but landed; before the retry, another waiter's
    fulfil pairs it with A. The retry must not register the request again: a second
    pairing would overwrite A's result with B, and A would be lost."""
    faults = FaultScript(db)
    q = Queue("staged")
    a, b = q.enqueue_many(db, [b"A", b"B"])
    paired: list[int] = []
    faults.arm([("1021", True)])
    on_backoff(db, lambda: paired.append(fulfil(db, q.keys)))
    first = staged_dequeue(db, q.keys)
    assert paired == [1]  # the other waiter did pair our request during the backoff
    rest = [m.id for m in q.browse(db)]
    assert first is not None and first.id == a, (
        f"got {first and first.payload!r}; queue holds {len(rest)}; "
        f"A is {'still queued' if a in rest else 'lost'}, B {'still queued' if b in rest else 'gone'}"
    )
    assert rest == [b]
