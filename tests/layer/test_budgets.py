"""Every operation stays within one transaction's budget, and nothing wedges a queue.

Measured through ``scripts/txncost.py``: each attempt's size as FoundationDB counts it at commit
(``Transaction::getSize`` in ``fdbclient/NativeAPI.actor.cpp``: mutations plus read and write
conflict ranges) and its sequential round trips. The queues hold what used to wedge them:
expired chunked messages at the head (with ``expiry_action="error"`` each one's chunks are
copied to the error queue) and messages with the largest headers allowed (a lease, a nack, a
dead letter and a staged result each make the record larger). The sizes and limits below are
written out rather than imported, so that the tests say the same thing of any version.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.ops.contention import staged_dequeue
from scripts.txncost import CountingDatabase, TxnCost

ONE_MB = 1_000_000  # what each attempt must stay under: the 500,000-byte budget plus headroom
PAYLOAD = 256 * 1024  # a large payload: chunked, 27 chunks (moves of larger ones: test_limits.py)
DEFAULT_PAYLOAD = 1024 * 1024  # a queue's max_payload unless set
MAX_PAYLOAD = 6 * 1024 * 1024  # the largest max_payload: what one transaction can move
HEADERS = {"h": "x" * (60_000 - len('{"h":""}'))}  # the largest headers: 60,000 bytes as stored
TOO_LARGE = {2101, 2102, 2103}  # transaction_too_large, key_too_large, value_too_large
SIM = "sim://?seed=1&faults=0"
TTL = 0.3

Op = Callable[[CountingDatabase], Any]


@pytest.fixture
def db() -> Iterator[Database]:
    database = fdbqueue.open(SIM)
    try:
        yield database
    finally:
        database.close()


def fill(
    db: Database,
    name: str,
    *,
    expired: int,
    live: int,
    expired_headers: dict[str, str] | None = HEADERS,
    live_headers: dict[str, str] | None = HEADERS,
    match_at: int | None = None,
) -> Queue:
    """``expired`` chunked messages past their TTL at the head, then ``live`` ones."""
    fdbqueue.create_queue(db, name, expiry_action="error")
    q = Queue(name)
    for i in range(expired):
        q.enqueue(db, bytes([65 + i % 26]) * PAYLOAD, ttl=TTL, headers=expired_headers)
    for i in range(live):
        headers = dict(live_headers or {})
        if i == match_at:  # as large, with the header a filter looks for
            headers = {"h": headers["h"][: -len(',"k":"match"')], "k": "match"} if headers else {"k": "match"}
        q.enqueue(db, f"live{i}", headers=headers)
    time.sleep(TTL + 0.1)
    return q


def measure(db: Database, op: Op) -> tuple[Any, list[TxnCost]]:
    cdb = CountingDatabase(db)
    result = op(cdb)
    return result, cdb.take()


def check_within_budget(name: str, costs: list[TxnCost]) -> None:
    assert costs, f"{name}: no transaction measured"
    for c in costs:
        assert c.error not in TOO_LARGE, f"{name}: an attempt failed with {c.error}"
        assert c.size < ONE_MB, f"{name}: an attempt of {c.size:,} bytes"


def in_caller(op: Callable[[Transaction], Any]) -> Op:
    return lambda cdb: run_transaction(cdb, op)  # type: ignore[arg-type]


def test_every_operation_stays_under_1_mb_and_the_queue_drains(db: Database) -> None:
    q = fill(db, "jobs", expired=12, live=70, match_at=60)
    table: list[tuple[str, int, int, int]] = []

    def run(name: str, op: Op) -> Any:
        result, costs = measure(db, op)
        check_within_budget(name, costs)
        table.append((name, len(costs), max(c.size for c in costs), max(c.round_trips for c in costs)))
        return result

    m = run("dequeue, caller's transaction", in_caller(q.dequeue))
    assert m is not None and m.payload == b"live0"  # past the expired ones it could not move
    m = run("dequeue", q.dequeue)
    assert m is not None and m.payload == b"live1"
    leased = run("lease", q.lease)
    assert leased is not None and leased.payload == b"live2"
    run("ack", lambda cdb: q.ack(cdb, leased))
    many = run("lease_many(64)", lambda cdb: q.lease_many(cdb, 64))
    assert many and many[0].payload == b"live3"  # as many as the budget affords, in order
    for m in many:
        assert dict(m.headers) == HEADERS
    assert run("nack, largest reason", lambda cdb: q.nack(cdb, many[0], reason="r" * 3_998)) == "ready"
    for m in many[1:]:
        q.release(db, m)
    found = run("filter dequeue", lambda cdb: q.dequeue(cdb, where={"k": "match"}))
    assert found is not None and found.payload == b"live60"
    staged = run("staged dequeue", lambda cdb: staged_dequeue(cdb, q.keys))
    assert staged is not None and staged.payload.startswith(b"live")
    nth = run("nth(30)", lambda cdb: q.nth(cdb, 30))
    assert nth is not None and nth.payload.startswith(b"live")
    run("enqueue, largest payload and headers", lambda cdb: q.enqueue(cdb, b"z" * PAYLOAD, headers=HEADERS))
    run("sweep", q.sweep)

    # Drained: every live message handed out once, every expired one in the error queue whole.
    seen = {"live0", "live1", "live2", "live60", staged.payload.decode()}
    while (m := run("dequeue", q.dequeue)) is not None:
        seen.add(m.payload.decode()[:6])
    assert seen >= {f"live{i}" for i in range(70)}
    assert q.empty(db)
    errors = Queue("jobs.error")
    dead = []
    while (m := errors.dequeue(db)) is not None:
        dead.append(m)
    assert len(dead) == 12
    assert sorted(m.payload for m in dead) == sorted(bytes([65 + i]) * PAYLOAD for i in range(12))
    assert all(m.reason == "expired" and m.origin == "jobs" and dict(m.headers) == HEADERS for m in dead)

    purged = fill(db, "again", expired=12, live=10)
    assert run("purge", lambda cdb: fdbqueue.purge_queue(cdb, "again")) == 22
    assert purged.empty(db)
    print_table(table)


def test_sweeps_move_expired_chunked_messages_in_budget_sized_transactions(db: Database) -> None:
    q = fill(db, "jobs", expired=12, live=0)
    _, costs = measure(db, q.sweep)
    check_within_budget("sweep", costs)
    assert len([c for c in costs if c.committed]) >= 12 * PAYLOAD // 500_000
    assert fdbqueue.queue_stats(db, "jobs").errors == 12


def test_headers_near_the_value_limit_are_refused_and_the_largest_allowed_fit_every_state(
    db: Database,
) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=2)
    q = Queue("jobs")
    with pytest.raises(fdbqueue.HeadersTooLargeError, match="MAX_HEADERS_BYTES"):
        # It would enqueue, then every lease of it would fail with value_too_large (2103).
        q.enqueue(db, b"x", headers={"h": "x" * 95_000})
    assert q.empty(db)
    q.enqueue(db, b"x" * 10_000, headers=HEADERS)  # the largest inline payload too
    for _ in range(2):  # leased, nacked with the largest reason, then dead-lettered with it
        m = q.lease(db)
        assert m is not None
        q.nack(db, m, reason="r" * 3_998)
    dead = Queue("jobs.error").lease(db)
    assert dead is not None and dead.reason == "r" * 3_998 and dead.payload == b"x" * 10_000


def op_round_trips(db: Database, expired: int, n: int) -> dict[str, int]:
    """The most sequential round trips one attempt of each operation took."""
    q = fill(db, f"rt{expired}_{n}", expired=expired, live=n + 70, expired_headers=None, live_headers=None)
    out: dict[str, int] = {}

    def run(name: str, op: Op) -> Any:
        result, costs = measure(db, op)
        check_within_budget(name, costs)
        out[name] = max(c.round_trips for c in costs)
        return result

    assert run("dequeue, caller's transaction", in_caller(q.dequeue)) is not None
    assert run("dequeue", q.dequeue) is not None
    leased = run("lease", q.lease)
    run("ack", lambda cdb: q.ack(cdb, leased))
    assert run("nth", lambda cdb: q.nth(cdb, expired + n)) is not None  # a live one, inline
    assert run("lease_many(64)", lambda cdb: q.lease_many(cdb, 64))
    assert run("staged dequeue", lambda cdb: staged_dequeue(cdb, q.keys)) is not None
    return out


# Sequential round trips one attempt may take (read version, reads, commit) where today's read
# patterns allow a constant: moving one expired chunked message aside costs about six (the
# error queue's settings, its wake counter, the 256 kB of chunks in 80 kB replies). lease_many
# and the staged dequeue are measured, not bounded here. nth: read version, the queue's
# settings and counters (two reads here: each measure's database handle starts with an empty
# settings cache; one in a running process), a probe of the TTL index for messages expired
# and not yet swept (every view counts by database time: docs/api.md), and one range read
# from a key selector (or, with expired messages ahead, one page of the walk in dequeue order).
# The dequeue in a caller's transaction moves the first expired message into an error queue
# not yet in the work index: marking it there reads the idle consumers' registrations to wake
# one (workindex.wake_one: one round trip) where an atomic add on one global key, written by
# most enqueues of the database, used to do (issue 28: a hot key on one storage team). One
# round trip once, when a queue comes to have work, for no key every producer writes.
ROUND_TRIPS = {"dequeue, caller's transaction": 15, "dequeue": 14, "lease": 14, "ack": 3, "nth": 5}


def test_round_trips_do_not_grow_with_expired_messages_or_with_n(db: Database) -> None:
    # Each operation moves one expired message aside (what its budget affords), in both.
    few = op_round_trips(db, expired=8, n=3)
    many = op_round_trips(db, expired=40, n=40)
    print_table([(name, 0, 0, many[name]) for name in many])
    for name, bound in ROUND_TRIPS.items():
        assert few[name] <= bound and many[name] <= bound, (name, few[name], many[name])
    for name in many:
        assert many[name] <= few[name] + 1, (name, few[name], many[name])  # one batch more at most


def test_filter_dequeue_reads_within_a_bounded_share_per_transaction(db: Database) -> None:
    q = fill(db, "jobs", expired=0, live=60, match_at=55)  # 55 records of 60 kB ahead of it
    m, costs = measure(db, lambda cdb: q.dequeue(cdb, where={"k": "match"}))
    check_within_budget("filter dequeue", costs)
    assert m is not None and m.payload == b"live55"
    assert len(costs) >= 2  # the scan went on in a further transaction
    assert max(c.round_trips for c in costs) <= 20  # about 1 MB read per transaction (80 kB a reply)
    assert q.size(db) == 59


def test_filter_dequeue_in_a_callers_transaction_stops_at_its_share(db: Database) -> None:
    q = fill(db, "jobs", expired=0, live=60, match_at=55)
    m, costs = measure(db, in_caller(lambda tr: q.dequeue(tr, where={"k": "match"})))
    check_within_budget("filter dequeue", costs)
    assert m is None  # past this transaction's share: left for a call given a Database
    assert max(c.round_trips for c in costs) <= 20
    assert q.size(db) == 60


def test_nth_resolves_a_key_selector_instead_of_reading_n_records(db: Database) -> None:
    q = fill(db, "jobs", expired=0, live=40)
    m, costs = measure(db, lambda cdb: q.nth(cdb, 39))
    assert m is not None and m.payload == b"live39"
    # Read version, settings (cold cache: two reads), TTL index probe, key selector with its record.
    assert max(c.round_trips for c in costs) <= 5
    assert q.nth(db, 40) is None and q.nth(db, 0).payload == b"live0"  # type: ignore[union-attr]


def test_purge_commits_although_enqueues_commit_while_it_runs(db: Database) -> None:
    q = Queue("busy")
    q.enqueue(db, b"first")
    tr = db.create_transaction()
    assert fdbqueue.purge_queue(tr, "busy") == 1
    q.enqueue(db, b"meanwhile")  # an atomic add to the counters the purge read
    tr.commit()  # the purge read them at snapshot isolation: no conflict
    # It committed last: that message went with the rest, and the counters agree.
    assert q.size(db) == 0 and q.empty(db) and q.dequeue(db) is None
    q.enqueue(db, b"after")
    assert q.size(db) == 1 and q.dequeue(db).payload == b"after"  # type: ignore[union-attr]


def test_purge_of_a_busy_queue_finishes_in_a_few_attempts() -> None:
    db = fdbqueue.open("sim://?seed=1&faults=0&delay=0.005")  # commits take up to 5 ms
    q = Queue("busy")
    q.enqueue(db, b"x")
    stop = threading.Event()

    def enqueuer() -> None:
        while not stop.is_set():
            q.enqueue(db, b"y")

    threads = [threading.Thread(target=enqueuer) for _ in range(3)]
    for t in threads:
        t.start()
    try:
        time.sleep(0.1)
        cdb = CountingDatabase(db)
        purged = threading.Thread(target=lambda: fdbqueue.purge_queue(cdb, "busy"))
        purged.start()
        purged.join(5.0)  # livelocked before: it conflicted with every enqueue's counter add
        attempts = len(cdb.take())
    finally:
        stop.set()
        for t in threads:
            t.join()
    purged.join()
    db.close()
    assert attempts <= 3, f"the purge took {attempts} attempts"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda q, db: q.enqueue(db, b"x", headers={"h": "x" * 60_000}), fdbqueue.HeadersTooLargeError),
        (lambda q, db: q.enqueue(db, b"x", dedup_key="k" * 1_001), fdbqueue.DedupKeyTooLargeError),
        (lambda q, db: q.enqueue(db, b"x" * (DEFAULT_PAYLOAD + 1)), fdbqueue.PayloadTooLargeError),
        # Past what FoundationDB accepts in one transaction (10,000,000 bytes).
        (lambda q, db: q.enqueue_many(db, [b"x" * 200_000] * 50), fdbqueue.BudgetExceededError),
    ],
)
def test_what_cannot_fit_is_refused_at_enqueue_naming_the_limit(
    db: Database, call: Callable[[Queue, Database], Any], error: type[Exception]
) -> None:
    q = Queue("jobs")
    with pytest.raises(error) as info:
        call(q, db)
    assert isinstance(info.value, fdbqueue.QueueError)
    assert "limit" in str(info.value) or "max_payload" in str(info.value) or "FoundationDB" in str(info.value)
    assert q.empty(db)


def test_a_reason_too_large_is_refused_at_nack_and_the_lease_kept(db: Database) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"x")
    m = q.lease(db)
    assert m is not None
    with pytest.raises(fdbqueue.ReasonTooLargeError, match="MAX_REASON_BYTES"):
        q.nack(db, m, reason="r" * 4_000)
    q.ack(db, m)  # the lease is still there: nothing was lost


def test_the_limits_are_the_librarys() -> None:
    from fdbqueue.store import budget

    assert budget.TXN_BUDGET_BYTES == 500_000  # the layer's own work
    assert budget.USER_TXN_LIMIT == 9_000_000  # a user's call: FoundationDB's limit less a margin
    assert budget.MAX_PAYLOAD_BYTES == MAX_PAYLOAD
    assert len('{"h":""}') + len(HEADERS["h"]) == budget.MAX_HEADERS_BYTES
    assert fdbqueue.QueueConfig().max_payload == DEFAULT_PAYLOAD
    assert fdbqueue.QueueConfig(max_payload=MAX_PAYLOAD).max_payload == MAX_PAYLOAD
    with pytest.raises(fdbqueue.QueueError, match="max_payload"):
        fdbqueue.QueueConfig(max_payload=MAX_PAYLOAD + 1)


def print_table(rows: list[tuple[str, int, int, int]]) -> None:
    """Shown with ``pytest -s``: attempts, largest attempt and most round trips per operation."""
    print(f"\n{'operation':40} {'attempts':>8} {'max bytes':>10} {'round trips':>11}")
    for name, attempts, size, trips in rows:
        print(f"{name:40} {attempts:>8} {size:>10,} {trips:>11}")


def test_a_worker_nacks_with_a_reason_made_to_fit(db: Database) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"x")

    def handler(m: fdbqueue.Message) -> None:
        raise ValueError("\U0001f525" * 500)  # 12 bytes each as stored: 6,000 bytes

    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    w = fdbqueue.Worker(db, q, handler)
    w.run(max_messages=1)
    dead = Queue("jobs.error").dequeue(db)
    assert dead is not None and dead.reason is not None and dead.reason.startswith("ValueError: \U0001f525")


def test_after_a_leased_message_a_move_must_fit_what_is_left() -> None:
    from fdbqueue.store.budget import Budget

    b = Budget(110_000)
    assert b.take(400_000)  # the first move of a transaction always goes: progress
    b = Budget(110_000)
    b.charge(100_000)  # a lease_many's first message, from the reserve
    assert not b.take(300_000) and b.more  # an expired message that no longer fits: later
    assert b.take(1_000)
