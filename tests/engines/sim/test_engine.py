"""The sim engine against FoundationDB's documented concurrency rules (developer-guide.rst:
"Conflict ranges", "Watches"; FoundationDB's documentation/sphinx/source/).

Each test states one rule from the FDB docs and checks the engine follows it: who conflicts
with whom, what a read sees, when 1007 comes, how faults and watches behave.
"""

from __future__ import annotations

import struct
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

import fdbqueue
from fdbqueue import EngineError, KeySelector
from fdbqueue.engines.sim.database import SimDatabase, SimTransaction
from fdbqueue.engines.sim.store import ManualClock


def code_of(fn: Callable[[], object]) -> int:
    with pytest.raises(EngineError) as err:
        fn()
    return err.value.code


def fill(db: SimDatabase, items: dict[bytes, bytes]) -> None:
    tr = db.create_transaction()
    for k, v in items.items():
        tr[k] = v
    tr.commit()


def commit_write(db: SimDatabase, key: bytes, value: bytes = b"x") -> None:
    tr = db.create_transaction()
    tr[key] = value
    tr.commit()


def conflicts(items: dict[bytes, bytes], read: Callable[[SimTransaction], object], write_key: bytes) -> bool:
    """On a fresh store holding ``items``: does a transaction that ran ``read`` fail with 1020
    when another transaction writes ``write_key`` after that read?"""
    db = SimDatabase()
    fill(db, items)
    tr = db.create_transaction()
    read(tr)
    commit_write(db, write_key)
    tr[b"out"] = b"1"  # a write, so the commit is checked
    try:
        tr.commit()
    except EngineError as exc:
        assert exc.code == 1020
        return True
    return False


ABCDE = {k: b"v" for k in (b"a", b"b", b"c", b"d", b"e")}


# --- who conflicts -------------------------------------------------------------------------------


def test_read_modify_write_later_commit_fails() -> None:
    db = SimDatabase()
    fill(db, {b"k": b"0"})
    t1, t2 = db.create_transaction(), db.create_transaction()
    assert t1[b"k"] == t2[b"k"] == b"0"
    t1[b"k"] = b"1"
    t2[b"k"] = b"2"
    t1.commit()
    assert code_of(t2.commit) == 1020
    assert db[b"k"] == b"1"  # the failed commit applied nothing
    assert db.stats.conflicts == 1


def test_snapshot_reads_do_not_conflict() -> None:
    assert not conflicts(ABCDE, lambda tr: tr.snapshot[b"a"], b"a")
    assert not conflicts(ABCDE, lambda tr: tr.snapshot.get_range(b"a", b"z"), b"b")
    assert not conflicts(ABCDE, lambda tr: tr.snapshot.get_key(KeySelector.first_greater_than(b"a")), b"b")
    assert conflicts(ABCDE, lambda tr: tr[b"a"], b"a")  # the same read, serializable


def test_reading_own_sets_and_clears_adds_no_conflict() -> None:

    def set_then_read(tr: SimTransaction) -> None:
        tr[b"a"] = b"mine"
        assert tr[b"a"] == b"mine"

    def clear_then_read(tr: SimTransaction) -> None:
        del tr[b"a"]
        assert tr[b"a"] is None

    def clear_range_then_scan(tr: SimTransaction) -> None:
        tr.clear_range(b"b", b"d")
        tr[b"bb"] = b"new"
        assert [kv.key for kv in tr.get_range(b"b", b"d")] == [b"bb"]

    assert not conflicts(ABCDE, set_then_read, b"a")
    assert not conflicts(ABCDE, clear_then_read, b"a")
    assert not conflicts(ABCDE, clear_range_then_scan, b"c")
    assert not conflicts(ABCDE, clear_range_then_scan, b"bb")
    # Only what the transaction decided is exempt: the rest of a scan still conflicts.
    assert conflicts(ABCDE, lambda tr: (tr.set(b"a", b"1"), tr.get_range(b"a", b"c")), b"b")
    # Read first, write later: the read already recorded its conflict.
    assert conflicts(ABCDE, lambda tr: (tr.get(b"a"), tr.set(b"a", b"1")), b"a")


def test_reading_an_atomic_op_only_key_conflicts() -> None:
    n5 = {b"n": struct.pack("<q", 5)}

    def add_then_read(tr: SimTransaction) -> None:
        tr.add(b"n", struct.pack("<q", 1))
        assert tr[b"n"] == struct.pack("<q", 6)  # applied over the snapshot value

    assert conflicts(n5, add_then_read, b"n")
    assert not conflicts(n5, lambda tr: tr.add(b"n", struct.pack("<q", 1)), b"n")  # no read: none
    # An atomic op over this transaction's own clear is decided here: no conflict.
    assert not conflicts(n5, lambda tr: (tr.clear(b"n"), tr.add(b"n", b"\x01"), tr.get(b"n")), b"n")


