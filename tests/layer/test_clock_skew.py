"""Exactly-once whatever the clients' clocks say: every deadline is in database time.

Each client's wall clock is set off with :func:`fdbqueue.store.clock.thread_skew` (that thread
only); database time (read versions) is the database's. A receipt, a lease, a staged
request, a delay or a TTL must behave the same whichever client made it and whichever
client looks at it, and a retry that comes too late to learn its outcome must say so
(:class:`CommitUnknownError`) rather than guess.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import LeaseError, Queue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.sim.database import SimDatabase, SimTransaction
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.errors import CommitUnknownError, EngineError
from fdbqueue.ops.contention import staged_dequeue
from fdbqueue.ops.receipts import RECEIPT_TTL_SECONDS, RESULT_TTL_VERSIONS
from fdbqueue.store.clock import fake_clock, thread_skew
from fdbqueue.store.codec import unpack_count
from tests.support.engines import engine_url
from tests.support.faults import ScriptedFaults, on_backoff
from tests.support.processes import Children, real_clock

__all__ = ["real_clock"]

BEHIND = -61.0  # a minute and a second slow: past the old 60 s receipt horizon
AHEAD = 61.0


@pytest.fixture
def scripted() -> Iterator[tuple[SimDatabase, ScriptedFaults]]:
    db = fdbqueue.open("sim://?seed=1")
    assert isinstance(db, SimDatabase)
    fdbqueue.create_queue(db, "jobs", lease_seconds=30, retry_delay=0)
    try:
        yield db, ScriptedFaults(db)
    finally:
        db.close()


@pytest.fixture(params=["memory", "sim", "sqlite"])
def local_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(engine_url(str(request.param), tmp_path))
    try:
        yield db
    finally:
        db.close()


def payloads(db: Database, q: Queue) -> list[bytes]:
    return [m.payload for m in q.browse(db)]


# -- receipts ------------------------------------------------------------------------------------


def test_a_slow_clients_enqueue_receipt_survives_another_clients_cleanup(scripted: Any) -> None:
    """The enqueue commits but reports 1021; before its retry, a client with a right clock
    sweeps (clearing old receipts). The retry must still find the receipt: one message."""
    db, faults = scripted
    q = Queue("jobs")

    def other_client_sweeps() -> None:
        with thread_skew(0):
            q.sweep(db)

    calls = on_backoff(db, other_client_sweeps)
    faults.arm([("1021", True)])
    with thread_skew(BEHIND):
        mid = q.enqueue(db, b"A")
    assert calls == [1]
    assert [m.id for m in q.browse(db)] == [mid], "the enqueue was written twice"
    assert q.size(db) == 1


def test_a_slow_clients_dequeue_receipt_survives_another_clients_cleanup(scripted: Any) -> None:
    """The dequeue of A commits but reports 1021; another client sweeps before the retry.
    The retry must learn that A was taken and return it, not take B (A would be lost)."""
    db, faults = scripted
    q = Queue("jobs")
    q.enqueue_many(db, [b"A", b"B"])

    def other_client_sweeps() -> None:
        with thread_skew(0):
            q.sweep(db)

    calls = on_backoff(db, other_client_sweeps)
    faults.arm([("1021", True)])
    with thread_skew(BEHIND):
        m = q.dequeue(db)
    assert calls == [1]
    assert m is not None and m.payload == b"A", f"dequeue returned {m and m.payload!r}: A was lost"
    assert payloads(db, q) == [b"B"]


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_an_enqueue_retried_past_the_receipt_ttl_raises_instead_of_guessing(
    scripted: Any, applied: bool
) -> None:
    db, faults = scripted
    q = Queue("jobs")
    with fake_clock() as clock:

        def late() -> None:  # the retry comes after the receipt may have been cleared
            clock.advance(RECEIPT_TTL_SECONDS + 1)
            q.sweep(db)

        on_backoff(db, late)
        faults.arm([("1021", applied)])
        with pytest.raises(CommitUnknownError, match="unknown"):
            q.enqueue(db, b"A")
    assert payloads(db, q) == ([b"A"] if applied else []), "written twice, or reported as written"


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_dequeue_retried_past_the_receipt_ttl_raises_instead_of_guessing(
    scripted: Any, applied: bool
) -> None:
    db, faults = scripted
    q = Queue("jobs")
    q.enqueue_many(db, [b"A", b"B"])
    with fake_clock() as clock:

        def late() -> None:
            clock.advance(RECEIPT_TTL_SECONDS + 1)
            q.sweep(db)

        on_backoff(db, late)
        faults.arm([("1021", applied)])
        with pytest.raises(CommitUnknownError):
            q.dequeue(db)
    # Applied: A was taken (and its taker told the outcome is unknown), B is not taken too.
    assert payloads(db, q) == ([b"B"] if applied else [b"A", b"B"])


@pytest.mark.parametrize("applied", [True, False], ids=["applied", "not-applied"])
def test_a_staged_collect_retried_past_the_result_ttl_raises_instead_of_guessing(
    scripted: Any, applied: bool
) -> None:
    """The collect of a staged result ends in 1021; before its retry, the result's TTL passes
    and a sweep reclaims results nobody collected. A missing result then proves nothing: if
    the collect had not landed, the message is back in the queue, and returning it too would
    deliver it twice."""
    db, faults = scripted
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock:

        def late() -> None:
            clock.advance(RESULT_TTL_VERSIONS / VERSIONS_PER_SECOND + 1)
            q.sweep(db)

        on_backoff(db, late)
        faults.arm([None, None, ("1021", applied)])  # register, fulfil, collect
        with pytest.raises(CommitUnknownError):
            staged_dequeue(db, q.keys)
    assert payloads(db, q) == ([] if applied else [b"A"])


class _TimesOutDuringCommit:
    """The next ``n`` commits with writes land, then report transaction_timed_out (1031), as a
    FoundationDB client's timeout can fire while the commit is already at the proxy."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, n: int) -> None:
        self.n = n
        real = SimTransaction.commit

        def commit(tr: SimTransaction) -> None:
            writes = bool(tr._wm or tr._vs_keys)
            real(tr)
            if writes and self.n > 0:
                self.n -= 1
                # Marked as every engine's commit marks what it raises (during_commit).
                raise EngineError(
                    1031, "injected: the timeout fired while the commit landed", during_commit=True
                )

        monkeypatch.setattr(SimTransaction, "commit", commit)


