"""The journal: one entry per operation on a journaled queue, in commit order, on every engine."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

import fdbqueue
from fdbqueue import JournalEntry, Queue, QueueError
from fdbqueue.engines.contract import Database
from fdbqueue.errors import EngineError
from fdbqueue.store.clock import FakeClock, fake_clock
from fdbqueue.testing import FaultScript


def ops(entries: list[JournalEntry]) -> list[tuple[str, str, str | None]]:
    return [(e.op, e.queue, e.message_id) for e in entries]


def journal(db: Any, queue: str | None = "jobs", **kw: Any) -> list[JournalEntry]:
    return list(fdbqueue.journal(db, queue, **kw))


@pytest.fixture
def clock() -> Iterator[FakeClock]:
    with fake_clock() as c:
        yield c


def test_each_operation_has_one_entry_in_commit_order(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True, max_deliveries=2, retry_delay=0.0)
    q = Queue("jobs")
    a = q.enqueue(db, b"a")
    b = q.enqueue(db, b"b", priority=3)
    m = q.lease(db)
    assert m is not None and m.id == b
    q.nack(db, m, reason="flaky")  # back, deliveries 1
    m = q.lease(db)
    assert m is not None and m.id == b
    q.nack(db, m, reason="broken")  # second delivery: dead
    got = q.dequeue(db)
    assert got is not None and got.id == a
    entries = journal(db)
    assert [e.op for e in entries] == [
        "create",
        "enqueue",
        "enqueue",
        "lease",
        "nack",
        "lease",
        "dead",
        "dequeue",
    ]
    assert [e.message_id for e in entries[1:]] == [a, b, b, b, b, b, a]
    assert [e.deliveries for e in entries[1:]] == [0, 0, 1, 1, 2, 2, 1]
    assert entries[2].details == {"priority": 3}
    assert entries[4].reason == "flaky"
    assert entries[6].reason == "broken" and entries[6].details == {"to": "jobs.error"}
    assert all(e.queue == "jobs" and e.principal == "anonymous" for e in entries)
    assert [e.version for e in entries] == sorted(e.version for e in entries)
    assert len({e.version for e in entries}) == len(entries)
    assert all(len(e.version) == 12 for e in entries)


def test_an_unjournaled_queue_writes_no_entry(db: Database) -> None:
    q = Queue("plain")
    q.enqueue(db, b"x")
    q.dequeue(db)
    assert journal(db, None) == []
    with pytest.raises(
        fdbqueue.NotJournaledError
    ):  # named, not an empty journal (tests/layer/test_queue_kinds.py)
        journal(db, "plain")


def test_an_aborted_operation_has_no_entry_and_one_transaction_keeps_its_order(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    tr = db.create_transaction()
    q.enqueue(tr, b"never")
    tr.cancel()
    ids = q.enqueue_many(db, [b"1", b"2", b"3"])
    entries = journal(db)
    assert ops(entries)[1:] == [("enqueue", "jobs", i) for i in ids]
    assert len({e.version[:10] for e in entries[1:]}) == 1  # one commit


def _windowed(db: Database) -> Any:
    """What times ``db``'s transactions' 5-second window, where a test may stop its clock:
    the local engines themselves, the simulated cluster behind the C-API double."""
    if db.engine in ("memory", "sim", "sqlite"):
        return db
    if db.engine == "fdb":
        from tests.support import fdbdouble

        double = fdbdouble.installed()
        if double is not None:
            return double.sim_database(db.cluster_file)  # type: ignore[attr-defined]
    return None


def test_a_transaction_keeps_its_entry_order_whatever_others_leave_unfinished(db: Database) -> None:
    # Each entry's key ends with its order within the commit's versionstamp. That order once
    # lived in a process-wide table, wiped once it held 10,000 transactions: those left
    # unfinished (never committed nor cancelled) filled it, and a live transaction's next
    # entry got order 0 again, overwriting its first. Left-open transactions of the same
    # store where it allows many writers, of a second store otherwise (the table was shared).
    fdbqueue.create_queue(db, "jobs", journal=True)
    side = db if db.engine in ("memory", "sim") else fdbqueue.open("memory://")
    fdbqueue.create_queue(side, "other", journal=True)
    q, other = Queue("jobs"), Queue("other")
    tr = db.create_transaction()
    ids = [q.enqueue(tr, b"first")]
    unfinished = []
    # 10,001 enqueues take seconds on a loaded machine, and the first transaction's 5-second
    # window (1007) would end meanwhile: the window is not what this test is about, so the
    # clock that times it stands still through the loop where a test can reach it (every
    # engine's but a real cluster's).
    timed = _windowed(db)
    clock = timed.clock if timed is not None else None
    if clock is not None:
        now = clock()
        timed.clock = lambda: now
    try:
        for _ in range(10_001):
            left = side.create_transaction()
            other.enqueue(left, b"left open")
            unfinished.append(left)
    finally:
        if clock is not None:  # goes on from where it stood: the loop took no time
            spent = clock() - now
            timed.clock = lambda: clock() - spent
    ids += [q.enqueue(tr, b"later %d" % i) for i in range(3)]
    tr.commit()
    entries = journal(db)[1:]
    assert ops(entries) == [("enqueue", "jobs", i) for i in ids]
    assert [e.version[10:] for e in entries] == [i.to_bytes(2, "big") for i in range(4)]
    assert [e.message_id for e in fdbqueue.history(db, ids[0])] == [ids[0]]
    del unfinished


def test_a_new_attempt_numbers_its_entries_from_zero_and_rings_the_bell(db: Database) -> None:
    from fdbqueue.store.layout import DEFAULT_ROOT, JournalKeys

    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    tr = db.create_transaction()
    for end_attempt in (tr.reset, lambda: tr.on_error(EngineError(1020))):
        q.enqueue(tr, b"dropped")
        q.enqueue(tr, b"dropped")
        end_attempt()
    ids = [q.enqueue(tr, b"kept") for _ in range(2)]
    tr.commit()
    entries = journal(db)[1:]
    assert ops(entries) == [("enqueue", "jobs", i) for i in ids]
    assert [e.version[10:] for e in entries] == [b"\x00\x00", b"\x00\x01"]
    jk = JournalKeys.make(DEFAULT_ROOT)
    bell = jk.bell("jobs") if getattr(db, "may_conflict", True) else jk.queue_bell_of("jobs")  # (embedded)
    assert db[bell] == entries[0].version[:10]  # type: ignore[index]


def test_lease_ack_release_and_extend(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    q.enqueue_many(db, [b"1", b"2"])
    m1 = q.lease(db)
    assert m1 is not None
    q.extend(db, m1, 60.0)  # no entry
    q.ack(db, m1)
    m2 = q.lease(db)
    assert m2 is not None
    q.release(db, m2)
    assert [e.op for e in journal(db)][3:] == ["lease", "ack", "lease", "release"]
    assert [e.deliveries for e in journal(db)][3:] == [1, 1, 1, 0]


def test_sweeps_journal_expired_leases_promotions_and_ttls(db: Database, clock: FakeClock) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True, max_deliveries=5, lease_seconds=1.0)
    fdbqueue.create_queue(db, "jobs.error", journal=True)
    q = Queue("jobs")
    leased = q.enqueue(db, b"leased")
    m = q.lease(db)
    assert m is not None
    later = q.enqueue(db, b"later", delay=2.0)
    short = q.enqueue(db, b"short", ttl=0.5)
    clock.advance(3.0)
    q.sweep(db)
    entries = [e for e in journal(db) if e.op not in ("create", "enqueue", "lease")]
    assert sorted((e.op, e.message_id) for e in entries) == sorted(
        [("lease_expired", leased), ("promote", later), ("expired", short)]
    )
    expired = next(e for e in entries if e.op == "expired")
    assert expired.details == {"action": "error", "to": "jobs.error"}
    arrived = journal(db, "jobs.error")[-1]
    assert (arrived.op, arrived.message_id, arrived.details) == ("dead", short, {"origin": "jobs"})
    assert [e.queue for e in fdbqueue.history(db, short)] == ["jobs", "jobs", "jobs.error"]


def test_state_settings_purge_and_destroy(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    ids = q.enqueue_many(db, [b"1", b"2", b"3"])
    fdbqueue.create_queue(db, "jobs", max_deliveries=7)
    fdbqueue.create_queue(db, "jobs", max_deliveries=7)  # no change: no entry
    fdbqueue.stop_queue(db, "jobs")
    fdbqueue.stop_queue(db, "jobs")  # no change: no entry
    fdbqueue.start_queue(db, "jobs")
    assert fdbqueue.purge_queue(db, "jobs") == 3
    fdbqueue.destroy_queue(db, "jobs")
    entries = journal(db)
    assert [e.op for e in entries] == ["create"] + ["enqueue"] * 3 + ["config", "state", "state"] + [
        "purge"
    ] * 3 + ["destroy"]
    assert entries[4].details == {"changed": {"max_deliveries": [5, 7]}}
    assert entries[5].details == {"enqueue": False, "dequeue": False}
    assert sorted(e.message_id for e in entries[7:10]) == sorted(ids)
    for mid in ids:
        assert [e.op for e in fdbqueue.history(db, mid)] == ["enqueue", "purge"]


def test_a_journaled_purge_goes_in_batches(monkeypatch: pytest.MonkeyPatch) -> None:
    import fdbqueue.api.admin as admin

    monkeypatch.setattr(admin, "PURGE_BATCH", 4)
    db = fdbqueue.open("memory://")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    q.enqueue_many(db, [b"%d" % i for i in range(7)])
    m = q.lease(db)
    assert m is not None
    q.enqueue(db, b"d", delay=60.0)
    tr = db.create_transaction()
    with pytest.raises(QueueError, match="journaled and holds more than 4"):
        fdbqueue.purge_queue(tr, "jobs")
    tr.cancel()
    assert fdbqueue.purge_queue(db, "jobs") == 8
    assert [e.op for e in journal(db)].count("purge") == 8
    assert fdbqueue.queue_stats(db, "jobs").ready == 0


def test_since_is_exclusive_limit_and_pages(db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    import fdbqueue.ops.journaling as journaling

    monkeypatch.setattr(journaling, "PAGE", 3)
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    for i in range(10):
        q.enqueue(db, b"%d" % i)
    every = journal(db)
    assert len(every) == 11
    assert journal(db, since=every[4].version) == every[5:]
    assert journal(db, since=every[4].version.hex(), limit=2) == every[5:7]
    assert journal(db, since=every[-1].version) == []
    tr = db.create_transaction()
    try:
        assert list(fdbqueue.journal(tr, "jobs", limit=4)) == every[:4]
    finally:
        tr.cancel()
    with pytest.raises(QueueError, match="journal version"):
        journal(db, since="zz")
    with pytest.raises(QueueError, match="journal version"):
        journal(db, since=b"short")


def test_every_journaled_queue_merged_in_commit_order(db: Database) -> None:
    for name in ("a", "b", "c"):
        fdbqueue.create_queue(db, name, journal=True)
    Queue("plain").enqueue(db, b"not journaled")
    order = []
    for i in range(9):
        name = "abc"[i % 3]
        order.append(Queue(name).enqueue(db, b"%d" % i))
    entries = [e for e in journal(db, None) if e.op == "enqueue"]
    assert [e.message_id for e in entries] == order
    assert [e.queue for e in entries] == list("abcabcabc")


def test_follow_waits_on_a_watch_and_times_out() -> None:
    db = fdbqueue.open("memory://")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    since = journal(db)[-1].version
    got: list[JournalEntry] = []
    started = threading.Event()

    def follow() -> None:
        started.set()
        for e in fdbqueue.journal(db, "jobs", since=since, follow=True, timeout=2.0):
            got.append(e)
            if len(got) == 2:
                return

    t = threading.Thread(target=follow)
    t.start()
    started.wait()
    time.sleep(0.2)
    assert got == []
    t0 = time.monotonic()
    q.enqueue(db, b"one")
    q.enqueue(db, b"two")
    t.join(5.0)
    assert not t.is_alive()
    assert [e.op for e in got] == ["enqueue", "enqueue"]
    assert time.monotonic() - t0 < 1.5  # woken by the commits, not by the timeout
    t0 = time.monotonic()
    assert list(fdbqueue.journal(db, "jobs", since=got[-1].version, follow=True, timeout=0.3)) == []
    assert 0.25 <= time.monotonic() - t0 < 2.0
    with pytest.raises(QueueError, match="takes a Database"):
        tr = db.create_transaction()
        try:
            fdbqueue.journal(tr, "jobs", follow=True)
        finally:
            tr.cancel()


def test_trim_by_version_and_by_retention(clock: FakeClock) -> None:
    db = fdbqueue.open("memory://")
    fdbqueue.create_queue(db, "jobs", journal=True, journal_retention=10.0)
    q = Queue("jobs")
    old = q.enqueue(db, b"old")
    clock.advance(20.0)
    new = q.enqueue(db, b"new")
    assert fdbqueue.trim_journal(db, "jobs") == 2  # create and the old enqueue
    assert [e.message_id for e in journal(db)] == [new]
    assert fdbqueue.history(db, old) == []
    assert [e.op for e in fdbqueue.history(db, new)] == ["enqueue"]
    q.enqueue(db, b"newer")
    cut = journal(db)[-1].version
    assert fdbqueue.trim_journal(db, "jobs", before=cut) == 1
    assert len(journal(db)) == 1


def test_a_commit_unknown_result_that_landed_writes_one_entry() -> None:
    db = fdbqueue.open("sim://?seed=11&faults=0")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    script = FaultScript(db)
    script.arm([("1021", True)])
    mid = q.enqueue(db, b"once")
    script.arm([("1021", True)])
    m = q.lease(db)
    assert m is not None
    script.arm([("1021", True)])
    q.ack(db, m)
    script.arm([("1021", False), 1020])
    q.enqueue(db, b"twice tried")
    entries = journal(db)
    assert [e.op for e in entries] == ["create", "enqueue", "lease", "ack", "enqueue"]
    assert entries[1].message_id == mid


def test_history_and_bad_arguments(db: Database) -> None:
    with pytest.raises(QueueError, match="message_id"):
        fdbqueue.history(db, "")
    with pytest.raises(QueueError, match="limit"):
        journal(db, limit=-1)
    assert fdbqueue.history(db, "no-such-message") == []


def test_the_command_line(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from fdbqueue.cli import main

    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert main(["--url", url, "create", "jobs", "--journal"]) == 0
    assert "journal            True" in capsys.readouterr().out
    assert main(["--url", url, "enqueue", "jobs", "hello"]) == 0
    mid = capsys.readouterr().out.strip()
    assert main(["--url", url, "journal", "jobs", "--json-lines"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(d["op"], d["message_id"]) for d in lines] == [("create", None), ("enqueue", mid)]
    assert main(["--url", url, "journal", "--since", lines[0]["version"], "--json"]) == 0
    assert [json.loads(line)["op"] for line in capsys.readouterr().out.splitlines()] == ["enqueue"]
    assert main(["--url", url, "journal", "jobs"]) == 0
    assert "enqueue" in capsys.readouterr().out
    assert main(["--url", url, "history", mid, "--json"]) == 0
    assert [json.loads(line)["op"] for line in capsys.readouterr().out.splitlines()] == ["enqueue"]
    assert main(["--url", url, "history", "nope"]) == 3
    assert "no journal entries" in capsys.readouterr().err
    assert main(["--url", url, "journal", "jobs", "--since", "xyz"]) == 2
    assert "24 hex digits" in capsys.readouterr().err
    assert main(["--url", url, "journal", "jobs", "--timeout", "1"]) == 2
    assert "--timeout goes with --follow" in capsys.readouterr().err
    assert main(["--url", url, "journal", "jobs", "--follow", "--timeout", "0.2", "--json"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_following_every_queue_wakes_for_any_queue_and_for_a_new_one() -> None:
    db = fdbqueue.open("memory://")
    for name in ("a", "b"):
        fdbqueue.create_queue(db, name, journal=True)
    since = journal(db, None)[-1].version
    got: list[JournalEntry] = []

    def follow() -> None:
        for e in fdbqueue.journal(db, None, since=since, follow=True, timeout=3.0):
            got.append(e)
            if len(got) == 3:
                return

    t = threading.Thread(target=follow)
    t.start()
    time.sleep(0.2)
    t0 = time.monotonic()
    Queue("b").enqueue(db, b"1")
    time.sleep(0.1)
    fdbqueue.create_queue(db, "c", journal=True)  # a queue journaled after the follow began
    time.sleep(0.1)
    Queue("c").enqueue(db, b"2")
    t.join(5.0)
    assert not t.is_alive()
    assert [(e.op, e.queue) for e in got] == [("enqueue", "b"), ("create", "c"), ("enqueue", "c")]
    assert time.monotonic() - t0 < 2.0  # woken by the commits, not by the timeout


@pytest.mark.parametrize(
    "mid, principal, deliveries, reason, details",
    [
        ("01J0ABCDEF", "anonymous", 0, None, None),
        (None, 'svc-"quoted"\\é\x00', 3, "too large: 5 bytes\n", {"to": "other", "n": [1, 2.5, None]}),
        ("id with ü and \u2028", "", 1, "", {}),
    ],
)
def test_an_entry_is_encoded_as_json_dumps_would(
    mid: str | None, principal: str, deliveries: int, reason: str | None, details: dict[str, Any] | None
) -> None:
    """The entry's value, built without a JSONEncoder per entry, is byte for byte what
    ``json.dumps`` gave (entries written before read the same, and decode alike)."""
    import json

    from fdbqueue.ops import journaling

    raw = journaling.encode_entry(
        "enqueue", mid, principal, deliveries, reason, details, 1_700_000_000_123_456
    )
    want = [1, "enqueue", mid, principal, deliveries, reason, dict(details or {}), 1_700_000_000_123_456]
    assert raw == json.dumps(want, separators=(",", ":")).encode()
    e = journaling.decode_entry("jobs", b"\x00" * 12, raw)
    assert (e.op, e.message_id, e.principal, e.deliveries, e.reason, e.details) == (
        "enqueue",
        mid,
        principal,
        deliveries,
        reason,
        dict(details or {}),
    )