def test_limited_forward_range_read_conflicts_only_over_what_it_returned() -> None:

    def first_two(tr: SimTransaction) -> None:
        assert [kv.key for kv in tr.get_range(b"a", b"z", limit=2)] == [b"a", b"b"]

    assert not conflicts(ABCDE, first_two, b"b\x00")  # keyAfter(last returned): outside
    assert not conflicts(ABCDE, first_two, b"d")
    assert conflicts(ABCDE, first_two, b"b")
    assert conflicts(ABCDE, first_two, b"a\x00")  # a new key between the returned ones


def test_limited_reverse_range_read_conflicts_only_over_what_it_returned() -> None:

    def last_two(tr: SimTransaction) -> None:
        assert [kv.key for kv in tr.get_range(b"a", b"z", limit=2, reverse=True)] == [b"e", b"d"]

    assert not conflicts(ABCDE, last_two, b"c\xff")  # just before the last returned key
    assert not conflicts(ABCDE, last_two, b"a")
    assert conflicts(ABCDE, last_two, b"d")
    assert conflicts(ABCDE, last_two, b"y")  # past the end key read: still inside [d, z)


def test_exhausted_range_read_conflicts_over_the_whole_range() -> None:

    def scan(tr: SimTransaction) -> None:
        assert len(tr.get_range(b"a", b"m", limit=10)) == 5

    assert conflicts(ABCDE, scan, b"l")  # a phantom: a key that did not exist when read
    assert not conflicts(ABCDE, scan, b"m")  # the end is exclusive
    assert conflicts(ABCDE, lambda tr: tr.get_range(b"x", b"y"), b"x\x01")  # empty result


def test_get_key_conflicts_over_what_resolution_examined() -> None:
    ace = {b"a": b"", b"c": b"", b"e": b""}

    def after_a(tr: SimTransaction) -> None:
        assert tr.get_key(KeySelector.first_greater_than(b"a")) == b"c"

    assert conflicts(ace, after_a, b"b")  # would have changed the answer
    assert conflicts(ace, after_a, b"c")
    assert not conflicts(ace, after_a, b"a")
    assert not conflicts(ace, after_a, b"d")

    def before_e(tr: SimTransaction) -> None:
        assert tr.get_key(KeySelector.last_less_than(b"e")) == b"c"

    assert conflicts(ace, before_e, b"d")
    assert conflicts(ace, before_e, b"c")  # the answer itself
    assert not conflicts(ace, before_e, b"e")
    assert not conflicts(ace, before_e, b"b")


def test_atomic_adds_never_conflict_and_sum_exactly() -> None:
    db = SimDatabase()
    one = struct.pack("<q", 1)
    trs = [db.create_transaction() for _ in range(50)]
    for tr in trs:
        tr.get_read_version()  # all of them concurrent
        tr.add(b"hits", one)
    for tr in trs:
        tr.commit()
    assert db[b"hits"] == struct.pack("<q", 50)

    def worker() -> None:
        for _ in range(200):
            fdbqueue.transactional(lambda tr: tr.add(b"hits", one))(db)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db[b"hits"] == struct.pack("<q", 850)
    assert db.stats.conflicts == 0


def test_other_atomic_ops_apply_at_commit_over_the_latest_value() -> None:
    db = SimDatabase()
    fill(db, {b"m": struct.pack("<I", 5), b"s": b"abc", b"cc": b"same"})
    tr = db.create_transaction()
    tr.get_read_version()
    tr.max(b"m", struct.pack("<I", 7))
    tr.byte_max(b"s", b"abd")
    tr.compare_and_clear(b"cc", b"same")
    tr.min(b"new", struct.pack("<I", 9))  # absent: takes the param
    commit_write(db, b"m", struct.pack("<I", 8))  # committed after tr's read version
    tr.commit()
    assert db[b"m"] == struct.pack("<I", 8)  # max(8, 7): the op saw the newer value
    assert db[b"s"] == b"abd"
    assert db[b"cc"] is None
    assert db[b"new"] == struct.pack("<I", 9)
    tr = db.create_transaction()
    tr.compare_and_clear(b"s", b"zzz")  # different: kept
    tr.min(b"m", struct.pack("<I", 3))
    tr.commit()
    assert db[b"s"] == b"abd" and db[b"m"] == struct.pack("<I", 3)


def test_blind_and_overlapping_writes_never_conflict() -> None:
    db = SimDatabase()
    fill(db, {b"k": b"0", b"x": b"", b"y": b""})
    t1, t2 = db.create_transaction(), db.create_transaction()
    t1.get_read_version()
    t2.get_read_version()
    t1[b"k"] = b"1"
    t2[b"k"] = b"2"
    t2.clear_range(b"j", b"l")
    t1.commit()
    t2.commit()
    assert db[b"k"] is None  # the later commit's clear_range won
    # Each also read a key the other did not write: only reads are checked, against newer writes.
    t1, t2 = db.create_transaction(), db.create_transaction()
    t1[b"k"], t2[b"k"] = t1[b"x"] or b"a", t2[b"y"] or b"b"
    t1.commit()
    t2.commit()
    assert db[b"k"] == b"b"