@pytest.mark.parametrize("op", ["enqueue", "dequeue"])
def test_a_commit_that_timed_out_is_reported_unknown_not_failed(
    scripted: Any, monkeypatch: pytest.MonkeyPatch, op: str
) -> None:
    """A 1031 at commit is not retried (on_error re-raises it), and the commit may have
    landed: the caller must learn that the outcome is unknown, not that it failed."""
    db, _ = scripted
    q = Queue("jobs")
    q.enqueue(db, b"A")
    _TimesOutDuringCommit(monkeypatch, 1)
    with pytest.raises(CommitUnknownError) as info:
        q.enqueue(db, b"B") if op == "enqueue" else q.dequeue(db)
    assert isinstance(info.value.__cause__, EngineError) and info.value.__cause__.code == 1031
    assert payloads(db, q) == ([b"A", b"B"] if op == "enqueue" else [])


def test_a_retry_after_1021_that_times_out_is_reported_unknown(
    scripted: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first commit ends in 1021 (it landed); the retry, settling it, times out."""
    db, faults = scripted
    q = Queue("jobs")
    faults.arm([("1021", True)])
    _TimesOutDuringCommit(monkeypatch, 0)
    real_sleep = db.sleep

    def then_time_out(seconds: float) -> None:  # in the backoff: the retry's commit times out
        real_sleep(seconds)
        raise EngineError(1031, "injected: timed out in the backoff")

    monkeypatch.setattr(db, "sleep", then_time_out)
    with pytest.raises(CommitUnknownError):
        q.enqueue(db, b"A")
    assert payloads(db, q) == [b"A"]


# -- leases ---------------------------------------------------------------------------------------


def test_a_lease_is_not_expired_early_by_a_sweeper_whose_clock_is_ahead(local_db: Database) -> None:
    q = Queue("jobs")
    fdbqueue.create_queue(local_db, "jobs", lease_seconds=30)
    q.enqueue(local_db, b"A")
    m = q.lease(local_db)
    assert m is not None
    with thread_skew(AHEAD):
        assert q.sweep(local_db).leases == 0, "a sweeper whose clock is ahead expired a live lease"
        assert q.lease(local_db) is None
        q.extend(local_db, m, 30)  # a client whose clock is ahead may still settle it
    q.ack(local_db, m)
    assert q.get(local_db, m.id) is None and q.size(local_db) == 0


def test_a_lease_of_a_client_whose_clock_is_behind_still_expires_on_time(local_db: Database) -> None:
    q = Queue("jobs")
    fdbqueue.create_queue(local_db, "jobs", lease_seconds=30)
    q.enqueue(local_db, b"A")
    with fake_clock() as clock:
        with thread_skew(-3600):
            m = q.lease(local_db)
        assert m is not None
        clock.advance(29)
        assert q.sweep(local_db).leases == 0
        clock.advance(1.5)
        assert q.sweep(local_db).leases == 1
        with pytest.raises(LeaseError):
            q.ack(local_db, m)
        again = q.lease(local_db)
    assert again is not None and again.id == m.id and again.deliveries == 2


# -- staged requests ----------------------------------------------------------------------------


def test_a_staged_request_is_not_dropped_by_a_fulfiller_whose_clock_is_ahead(scripted: Any) -> None:
    """A's dequeue goes to the staged request set (two conflicts); while its fulfil backs
    off, B - whose clock is 31 s ahead - dequeues through the set too. B's fulfil must
    pair A's request, not clear it as stale: both get a message."""
    db, faults = scripted
    q = Queue("jobs")
    q.enqueue_many(db, [b"A", b"B"])
    got: list[Any] = []
    backoffs = []

    def b_dequeues() -> None:
        backoffs.append(1)
        if len(backoffs) == 2:  # the first is A's plain dequeue's first conflict
            with thread_skew(31):
                got.append(q.dequeue(db))

    on_backoff(db, b_dequeues, times=2)
    # A's two plain attempts conflict (the second sends it to the request set, no backoff);
    # its request registers; its first fulfil is too old (1007) and backs off.
    faults.arm([1020, 1020, None, 1007])
    a = q.dequeue(db)
    assert len(backoffs) == 2 and len(got) == 1
    assert a is not None, "A's staged request was dropped as stale: A got nothing from a full queue"
    assert got[0] is not None
    assert sorted([a.payload, got[0].payload]) == [b"A", b"B"]
    assert q.size(db) == 0


# -- a wall clock corrected ---------------------------------------------------------------------


@pytest.mark.parametrize("engine", ["sqlite", "sim"])
def test_deadlines_set_while_the_clock_was_2h_ahead_come_due_on_time(
    engine: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The machine's clock is 2 h ahead, then corrected: an expired lease, a retry delay and a
    strict queue's held head must come back after their own seconds, not 2 h later."""
    db = fdbqueue.open(engine_url(engine, tmp_path))
    jobs, retry, strict = Queue("jobs"), Queue("retry"), Queue("strict")
    fdbqueue.create_queue(db, "jobs", lease_seconds=30)
    fdbqueue.create_queue(db, "retry", retry_delay=5)
    fdbqueue.create_queue(db, "strict", retry_delay=5, strict_order=True)
    a, b, c = jobs.enqueue(db, b"A"), retry.enqueue(db, b"B"), strict.enqueue(db, b"C")
    ahead = 7200.0
    real_time, real_ns = time.time, time.time_ns
    try:
        with fake_clock() as clock:
            clock.now += ahead  # the wall clock jumps; database time does not
            monkeypatch.setattr(time, "time", lambda: real_time() + ahead)
            monkeypatch.setattr(time, "time_ns", lambda: real_ns() + int(ahead * 1e9))
            assert jobs.lease(db) is not None
            r = retry.lease(db)
            assert r is not None and retry.nack(db, r) == "delayed"
            s = strict.lease(db)
            assert s is not None and strict.nack(db, s) == "ready"
            clock.now -= ahead  # corrected
            monkeypatch.undo()
            clock.advance(4)
            assert jobs.lease(db) is None and retry.dequeue(db) is None and strict.lease(db) is None
            clock.advance(27)
            again = jobs.lease(db)
            assert again is not None and again.id == a, "the expired lease stayed invisible"
            due = retry.dequeue(db)
            assert due is not None and due.id == b, "the retry delay stayed in force"
            head = strict.lease(db)
            assert head is not None and head.id == c, "the strict queue's head stayed held"
    finally:
        db.close()


# -- the property: several clients with clocks 10 minutes apart, under faults ---------------------

SKEWS = (-600.0, 0.0, 600.0)
PER_PRODUCER = 20


def _run_skewed_clients(seed: int) -> None:
    db = fdbqueue.open(f"sim://?seed={seed}&faults=0.08")
    q = Queue("jobs")
    fdbqueue.create_queue(db, "jobs", lease_seconds=30, retry_delay=0, max_deliveries=1000, ttl=120)
    sent: list[bytes] = []
    got: list[bytes] = []
    failures: list[str] = []
    lock = threading.Lock()
    done = threading.Event()

    def producer(skew: float, rng: random.Random) -> None:
        with thread_skew(skew):
            for i in range(PER_PRODUCER):
                payload = f"{skew:+.0f}/{i}".encode()
                delay = rng.choice([0, 0, 0, 0.05, 0.2])
                ttl = rng.choice([None, 60])
                dedup = rng.choice([None, f"key-{skew}-{i}"])
                q.enqueue(db, payload, delay=delay, ttl=ttl, dedup_key=dedup)
                with lock:
                    sent.append(payload)

    def consumer(skew: float, rng: random.Random) -> None:
        with thread_skew(skew):
            while not done.is_set():
                if rng.random() < 0.5:
                    m = q.dequeue(db)
                    if m is not None:
                        with lock:
                            got.append(m.payload)
                else:
                    m = q.lease(db)
                    if m is not None:
                        try:
                            q.ack(db, m)
                        except LeaseError as exc:
                            with lock:
                                failures.append(f"ack of {m.payload!r} by a {skew:+.0f} s client: {exc}")
                        else:
                            with lock:
                                got.append(m.payload)
                if m is None:
                    time.sleep(0.001)

    def sweeper(skew: float) -> None:
        with thread_skew(skew):
            while not done.is_set():
                q.sweep(db)
                time.sleep(0.002)

    def client(target: Any, *args: Any) -> threading.Thread:
        def run() -> None:
            try:
                target(*args)
            except Exception as exc:  # any error a client meets fails the test, with its name
                with lock:
                    failures.append(f"{target.__name__}{args[:1]}: {exc!r}")
                done.set()

        return threading.Thread(target=run)

    rng = random.Random(seed)
    threads = [client(producer, s, random.Random(rng.random())) for s in SKEWS]
    threads += [client(consumer, s, random.Random(rng.random())) for s in SKEWS]
    threads += [client(sweeper, s) for s in (SKEWS[0], SKEWS[-1])]
    for t in threads:
        t.start()
    try:
        for t in threads[: len(SKEWS)]:
            t.join()
        total = len(SKEWS) * PER_PRODUCER
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not done.is_set():
            with lock:
                if len(got) >= total:
                    break
            time.sleep(0.01)
        time.sleep(0.05)  # a duplicate delivery would show up here
    finally:
        done.set()
        for t in threads:
            t.join()
    try:
        assert not failures, failures
        assert len(sent) == len(SKEWS) * PER_PRODUCER
        missing = sorted(set(sent) - set(got))
        duplicated = sorted(p for p in set(got) if got.count(p) > 1)
        assert not missing, f"seed {seed}: lost or stuck: {missing}"
        assert not duplicated, f"seed {seed}: delivered twice: {duplicated}"
        assert sorted(got) == sorted(sent)
        counts = {c: unpack_count(db.get(q.keys.counter(c))) for c in ("ready", "inflight", "delayed")}
        assert counts == {"ready": 0, "inflight": 0, "delayed": 0}, counts
        assert Queue("jobs.error").size(db) == 0, "messages expired or were dead-lettered"
        injected = db.stats.faults
        assert all(injected.get(code) for code in (1020, 1007, 1021)), f"faults injected: {injected}"
    finally:
        db.close()


@pytest.mark.parametrize("seed", range(1, 9))
def test_clients_with_clocks_ten_minutes_apart_lose_and_duplicate_nothing(seed: int) -> None:
    """Producers, consumers (plain dequeue, lease + ack) and sweepers in threads, with wall
    clocks 10 min behind, right and 10 min ahead, on sim with injected 1020, 1007 and 1021
    (applied or not), delays, TTLs and dedup keys: every message is delivered exactly once,
    within seconds, and no lease is taken away from its holder early."""
    _run_skewed_clients(seed)


# -- one process whose CLOCK_MONOTONIC runs ahead (issue 26, item 11) -----------------------------

HOUR = 3600.0


def with_monotonic_ahead(seconds: float) -> None:
    """In this process only, CLOCK_MONOTONIC reads ``seconds`` ahead, as in a time namespace
    (``unshare --time --monotonic``) or under libfaketime: every reading the layer makes."""
    import time as _time

    mono, mono_ns = _time.monotonic, _time.monotonic_ns
    _time.monotonic = lambda: mono() + seconds  # type: ignore[assignment]
    _time.monotonic_ns = lambda: mono_ns() + int(seconds * 1e9)  # type: ignore[assignment]


def ahead_committer(url: str, outdir: str) -> None:
    """A process an hour ahead on CLOCK_MONOTONIC opens the store and commits (twice), and
    says what it sees of the hour-long deadlines."""
    with_monotonic_ahead(HOUR)
    db = fdbqueue.open(url)
    Queue("other").enqueue(db, b"from the process an hour ahead")
    Queue("other").enqueue(db, b"again")
    seen = [Queue("delayed").dequeue(db), Queue("leased").dequeue(db)]
    Path(outdir, "seen").write_text(repr([m.payload if m else None for m in seen]))
    db.close()


def test_a_process_an_hour_ahead_on_the_monotonic_clock_moves_no_deadline(
    tmp_path: Path, real_clock: None
) -> None:
    """Database time must not follow one process's monotonic clock: after a process an hour
    ahead commits, an hour's delay is not due, an hour's TTL has not expired and an hour's
    lease has not ended, here and there."""
    url = f"sqlite://{tmp_path}/q.db"
    db = fdbqueue.open(url)
    delayed, ttl, leased = Queue("delayed"), Queue("ttl"), Queue("leased")
    delayed.enqueue(db, b"due in an hour", delay=HOUR)
    ttl.enqueue(db, b"lives an hour", ttl=HOUR)
    leased.enqueue(db, b"leased for an hour")
    assert leased.lease(db, HOUR) is not None
    children = Children()
    child = children.start("ahead", ahead_committer, url, str(tmp_path))
    try:
        child.proc.join(60)
        assert child.proc.exitcode == 0
    finally:
        children.stop()
    assert (tmp_path / "seen").read_text() == "[None, None]", "the process an hour ahead saw them due"
    Queue("other").enqueue(db, b"a commit here too")
    assert delayed.dequeue(db) is None, "an hour's delay came due"
    assert leased.dequeue(db) is None, "an hour's lease ended: the message is delivered again"
    m = ttl.dequeue(db)
    assert m is not None and m.payload == b"lives an hour", "an hour's TTL expired"
    db.close()
