"""Round trips and hot keys: what each operation would cost on FoundationDB, where every read
is a network round trip (0.1-1 ms) and every key lives on one storage team.

Measured through ``scripts/txncost.py`` (sequential read round trips per transaction) and
``scripts/txncost.py`` (keys read and written), on the sim engine, which keeps FoundationDB's
optimistic concurrency.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.api.admin import create_queue, set_state
from fdbqueue.engines.contract import Database
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import EngineError, PayloadTooLargeError, QueueStoppedError
from fdbqueue.ops.contention import fulfil, staged_dequeue
from fdbqueue.store.clock import now_us
from fdbqueue.store.meta import read_meta
from scripts.txncost import CountingDatabase, LoggingDatabase, TxnCost


@pytest.fixture
def sim() -> Iterator[Database]:
    database = fdbqueue.open("sim://?seed=3&faults=0")
    yield database
    database.close()


def committed(costs: list[TxnCost]) -> list[TxnCost]:
    return [c for c in costs if c.committed]


def warm(db: CountingDatabase, q: Queue) -> None:
    """Fill ``db``'s settings cache for ``q`` (a first enqueue changes the metadata: it writes
    the priority marker), then forget what was measured so far."""
    run_transaction(db, lambda tr: read_meta(tr, q.keys))  # type: ignore[arg-type]
    db.take()


# -- the contract: get_many --------------------------------------------------------------------


def test_get_many_returns_values_in_order(db: Database) -> None:
    run_transaction(db, lambda tr: [tr.set(b"a", b"1"), tr.set(b"c", b"3")])

    def body(tr: object) -> tuple[list[bytes | None], list[bytes | None]]:
        return tr.get_many([b"c", b"b", b"a"]), tr.snapshot.get_many([b"a", b"zz"])  # type: ignore[attr-defined]

    assert run_transaction(db, body) == ([b"3", None, b"1"], [b"1", None])


def test_get_many_conflicts_like_get_and_its_snapshot_form_not_at_all(sim: Database) -> None:
    for view, conflicts in (("serializable", True), ("snapshot", False)):
        run_transaction(sim, lambda t: t.set(b"k2", b"old"))
        tr = sim.create_transaction()
        reads = tr if view == "serializable" else tr.snapshot
        assert reads.get_many([b"k1", b"k2"]) == [None, b"old"]
        run_transaction(sim, lambda t: t.set(b"k2", b"new"))  # commits in between
        tr.set(b"other", b"x")
        if conflicts:
            with pytest.raises(EngineError) as info:
                tr.commit()
            assert info.value.code == 1020
        else:
            tr.commit()


# -- lease_many: one range read for the batch, one get_many for the chunks --------------------


def test_lease_many_64_takes_at_most_three_sequential_read_round_trips(sim: Database) -> None:
    """Before: a limit-1 range read per message (64), plus the metadata and chunk reads."""
    q = Queue("jobs")
    payloads = [b"x" * 25_000 if i % 16 == 0 else f"m{i}".encode() for i in range(70)]
    db = CountingDatabase(sim)  # the settings cache is per database object: use this one throughout
    q.enqueue_many(db, payloads)
    warm(db, q)
    got = q.lease_many(db, 64)
    assert [m.payload for m in got] == payloads[:64]  # chunked ones whole, in order
    (cost,) = committed(db.take())
    assert cost.reads <= 3, f"lease_many(64) took {cost.reads} sequential read round trips"
    # Conflicts only over what was taken: one key each, not the scanned range.
    for name in ("ready", "inflight"):  # one atomic add each for the batch, not one per message
        assert sum(b == q.keys.counter(name) for b, _ in cost.write_ranges) == 1
    lo, hi = q.keys.ready_range()
    ready = [(b, e) for b, e in cost.read_ranges if lo <= b < hi]
    assert len(ready) == 64 and all(e == b + b"\x00" for b, e in ready)
    assert len(cost.read_ranges) == 64 + 2  # and the queue's settings and state keys


def test_lease_many_with_leases_in_flight_reads_one_index_more(sim: Database) -> None:
    q = Queue("jobs")
    db = CountingDatabase(sim)
    q.enqueue_many(db, [f"m{i}".encode() for i in range(130)])
    q.lease_many(db, 64)  # in flight: the next lease checks for expired leases first
    warm(db, q)
    assert len(q.lease_many(db, 64)) == 64
    (cost,) = committed(db.take())
    assert cost.reads <= 4, f"lease_many(64) took {cost.reads} sequential read round trips"


def test_concurrent_lease_batches_never_hand_out_a_message_twice(sim: Database) -> None:
    q = Queue("jobs")
    n = 400
    q.enqueue_many(sim, [str(i).encode() for i in range(n)])
    seen: list[str] = []
    lock = threading.Lock()

    def worker() -> None:
        while True:
            got = q.lease_many(sim, 16)
            if not got:
                return
            with lock:
                seen.extend(m.payload.decode() for m in got)
            for m in got:
                q.ack(sim, m)

    threads = [threading.Thread(target=worker) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(seen, key=int) == [str(i) for i in range(n)]


# -- staged dequeue and fulfil: round trips per batch, not per pair ----------------------------


def _requests(db: Database, q: Queue, n: int) -> list[bytes]:
    rands = [os.urandom(8) for _ in range(n)]
    run_transaction(db, lambda tr: [tr.set(q.keys.pop_key(now_us(), r), b"") for r in rands])
    return rands


@pytest.mark.parametrize("pairs", [1, 40])
def test_fulfil_round_trips_do_not_grow_with_the_pairs(sim: Database, pairs: int) -> None:
    """Before: three sequential point reads per pair (request, message, result)."""
    q = Queue("staged")
    db = CountingDatabase(sim)
    q.enqueue_many(db, [f"m{i}".encode() for i in range(pairs)])
    rands = _requests(db, q, pairs)
    warm(db, q)
    assert fulfil(db, q.keys) == pairs
    (cost,) = committed(db.take())
    assert cost.reads <= 4, f"fulfil of {pairs} pairs took {cost.reads} sequential reads"
    assert all(sim.get(q.keys.result_key(r)) is not None for r in rands)
    # The hot counters take one atomic add each for the batch, not one per pair.
    for name in ("ready", "done"):
        assert sum(b == q.keys.counter(name) for b, _ in cost.write_ranges) == 1
    assert q.size(sim) == 0


def test_a_staged_dequeue_costs_a_constant_number_of_round_trips(sim: Database) -> None:
    q = Queue("staged")
    db = CountingDatabase(sim)
    q.enqueue_many(db, [b"a", b"b"])
    warm(db, q)
    m = staged_dequeue(db, q.keys)
    assert m is not None and m.payload == b"a"
    reads = sum(c.reads for c in db.take())
    # register 1, fulfil 4, collect 1 (before: 2 + 6 + 2)
    assert reads <= 6, f"a staged dequeue took {reads} sequential reads"


def test_a_staged_requester_whose_request_was_paired_collects_without_pairing_others(
    sim: Database,
) -> None:
    """Another waiter's fulfil paired our request, and more requests wait: the requester
    collects its own result at once, and leaves the others' to their fulfils (before, it
    ran a full fulfil of its own first, pairing them: a collision with theirs)."""
    q = Queue("staged")
    a = q.enqueue(sim, b"a")
    rest = q.enqueue_many(sim, [b"b", b"c"])
    db = CountingDatabase(sim)
    others: list[bytes] = []
    original = db.create_transaction

    def create() -> object:
        tr = original()
        inner_commit = tr.commit

        def commit() -> None:
            inner_commit()
            if tr.cost.commit and not others:  # our request is registered: another waiter
                assert fulfil(sim, q.keys) == 1  # pairs it, and two more requests arrive
                others.extend(_requests(sim, q, 2))

        tr.commit = commit  # type: ignore[method-assign]
        return tr

    db.create_transaction = create  # type: ignore[method-assign]
    m = staged_dequeue(db, q.keys)
    assert m is not None and m.id == a
    assert len(sim.get_range(*q.keys.pop_range())) == 2, "the others' requests were paired by us"
    assert [x.id for x in q.browse(sim)] == rest
    assert sum(c.commit for c in db.take()) == 2  # register and collect: nothing else written


# -- settings: cached under the queue's metadata version ---------------------------------------


def test_an_operation_reads_the_metadata_version_not_the_metadata_range(sim: Database) -> None:
    q = Queue("jobs")
    create_queue(sim, "jobs", max_size=1000)
    db = LoggingDatabase(sim)
    # The cache is per database object: warm this one (the first enqueue also writes the
    # priority marker, a metadata change: the second refills the cache).
    q.enqueue(db, b"warm the cache")
    q.enqueue(db, b"warm the cache")
    db.take_all()
    q.enqueue(db, b"x")
    q.dequeue(db)
    cfg_key = q.keys.config
    for cost, traffic in db.take_all():
        if cost.committed:
            assert cfg_key not in traffic.keys_read, "the settings were read, not taken from the cache"
            meta_reads = [k for k in traffic.keys_read if k.startswith(q.keys.meta_range()[0])]
            # the version and five counters: ready, wake, inflight, delayed, taken
            assert len(meta_reads) <= 6
            assert cost.reads <= 3


def test_a_settings_change_by_another_process_is_seen_by_the_next_transaction(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'store.db'}?sync=normal"
    a, b = fdbqueue.open(url), fdbqueue.open(url)  # two handles: two caches, as two processes
    try:
        q = Queue("jobs")
        q.enqueue(a, b"x" * 100)  # a caches the defaults
        create_queue(b, "jobs", max_payload=10)
        with pytest.raises(PayloadTooLargeError):
            q.enqueue(a, b"x" * 100)
        set_state(b, "jobs", enqueue=False)
        with pytest.raises(QueueStoppedError):
            q.enqueue(a, b"y")
    finally:
        a.close()
        b.close()


def test_a_change_of_settings_conflicts_with_a_transaction_that_used_the_cached_ones(sim: Database) -> None:
    q = Queue("jobs")
    q.enqueue(sim, b"warm")
    tr = sim.create_transaction()
    q.enqueue(tr, b"with the cached settings")
    create_queue(sim, "jobs", max_payload=5)  # commits first
    with pytest.raises(EngineError) as info:
        tr.commit()
    assert info.value.code == 1020


def test_a_settings_change_inside_a_transaction_is_seen_by_the_rest_of_it(sim: Database) -> None:
    q = Queue("jobs")
    q.enqueue(sim, b"warm")

    def body(tr: object) -> None:
        create_queue(tr, "jobs", max_payload=5)  # type: ignore[arg-type]
        with pytest.raises(PayloadTooLargeError):
            q.enqueue(tr, b"too long")  # type: ignore[arg-type]

    run_transaction(sim, body)  # type: ignore[arg-type]


def test_an_aborted_settings_change_leaves_no_trace_in_the_cache(sim: Database) -> None:
    q = Queue("jobs")
    q.enqueue(sim, b"warm")
    tr = sim.create_transaction()
    create_queue(tr, "jobs", max_payload=5)
    q.enqueue(tr, b"ok")  # reads (and caches) the uncommitted settings
    tr.cancel()
    q.enqueue(sim, b"longer than five")  # the committed settings still apply