def test_read_only_transactions_commit_without_a_check() -> None:
    db = SimDatabase()
    fill(db, {b"k": b"0"})
    tr = db.create_transaction()
    assert tr[b"k"] == b"0"
    commit_write(db, b"k", b"1")
    tr.commit()
    assert tr.get_committed_version() == -1
    assert db.stats.read_only == 1


def test_explicit_conflict_ranges() -> None:
    def rv_then(add: Callable[[SimTransaction], object]) -> Callable[[SimTransaction], object]:
        return lambda tr: (tr.get_read_version(), add(tr))

    assert conflicts({}, rv_then(lambda tr: tr.add_read_conflict_range(b"a", b"c")), b"b")
    assert conflicts({}, rv_then(lambda tr: tr.add_read_conflict_key(b"a")), b"a")
    assert not conflicts({}, rv_then(lambda tr: tr.add_read_conflict_key(b"a")), b"a\x00")
    # Same rule as reads: a key this transaction already wrote adds no read conflict.
    assert not conflicts({}, rv_then(lambda tr: (tr.set(b"a", b""), tr.add_read_conflict_key(b"a"))), b"a")
    # With no read version yet, the one taken at commit is newer than every other commit.
    assert not conflicts({}, lambda tr: tr.add_read_conflict_key(b"a"), b"a")

    db = SimDatabase()

    reader = db.create_transaction()
    reader.get(b"guard")
    writer = db.create_transaction()
    writer.add_write_conflict_key(b"guard")  # no mutation, yet a write for the resolver
    writer.commit()
    assert writer.get_committed_version() > 0
    reader[b"out"] = b""
    assert code_of(reader.commit) == 1020


def test_mvcc_a_transaction_keeps_its_read_version() -> None:
    db = SimDatabase()
    fill(db, {b"k": b"old", b"r/1": b""})
    tr = db.create_transaction()
    rv = tr.get_read_version()
    assert tr[b"k"] == b"old"
    w = db.create_transaction()
    w[b"k"] = b"new"
    w[b"r/2"] = b""
    del w[b"r/1"]
    w.commit()
    assert w.get_committed_version() > rv
    assert tr[b"k"] == b"old"
    assert [kv.key for kv in tr.get_range(b"r/", b"r0")] == [b"r/1"]
    assert tr.get_key(KeySelector.first_greater_or_equal(b"r/")) == b"r/1"
    assert db[b"k"] == b"new"
    tr.cancel()


def test_versions_follow_the_clock() -> None:
    clock = ManualClock(100.0)
    db = SimDatabase(clock=clock)
    tr = db.create_transaction()
    tr[b"a"] = b""
    tr.commit()
    assert tr.get_committed_version() == 100_000_001  # at least +1 a commit
    tr = db.create_transaction()
    tr[b"a"] = b""
    tr.commit()
    assert tr.get_committed_version() == 100_000_002
    clock.advance(2.0)
    tr = db.create_transaction()
    tr[b"a"] = b""
    tr.commit()
    assert tr.get_committed_version() == 102_000_000


# --- the 5-second window ---------------------------------------------------------------------------


def test_five_second_window() -> None:
    clock = ManualClock()
    db = SimDatabase(clock=clock)
    fill(db, {b"k": b"v"})

    tr = db.create_transaction()
    tr.get(b"k")
    clock.advance(5.1)
    assert code_of(lambda: tr.get(b"k")) == 1007
    assert code_of(lambda: tr.snapshot.get_range(b"", b"\xff")) == 1007

    tr = db.create_transaction()
    tr.get(b"k")
    tr[b"k"] = b"w"
    clock.advance(5.1)
    assert code_of(tr.commit) == 1007
    assert db[b"k"] == b"v"

    tr = db.create_transaction()
    tr[b"k"] = b"blind"
    clock.advance(5.1)
    tr.commit()  # no read version before commit: the one taken at commit is not too old
    assert db[b"k"] == b"blind"

    # Only snapshot reads, then writes: the write conflict ranges miss the (empty) read
    # conflict ranges, so commit adds a self-conflicting read range and the resolver checks
    # the read version (Transaction::makeSelfConflicting, called from
    # Transaction::commitMutations in fdbclient/NativeAPI.actor.cpp unless causal_write_risky).
    tr = db.create_transaction()
    tr.snapshot.get(b"k")
    tr[b"k"] = b"after snapshot read"
    clock.advance(5.1)
    assert code_of(tr.commit) == 1007
    assert db[b"k"] == b"blind"

    # The same for a read version taken explicitly, with an atomic op (no read at all).
    tr = db.create_transaction()
    tr.get_read_version()
    tr.add(b"n", b"\x01")
    clock.advance(5.1)
    assert code_of(tr.commit) == 1007
    assert db[b"n"] is None

    # The window starts at the read version (the first read), not at the first write.
    tr = db.create_transaction()
    tr[b"x"] = b""
    clock.advance(5.1)
    assert tr.get(b"k") == b"blind"
    tr.commit()


