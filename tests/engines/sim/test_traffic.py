"""``fdbqueue.testing.traffic(db)``: what it counts on the sim engine, pinned one quantity at
a time (per-key committed writes, commits, attempts, conflicts, the hottest keys)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import EngineError, testing
from fdbqueue.engines.local.mutations import make_versionstamp
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.errors import FaultScriptError

ONE = (1).to_bytes(8, "little")


def sim() -> SimDatabase:
    db = fdbqueue.open("sim://?seed=3")
    assert isinstance(db, SimDatabase)
    return db


def test_each_kind_of_mutation_counts_on_its_key() -> None:
    db = sim()
    tr = db.create_transaction()
    tr[b"a"] = b"1"
    tr[b"b"] = b"1"
    tr[b"c"] = b"1"
    tr.commit()
    with testing.traffic(db) as t:
        tr = db.create_transaction()
        tr[b"a"] = b"2"  # a set
        tr.clear(b"b")  # a clear
        tr.add(b"n", ONE)  # an atomic op
        tr.clear_range(b"c", b"d")  # a range clear: once, on its begin key
        tr.commit()
    assert dict(t.writes) == {b"a": 1, b"b": 1, b"n": 1, b"c": 1}
    assert t.commits == 1


def test_a_key_changed_twice_in_one_commit_counts_once() -> None:
    db = sim()
    with testing.traffic(db) as t:
        tr = db.create_transaction()
        tr.add(b"n", ONE)
        tr.add(b"n", ONE)
        tr[b"k"] = b"1"
        tr[b"k"] = b"2"
        tr.commit()
        tr = db.create_transaction()
        tr.add(b"n", ONE)
        tr.commit()
    assert t.writes[b"n"] == 2
    assert t.writes[b"k"] == 1
    assert t.commits == 2


def test_a_versionstamped_key_counts_under_its_final_key() -> None:
    db = sim()
    with testing.traffic(db) as t:
        tr = db.create_transaction()
        tr.set_versionstamped_key(b"log/" + b"\x00" * 10 + (4).to_bytes(4, "little"), b"v")
        tr.commit()
        version = tr.get_committed_version()
    assert dict(t.writes) == {b"log/" + make_versionstamp(version): 1}


def test_commits_need_a_mutation() -> None:
    db = sim()
    with testing.traffic(db) as t:
        tr = db.create_transaction()
        tr.get(b"a")
        tr.commit()  # read-only
        tr = db.create_transaction()
        tr.add_write_conflict_key(b"w")  # a write conflict range, no mutation
        tr.commit()
        tr = db.create_transaction()
        tr[b"a"] = b"1"
        tr.commit()
    assert t.commits == 1
    assert t.transactions == 3
    assert dict(t.writes) == {b"a": 1}


def test_every_attempt_that_did_anything_is_a_transaction() -> None:
    db = sim()
    with testing.traffic(db) as t:
        db.create_transaction()  # never used: not an attempt
        tr = db.create_transaction()
        tr.get(b"x")  # read-only, never committed
        tr.reset()  # the attempt ends; the next operation starts another
        tr[b"y"] = b"1"  # write-only
        tr.commit()
        tr = db.create_transaction()
        tr.get_read_version()
        tr.cancel()
    assert t.transactions == 3
    assert t.commits == 1


def test_a_conflict_and_its_retry() -> None:
    db = sim()
    with testing.traffic(db) as t:
        tr = db.create_transaction()
        tr.get(b"k")
        other = db.create_transaction()
        other[b"k"] = b"1"
        other.commit()
        tr[b"j"] = b"1"
        with pytest.raises(EngineError) as err:
            tr.commit()
        assert err.value.code == 1020
        tr.on_error(err.value)  # the retry is another attempt
        tr.get(b"k")
        tr[b"j"] = b"1"
        tr.commit()
    assert t.conflicts == 1
    assert t.transactions == 3
    assert t.commits == 2
    assert dict(t.writes) == {b"k": 1, b"j": 1}


def test_an_injected_conflict_counts_and_writes_nothing() -> None:
    db = sim()
    with testing.FaultScript(db) as script, testing.traffic(db) as t:
        script.arm([1020])
        tr = db.create_transaction()
        tr.get(b"k")
        tr[b"k"] = b"1"
        with pytest.raises(EngineError):
            tr.commit()
    assert (t.conflicts, t.commits, t.transactions) == (1, 0, 1)
    assert dict(t.writes) == {}


def test_counts_only_while_open() -> None:
    db = sim()
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"before")
    with testing.traffic(db) as t:
        q.enqueue(db, b"during")
    counted = (t.transactions, t.commits, dict(t.writes))
    q.enqueue(db, b"after")
    q.dequeue(db)
    assert (t.transactions, t.commits, dict(t.writes)) == counted
    assert t.commits == 1
    assert t.transactions >= 1


def test_counts_every_thread_and_nests() -> None:
    db = sim()
    with testing.traffic(db) as outer:

        def write(i: int) -> None:
            for j in range(25):

                @fdbqueue.transactional
                def body(tr: fdbqueue.Transaction, key: bytes = b"k%d/%d" % (i, j)) -> None:
                    tr.add(b"hot", ONE)
                    tr[key] = b"v"

                body(db)

        with testing.traffic(db) as inner:
            threads = [threading.Thread(target=write, args=(i,)) for i in range(4)]
            for th in threads:
                th.start()
            for th in threads:
                th.join()
    assert inner.commits == outer.commits == 100
    assert inner.writes[b"hot"] == 100
    assert inner.hottest(2)[0] == (b"hot", 100)
    assert inner.hottest(2)[1][1] == 1
    assert len(inner.hottest(1000)) == 101
    assert inner.transactions == outer.transactions >= 100


def test_hottest_orders_by_writes() -> None:
    db = sim()
    with testing.traffic(db) as t:
        for key, times in ((b"a", 1), (b"b", 3), (b"c", 2)):
            for _ in range(times):
                tr = db.create_transaction()
                tr.add(key, ONE)
                tr.commit()
    assert t.hottest(2) == [(b"b", 3), (b"c", 2)]
    assert t.hottest(0) == []


@pytest.mark.parametrize("url", ["memory://", "sqlite"])
def test_other_engines_are_refused(url: str, tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite:///{tmp_path / 'q.db'}" if url == "sqlite" else url)
    with pytest.raises(FaultScriptError, match="sim://"), testing.traffic(db):
        pass


def test_a_commit_of_nothing_is_not_an_attempt() -> None:
    # FoundationDB's commit of a transaction that read and wrote nothing returns at once, with
    # no read version and no request to the cluster (Transaction::commitMutations,
    # fdbclient/NativeAPI.actor.cpp): "every attempt that read or wrote anything" leaves it out.
    db = sim()
    with testing.traffic(db) as t:
        tr = db.create_transaction()
        tr.commit()
        tr = db.create_transaction()
        tr.get(b"a")
        tr.commit()
    assert t.transactions == 1
    assert t.commits == 0


@pytest.mark.parametrize("n", [None, "3", 1.5, True, -1])
def test_hottest_refuses_what_is_not_a_count(n: object) -> None:
    db = sim()
    with testing.traffic(db) as t:
        tr = db.create_transaction()
        tr[b"a"] = b"1"
        tr.commit()
    with pytest.raises((TypeError, ValueError), match="hottest"):
        t.hottest(n)  # type: ignore[arg-type]
    assert t.hottest(1) == [(b"a", 1)]