def test_read_only_commit_after_the_window_returns_at_once() -> None:
    """A transaction with no mutation and no write conflict range commits without a check,
    however old its read version (Transaction::commitMutations, fdbclient/NativeAPI.actor.cpp:
    "if this is a read-only transaction return immediately")."""
    clock = ManualClock()
    db = SimDatabase(clock=clock)
    fill(db, {b"k": b"v"})
    tr = db.create_transaction()
    assert tr[b"k"] == b"v"
    tr.get_range(b"a", b"z")
    tr.add_read_conflict_key(b"other")
    clock.advance(5.1)
    tr.commit()
    assert tr.get_committed_version() == -1
    assert db.stats.read_only == 1 and db.stats.too_old == 0
    assert code_of(lambda: tr.get_versionstamp().wait()) == 2021  # no_commit_version


def test_a_forgotten_transaction_does_not_pin_old_versions() -> None:
    clock = ManualClock()
    db = SimDatabase(clock=clock)
    old = db.create_transaction()
    old.get(b"q/0")
    for i in range(100):
        commit_write(db, b"q/%d" % i)
        tr = db.create_transaction()
        del tr[b"q/%d" % i]
        tr.commit()
    assert db.sizes()["keys"] == 100  # the open reader might still need every version
    clock.advance(7.0)
    commit_write(db, b"other")
    assert db.sizes() == {"keys": 1, "versions": 1, "log": 0, "pending": 0, "live": 0, "watches": 0}
    assert code_of(lambda: old.get(b"q/1")) == 1007


def test_transactions_the_garbage_collector_frees_during_commits_break_no_commit() -> None:
    """A transaction in a reference cycle (as the fdb bindings' Transaction objects are) ends
    in the cyclic collector, which runs in whichever thread allocates: inside another
    thread's commit too, while the store walks its live read versions. Its finaliser must
    not change them under the walk (it did: 'dictionary changed size during iteration')."""
    import gc
    import sys

    db = SimDatabase()
    stop = threading.Event()
    errors: list[BaseException] = []

    def litter() -> None:
        while not stop.is_set():
            tr = db.create_transaction()
            tr.get(b"a")  # takes a read version: live until the transaction ends
            tr.cycle = tr  # type: ignore[attr-defined]  # freed only by the cyclic collector
            del tr

    def commit() -> None:
        try:
            for i in range(3000):
                tr = db.create_transaction()
                tr.get(b"x")
                tr.set(b"k%d" % (i % 7), b"v%d" % i)
                tr.commit()
        except BaseException as exc:  # reported below
            errors.append(exc)

    thresholds, interval = gc.get_threshold(), sys.getswitchinterval()
    gc.set_threshold(50, 1, 1)  # collect often, so some collections land inside a commit
    sys.setswitchinterval(1e-5)
    threads = [threading.Thread(target=litter), threading.Thread(target=commit)]
    try:
        for t in threads:
            t.start()
        threads[1].join(120)
    finally:
        stop.set()
        threads[0].join(120)
        gc.set_threshold(*thresholds)
        sys.setswitchinterval(interval)
    assert not errors, errors
    gc.collect()
    commit_write(db, b"other")  # a commit collects: every finalised transaction is gone
    assert db.sizes()["live"] == 0


# --- transaction size ----------------------------------------------------------------------------
# Transaction::getSize (fdbclient/NativeAPI.actor.cpp): mutations.expectedSize() +
# read_conflict_ranges.expectedSize() + write_conflict_ranges.expectedSize(), checked against
# 10,000,000 in Transaction::commitMutations (2101). VectorRef::expectedSize (flow/Arena.h)
# adds sizeof(MutationRef) = 56 and sizeof(KeyRangeRef) = 32 per element.


def test_size_counts_write_conflict_ranges() -> None:
    db = SimDatabase()
    tr = db.create_transaction()
    for i in range(1000):  # 9 MB of keys, 27 MB as FoundationDB counts: each key also twice
        tr[b"%09d" % i + b"k" * 8991] = b""  # in its write conflict range [key, keyAfter(key))
    assert code_of(tr.commit) == 2101
    assert db.get_range(b"", b"\xff") == []
    tr = db.create_transaction()
    for i in range(1000):  # 9.1 MB as FoundationDB counts
        tr[b"%09d" % i + b"k" * 2991] = b""
    tr.commit()
    assert len(db.get_range(b"", b"\xff")) == 1000


def test_size_is_exact_at_the_limit() -> None:
    # 100 sets of 10-byte keys: 100 * (56 + 10 + v) mutation bytes + 100 * (32 + 10 + 11) write
    # conflict bytes = 10,000,000 exactly with v = 99,881.
    def commit_sets(last_value: int) -> None:
        tr = SimDatabase().create_transaction()
        for i in range(99):
            tr[b"k/%08d" % i] = b"v" * 99_881
        tr[b"k/%08d" % 99] = b"v" * last_value
        tr.commit()

    commit_sets(99_881)  # exactly the limit: commits ("transactionSize > sizeLimit")
    assert code_of(lambda: commit_sets(99_882)) == 2101


def test_size_counts_read_conflict_ranges_of_transactions_that_write() -> None:
    db = SimDatabase()

    def reads(tr: SimTransaction, snapshot: bool) -> None:
        view = tr.snapshot if snapshot else tr
        for i in range(600):  # 600 * (32 + 2 * 9000 + 1) bytes of read conflict ranges
            view.get(b"%09d" % i + b"r" * 8991)

    tr = db.create_transaction()
    reads(tr, False)
    tr[b"out"] = b""
    assert code_of(tr.commit) == 2101
    tr = db.create_transaction()
    reads(tr, True)  # snapshot reads add no read conflict range
    tr[b"out"] = b""
    tr.commit()
    tr = db.create_transaction()
    reads(tr, False)
    tr.commit()  # read-only: returns before the size check (commitMutations)


def test_size_counts_what_ryw_coalesces_once() -> None:
    # RYW hands over its write map (ReadYourWritesTransaction::writeRangeToNativeTransaction):
    # a key set many times is one mutation, overlapping conflict ranges are merged.
    db = SimDatabase()
    tr = db.create_transaction()
    key = b"k" * 9000
    for i in range(2000):
        tr[key] = b"%d" % i
        tr.get_range(b"a", b"m")
        tr.add_write_conflict_range(b"a", b"z" * 9000)
    tr.commit()
    assert db[key] == b"1999"


# --- keys past the user key space ------------------------------------------------------------------


def test_system_keys_are_refused_as_foundationdb_refuses_them() -> None:
    """Without read_system_keys (fdbclient/ReadYourWrites.cpp): get refuses key >=
    getMaxReadKey() (b'\\xff'), getRange and the conflict ranges refuse a begin or end past it,
    clear (ReadYourWritesTransaction::clear) refuses one past getMaxWriteKey(); all 2004."""
    db = SimDatabase()
    fill(db, {b"a": b"1"})
    tr = db.create_transaction()
    assert code_of(lambda: tr.get(b"\xff")) == 2004
    assert code_of(lambda: tr.snapshot.get(b"\xff/x")) == 2004
    assert code_of(lambda: tr.get_range(b"a", b"\xff\x00")) == 2004
    assert code_of(lambda: tr.get_range(KeySelector.first_greater_or_equal(b"\xff\x00"), b"\xff")) == 2004
    assert code_of(lambda: tr.get_range(b"a", KeySelector.first_greater_than(b"\xff\x00"))) == 2004
    assert code_of(lambda: tr.add_read_conflict_range(b"a", b"\xff\x01")) == 2004
    assert code_of(lambda: tr.add_write_conflict_range(b"a", b"\xff\x01")) == 2004
    assert code_of(lambda: tr.clear_range(b"a", b"\xff\x01")) == 2004
    # Up to b'\xff' itself is legal, and a selector clamps there.
    assert [kv.key for kv in tr.get_range(b"", b"\xff")] == [b"a"]
    assert tr.get_key(KeySelector.first_greater_than(b"a")) == b"\xff"
    tr.clear_range(b"\xff", b"\xff")
    # A key longer than any stored one: absent, not an error (ReadYourWritesTransaction::get).
    assert tr.get(b"k" * 10_001) is None


# --- fault injection -------------------------------------------------------------------------------


def outcomes(seed: int) -> list[object]:
    db = SimDatabase(seed=seed, faults=0.5)
    seen: list[object] = []
    for i in range(60):
        tr = db.create_transaction()
        tr.get(b"k")
        tr[b"k/%d" % i] = b"v"
        try:
            tr.commit()
            seen.append("ok")
        except EngineError as exc:
            seen.append((exc.code, db[b"k/%d" % i] is not None))
    return seen


def test_same_seed_same_run() -> None:
    first = outcomes(7)
    assert first == outcomes(7)
    assert first != outcomes(8)
    assert {o if isinstance(o, str) else o[0] for o in first} == {"ok", 1020, 1021, 1007}
    assert all(o[1] is False for o in first if isinstance(o, tuple) and o[0] != 1021)


def test_injected_faults_only_where_foundationdb_can_give_them() -> None:
    """1020 needs read conflict ranges of the transaction's own (its self-conflicting range,
    Transaction::makeSelfConflicting, is on a unique key); 1007 a read version taken before
    commit; 1021 may end any commit with writes."""
    db = SimDatabase(seed=4, faults=1.0)
    fill(db, {b"k": b"v"})
    for i in range(90):
        tr = db.create_transaction()
        tr[b"blind/%d" % i] = b""  # no read version before commit: only 1021
        try:
            tr.commit()
        except EngineError as exc:
            assert exc.code == 1021
    assert set(db.stats.faults) == {1021}
    db.stats.faults.clear()
    for i in range(90):
        tr = db.create_transaction()
        tr.snapshot.get(b"k")  # a read version, no read conflict range: 1021 or 1007
        tr[b"snap/%d" % i] = b""
        try:
            tr.commit()
        except EngineError as exc:
            assert exc.code in (1021, 1007)
    assert set(db.stats.faults) == {1021, 1007}
    db.stats.faults.clear()
    tr = db.create_transaction()
    tr.get(b"k")
    tr.commit()  # read-only: never a fault
    assert db.stats.faults == {}


def test_commit_unknown_result_is_sometimes_applied_sometimes_not() -> None:
    db = SimDatabase(seed=3, faults=1.0)
    applied = set()
    unknown = 0
    for i in range(60):
        tr = db.create_transaction()
        tr[b"k/%d" % i] = b"v"
        try:
            tr.commit()
        except EngineError as exc:
            assert exc.code == 1021  # a blind write can neither conflict nor be too old
            unknown += 1
            applied.add(db.get_range_startswith(b"k/%d" % i) != [])
    assert applied == {True, False}
    # faults=1: every commit drew a fault; the 1020s and 1007s drawn could not happen here.
    assert db.stats.faults == {1021: unknown} and 10 < unknown < 40


def test_idempotent_increment_survives_faults() -> None:
    db = SimDatabase(seed=11, faults=0.3)

    @fdbqueue.transactional
    def increment(tr: Any, marker: bytes) -> None:
        # The recipe for 1021: the body may run again after a commit that did happen.
        if tr[marker] is not None:
            return
        n = int(tr[b"counter"] or b"0")
        tr[b"counter"] = str(n + 1).encode()
        tr[marker] = b""

    for i in range(200):
        increment(db, b"done/%d" % i)
    assert db[b"counter"] == b"200"
    assert db.stats.faults.get(1021, 0) > 5 and db.stats.faults.get(1020, 0) > 5


def test_concurrent_transfers_keep_the_total_under_faults_and_delays() -> None:
    db = SimDatabase(seed=5, faults=0.1, delay=0.0005)
    fill(db, {b"acct/%d" % i: b"100" for i in range(5)})

    @fdbqueue.transactional
    def transfer(tr: Any, src: bytes, dst: bytes, marker: bytes) -> None:
        if tr[marker] is not None:
            return
        a, b = int(tr[src]), int(tr[dst])
        tr[src], tr[dst] = str(a - 1).encode(), str(b + 1).encode()
        tr[marker] = b""

    def worker(w: int) -> None:
        for i in range(40):
            transfer(db, b"acct/%d" % (i % 5), b"acct/%d" % ((i + w) % 5), b"m/%d/%d" % (w, i))

    threads = [threading.Thread(target=worker, args=(w,)) for w in range(1, 5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sum(int(kv.value) for kv in db.get_range_startswith(b"acct/")) == 500
    assert len(db.get_range_startswith(b"m/")) == 160
    assert db.stats.conflicts > 0  # the threads did interleave


def test_cancel_during_commit_raises_1025() -> None:
    """tr.cancel() while its commit is under way ends the commit with transaction_cancelled
    (RYW's resetPromise, fdbclient/ReadYourWrites.cpp), and the transaction stays cancelled."""

    class CancellingClock(ManualClock):
        tr: SimTransaction | None = None

        def sleep(self, seconds: float) -> None:  # the sim's commit delay
            if self.tr is not None:
                self.tr.cancel()
            super().sleep(seconds)

    clock = CancellingClock()
    db = SimDatabase(delay=0.01, clock=clock)
    tr = clock.tr = db.create_transaction()
    tr[b"k"] = b"v"
    assert code_of(tr.commit) == 1025
    assert code_of(lambda: tr.get(b"k")) == 1025
    assert db[b"k"] is None and db.stats.commits == 0


# --- watches ---------------------------------------------------------------------------------------


def test_watch_fires_on_change_only_after_its_transaction_commits() -> None:
    db = SimDatabase()
    fill(db, {b"w": b"0"})
    tr = db.create_transaction()
    watch = tr.watch(b"w")
    commit_write(db, b"w", b"1")
    assert not watch.is_ready()  # not armed before the watching transaction commits
    tr.commit()
    assert watch.wait(0) is True  # armed: the value already differs from what tr saw

    _, watch = db.get_and_watch(b"w")
    commit_write(db, b"w", b"1")  # the same value: not a change
    assert not watch.is_ready()
    commit_write(db, b"w", b"2")
    assert watch.wait(0) is True
    assert db.sizes()["watches"] == 0


def test_watch_sees_its_own_transactions_write() -> None:
    db = SimDatabase()
    tr = db.create_transaction()
    watch = tr.watch(b"w")
    tr[b"w"] = b"mine"
    tr.commit()
    assert watch.wait(0) is True


def test_watch_of_a_failed_commit_raises_its_error() -> None:
    db = SimDatabase()
    tr = db.create_transaction()
    watch = tr.watch(b"w")  # a serializable read of w
    commit_write(db, b"w", b"changed")
    tr[b"other"] = b""
    assert code_of(tr.commit) == 1020
    assert code_of(lambda: watch.wait(0)) == 1020


def test_watch_of_a_reset_transaction_raises_1025_and_cancel_unregisters() -> None:
    db = SimDatabase()
    tr = db.create_transaction()
    watch = tr.watch(b"w")
    tr.reset()
    assert code_of(lambda: watch.wait(0)) == 1025

    _, watch = db.get_and_watch(b"w")
    assert db.sizes()["watches"] == 1
    watch.cancel()
    assert db.sizes()["watches"] == 0
    assert code_of(lambda: watch.wait(0)) == 1101
    commit_write(db, b"w", b"x")  # nothing left to fire


def test_watch_wakes_a_waiting_thread() -> None:
    db = SimDatabase()
    _, watch = db.get_and_watch(b"w")
    threading.Timer(0.02, lambda: commit_write(db, b"w", b"x")).start()
    assert watch.wait(5.0) is True


def test_too_many_watches() -> None:
    db = SimDatabase()
    db.max_watches = 2
    watches = [db.get_and_watch(b"w")[1] for _ in range(3)]
    assert code_of(lambda: watches[2].wait(0)) == 1032
    assert not watches[0].is_ready()


# --- versionstamps ---------------------------------------------------------------------------------


def stamped_key(prefix: bytes, suffix: bytes = b"") -> bytes:
    return prefix + b"\x00" * 10 + suffix + struct.pack("<I", len(prefix))


def test_versionstamps_increase_and_are_shared_within_a_transaction() -> None:
    db = SimDatabase()
    stamps = []
    for _ in range(5):
        tr = db.create_transaction()
        tr.set_versionstamped_key(stamped_key(b"j/", b"/1"), b"one")
        tr.set_versionstamped_key(stamped_key(b"j/", b"/2"), b"two")
        tr.set_versionstamped_value(b"last", b"\x00" * 10 + struct.pack("<I", 0))
        future = tr.get_versionstamp()
        tr.commit()
        stamps.append(future.wait())
    assert stamps == sorted(stamps) and len(set(stamps)) == 5
    keys = [kv.key for kv in db.get_range_startswith(b"j/")]
    assert keys == [b"j/" + s + sfx for s in stamps for sfx in (b"/1", b"/2")]
    assert db[b"last"] == stamps[-1]


def test_versionstamped_writes_are_unreadable_in_their_transaction() -> None:
    db = SimDatabase()
    fill(db, {b"j/": b"", b"k": b""})
    tr = db.create_transaction()
    tr.set_versionstamped_key(stamped_key(b"j/"), b"v")
    tr.set_versionstamped_value(b"val", b"\x00" * 10 + struct.pack("<I", 0))
    assert code_of(lambda: tr.get_range_startswith(b"j/")) == 1036
    assert code_of(lambda: tr.snapshot[b"val"]) == 1036
    assert tr[b"k"] == b""  # elsewhere reads work
    tr[b"val"] = b"plain"
    assert tr[b"val"] == b"plain"  # overwritten: readable again
    tr.commit()


def test_versionstamped_key_conflicts_with_a_reader_of_its_range() -> None:
    db = SimDatabase()
    reader = db.create_transaction()
    reader.get_range_startswith(b"j/")
    writer = db.create_transaction()
    writer.set_versionstamped_key(stamped_key(b"j/"), b"v")
    writer.commit()
    reader[b"out"] = b""
    assert code_of(reader.commit) == 1020


# --- compaction and scale --------------------------------------------------------------------------


def test_enqueue_and_clear_cycles_stay_fast_and_small() -> None:
    db = SimDatabase()

    @fdbqueue.transactional
    def enqueue(tr: Any, i: int) -> None:
        tr.snapshot.get_range(b"q/", b"q0", limit=1, reverse=True)
        tr[b"q/%08d" % i] = b"payload"

    @fdbqueue.transactional
    def dequeue(tr: Any) -> bytes:
        first = tr.get_range(b"q/", b"q0", limit=1)
        del tr[first[0].key]
        return first[0].key  # type: ignore[no-any-return]

    start = time.monotonic()
    for i in range(10_000):
        enqueue(db, i)
        assert dequeue(db) == b"q/%08d" % i
        if i % 1000 == 0:
            assert db.sizes()["keys"] <= 2
    elapsed = time.monotonic() - start
    sizes = db.sizes()
    assert sizes["keys"] == 0 and sizes["log"] == 0 and sizes["pending"] == 0 and sizes["live"] == 0
    assert elapsed < 10.0, f"20,000 transactions took {elapsed:.1f} s"


# --- URLs ------------------------------------------------------------------------------------------


def test_urls() -> None:
    db = fdbqueue.open("memory://")
    assert isinstance(db, SimDatabase) and db.engine == "memory" and db.faults == 0
    db = fdbqueue.open("sim://?seed=4&faults=0.25&delay=0.01")
    assert isinstance(db, SimDatabase)
    assert (db.engine, db.seed, db.faults, db.delay) == ("sim", 4, 0.25, 0.01)
    assert db.url == "sim://?seed=4&faults=0.25&delay=0.01"


@pytest.mark.parametrize(
    "url",
    [
        "memory://name",
        "memory://?seed=1",
        "sim://x",
        "sim://?seed=1.5",
        "sim://?faults=-0.1",
        "sim://?faults=nan",
        "sim://?delay=-1",
        "sim://?delay=inf",
        "sim://?fault=0.1",
    ],
)
def test_bad_urls(url: str) -> None:
    with pytest.raises(fdbqueue.InvalidURLError, match=r"\S"):
        fdbqueue.open(url)


# --- serializability -------------------------------------------------------------------------------


def model_range(state: dict[bytes, bytes], b: bytes, e: bytes, limit: int, reverse: bool) -> list[Any]:
    keys = sorted((k for k in state if b <= k < e), reverse=reverse)
    return [(k, state[k]) for k in keys[: limit or None]]


def model_key(state: dict[bytes, bytes], sel: KeySelector) -> bytes:
    keys = sorted(state)
    if sel.offset >= 1:
        after = [k for k in keys if (k > sel.key if sel.or_equal else k >= sel.key)]
        return after[sel.offset - 1] if len(after) >= sel.offset else b"\xff"
    before = [k for k in keys if (k <= sel.key if sel.or_equal else k < sel.key)]
    return before[sel.offset - 1] if len(before) >= 1 - sel.offset else b""


def test_committed_transactions_are_serializable_in_commit_order() -> None:
    """Threads run random read-then-write transactions; replaying the committed ones one by one
    in commit-version order must reproduce every serializable read they made, and the store."""
    import random

    db = SimDatabase(seed=2, delay=0.0002)
    keys = [b"k%d" % i for i in range(8)]
    log: list[tuple[int, list[tuple[Any, ...]], list[tuple[Any, ...]]]] = []
    log_lock = threading.Lock()

    def worker(seed: int) -> None:
        rnd = random.Random(seed)
        for _ in range(120):
            tr = db.create_transaction()
            while True:
                reads: list[tuple[Any, ...]] = []
                writes: list[tuple[Any, ...]] = []
                try:
                    for _ in range(rnd.randint(1, 3)):
                        kind = rnd.random()
                        if kind < 0.4:
                            k = rnd.choice(keys)
                            reads.append(("get", k, tr.get(k)))
                        elif kind < 0.8:
                            b, e = sorted(rnd.sample(keys, 2))
                            limit, rev = rnd.randint(0, 2), rnd.random() < 0.5
                            got = [tuple(kv) for kv in tr.get_range(b, e, limit, rev)]
                            reads.append(("range", b, e, limit, rev, got))
                        else:
                            sel = KeySelector(rnd.choice(keys), rnd.random() < 0.5, rnd.randint(-1, 2))
                            reads.append(("key", sel, tr.get_key(sel)))
                    for _ in range(rnd.randint(1, 2)):
                        kind, k = rnd.random(), rnd.choice(keys)
                        if kind < 0.5:
                            v = b"%d" % rnd.randint(0, 99)
                            tr[k] = v
                            writes.append(("set", k, v))
                        elif kind < 0.7:
                            del tr[k]
                            writes.append(("clear", k))
                        elif kind < 0.85:
                            b, e = sorted(rnd.sample(keys, 2))
                            tr.clear_range(b, e)
                            writes.append(("clear_range", b, e))
                        else:
                            tr.add(k, b"\x01")
                            writes.append(("add", k))
                    tr.commit()
                    with log_lock:
                        log.append((tr.get_committed_version(), reads, writes))
                    break
                except EngineError as exc:
                    tr.on_error(exc)

    threads = [threading.Thread(target=worker, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db.stats.conflicts > 0  # the interleavings were real

    state: dict[bytes, bytes] = {}
    for _, reads, writes in sorted(log, key=lambda entry: entry[0]):
        for read in reads:
            if read[0] == "get":
                assert state.get(read[1]) == read[2]
            elif read[0] == "range":
                assert model_range(state, *read[1:5]) == read[5]
            else:
                assert model_key(state, read[1]) == read[2]
        for w in writes:
            if w[0] == "set":
                state[w[1]] = w[2]
            elif w[0] == "clear":
                state.pop(w[1], None)
            elif w[0] == "clear_range":
                for k in [k for k in state if w[1] <= k < w[2]]:
                    del state[k]
            else:
                state[w[1]] = bytes([(state.get(w[1], b"\x00")[:1] or b"\x00")[0] + 1 & 0xFF])
    assert {kv.key: kv.value for kv in db.get_range(b"", b"\xff")} == state
