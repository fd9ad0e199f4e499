"""Conformance suite for the transaction contract: the same tests on every engine.

Each expectation is FoundationDB's documented behaviour (developer-guide.rst, api-python.rst
and api-error-codes.rst in its documentation/sphinx/source/), so what
passes here on the embedded and sim engines also holds on a cluster.
"""

from __future__ import annotations

import struct
import threading
import time
from typing import Any

import pytest

import fdbqueue
from fdbqueue import EngineError, KeySelector, KeyValue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.local.transaction import LocalDatabase
from fdbqueue.engines.transactional import run_transaction


def put(db: Database, items: dict[bytes, bytes]) -> None:
    @fdbqueue.transactional
    def body(tr: Any) -> None:
        for k, v in items.items():
            tr[k] = v

    body(db)


def keys(kvs: list[KeyValue]) -> list[bytes]:
    return [kv.key for kv in kvs]


ABC = {b"a": b"1", b"b": b"2", b"c": b"3", b"d": b"4"}


# --- reads and writes ---------------------------------------------------------------------------


def test_set_get_clear(db: Database) -> None:
    assert db.get(b"missing") is None  # type: ignore[attr-defined]
    db[b"k"] = b"v"  # type: ignore[index]
    assert db[b"k"] == b"v"  # type: ignore[index]
    del db[b"k"]  # type: ignore[attr-defined]
    assert db[b"k"] is None  # type: ignore[index]
    db[b"empty"] = b""  # type: ignore[index]
    assert db[b"empty"] == b""  # type: ignore[index]


def test_range_reads(db: Database) -> None:
    put(db, ABC)
    assert keys(db.get_range(b"a", b"d")) == [b"a", b"b", b"c"]  # type: ignore[attr-defined]
    assert keys(db.get_range(b"a", b"\xff", limit=2)) == [b"a", b"b"]  # type: ignore[attr-defined]
    assert keys(db.get_range(b"a", b"\xff", reverse=True)) == [b"d", b"c", b"b", b"a"]  # type: ignore[attr-defined]
    assert keys(db.get_range(b"a", b"\xff", limit=1, reverse=True)) == [b"d"]  # type: ignore[attr-defined]
    assert db.get_range(b"c", b"b") == []  # type: ignore[attr-defined]
    kv = db.get_range(b"b", b"c")[0]  # type: ignore[attr-defined]
    k, v = kv
    assert (k, v) == (b"b", b"2") and kv.value == b"2"
    put(db, {b"p/1": b"x", b"p/2": b"y", b"q": b"z"})
    assert keys(db.get_range_startswith(b"p/")) == [b"p/1", b"p/2"]  # type: ignore[attr-defined]


def test_key_selectors(db: Database) -> None:
    put(db, ABC)

    @fdbqueue.transactional
    def resolve(tr: Any, sel: KeySelector) -> bytes:
        return tr.get_key(sel)  # type: ignore[no-any-return]

    assert resolve(db, KeySelector.first_greater_or_equal(b"b")) == b"b"
    assert resolve(db, KeySelector.first_greater_than(b"b")) == b"c"
    assert resolve(db, KeySelector.last_less_than(b"b")) == b"a"
    assert resolve(db, KeySelector.last_less_or_equal(b"b")) == b"b"
    assert resolve(db, KeySelector.first_greater_or_equal(b"b") + 2) == b"d"
    assert resolve(db, KeySelector.last_less_than(b"a")) == b""  # clamps to the start
    assert resolve(db, KeySelector.first_greater_than(b"d")) == b"\xff"  # clamps to the end
    got = db.get_range(KeySelector.first_greater_than(b"a"), KeySelector.first_greater_or_equal(b"d"))  # type: ignore[attr-defined]
    assert keys(got) == [b"b", b"c"]


def test_clear_range(db: Database) -> None:
    put(db, ABC)
    db.clear_range(b"b", b"d")  # type: ignore[attr-defined]
    assert keys(db.get_range(b"", b"\xff")) == [b"a", b"d"]  # type: ignore[attr-defined]
    put(db, {b"p/1": b"", b"p/2": b"", b"pq": b""})

    @fdbqueue.transactional
    def clear_prefix(tr: Any) -> None:
        tr.clear_range_startswith(b"p/")

    clear_prefix(db)
    assert keys(db.get_range(b"p", b"q")) == [b"pq"]  # type: ignore[attr-defined]
    with pytest.raises(EngineError) as err:
        db.clear_range(b"z", b"a")  # type: ignore[attr-defined]
    assert err.value.code == 2005


def test_read_your_writes(db: Database) -> None:
    put(db, ABC)

    @fdbqueue.transactional
    def body(tr: Any) -> tuple[Any, ...]:
        tr[b"b"] = b"new"
        del tr[b"c"]
        tr[b"bb"] = b"5"
        tr.add(b"n", struct.pack("<q", 3))
        tr.clear_range(b"d", b"e")
        return (
            tr[b"b"],
            tr.snapshot[b"b"],
            tr[b"c"],
            keys(tr.get_range(b"a", b"\xff")),
            tr[b"n"],
        )

    b, snap_b, c, ks, n = body(db)
    assert b == b"new" and snap_b == b"new" and c is None
    assert ks == [b"a", b"b", b"bb", b"n"]
    assert n == struct.pack("<q", 3)


def test_abort_leaves_no_trace(db: Database) -> None:
    db[b"k"] = b"before"  # type: ignore[index]

    @fdbqueue.transactional
    def failing(tr: Any) -> None:
        tr[b"k"] = b"after"
        tr[b"other"] = b"x"
        tr.add(b"n", b"\x01")
        raise RuntimeError("application failure")

    with pytest.raises(RuntimeError):
        failing(db)
    assert db[b"k"] == b"before"  # type: ignore[index]
    assert db[b"other"] is None and db[b"n"] is None  # type: ignore[index]
    tr = db.create_transaction()
    tr[b"k"] = b"cancelled"
    tr.cancel()
    with pytest.raises(EngineError) as err:
        tr[b"x"] = b"y"
    assert err.value.code == 1025
    assert db[b"k"] == b"before"  # type: ignore[index]


# --- atomic operations ---------------------------------------------------------------------------


def atomic(db: Database, op: str, key: bytes, param: bytes) -> bytes | None:
    @fdbqueue.transactional
    def body(tr: Any) -> None:
        getattr(tr, op)(key, param)

    body(db)
    return db[key]  # type: ignore[index,no-any-return]


def test_atomic_add(db: Database) -> None:
    one = struct.pack("<q", 1)
    assert atomic(db, "add", b"n", one) == one
    assert atomic(db, "add", b"n", struct.pack("<q", -3)) == struct.pack("<q", -2)
    db[b"short"] = b"\x05"  # type: ignore[index]
    assert atomic(db, "add", b"short", b"\x01\x00") == b"\x06\x00"  # zero-extended
    db[b"long"] = b"\x05\x00\x09"  # type: ignore[index]
    assert atomic(db, "add", b"long", b"\x01") == b"\x06"  # truncated to the param
    assert atomic(db, "add", b"wrap", b"\xff") == b"\xff"
    assert atomic(db, "add", b"wrap", b"\x02") == b"\x01"  # overflow wraps


def test_atomic_min_max_bytes_and_bits(db: Database) -> None:
    assert atomic(db, "max", b"m", struct.pack("<I", 5)) == struct.pack("<I", 5)
    assert atomic(db, "max", b"m", struct.pack("<I", 3)) == struct.pack("<I", 5)
    assert atomic(db, "min", b"m", struct.pack("<I", 2)) == struct.pack("<I", 2)
    assert atomic(db, "byte_max", b"s", b"abc") == b"abc"
    assert atomic(db, "byte_max", b"s", b"abd") == b"abd"
    assert atomic(db, "byte_min", b"s", b"ab") == b"ab"
    assert atomic(db, "bit_or", b"f", b"\x01") == b"\x01"
    assert atomic(db, "bit_or", b"f", b"\x02") == b"\x03"
    assert atomic(db, "bit_and", b"f", b"\x02") == b"\x02"
    assert atomic(db, "bit_xor", b"f", b"\x03") == b"\x01"
    assert atomic(db, "compare_and_clear", b"f", b"\x07") == b"\x01"  # different: kept
    assert atomic(db, "compare_and_clear", b"f", b"\x01") is None  # equal: cleared
    assert atomic(db, "append_if_fits", b"log", b"ab") == b"ab"
    assert atomic(db, "append_if_fits", b"log", b"cd") == b"abcd"


def test_versionstamps(db: Database) -> None:
    prefix = b"vs/"

    def stamped(tr: Any) -> Any:
        # key: prefix + 10 placeholder bytes + user suffix; offset points after the prefix
        tr.set_versionstamped_key(prefix + b"\x00" * 10 + b"!" + struct.pack("<I", len(prefix)), b"v")
        tr.set_versionstamped_value(b"val", b"head" + b"\x00" * 10 + struct.pack("<I", 4))
        return tr.get_versionstamp()

    futures = [run_transaction(db, stamped) for _ in range(3)]
    stamps = [f.wait() for f in futures]
    assert all(len(s) == 10 for s in stamps)
    assert stamps == sorted(stamps) and len(set(stamps)) == 3
    assert keys(db.get_range_startswith(prefix)) == [prefix + s + b"!" for s in stamps]  # type: ignore[attr-defined]
    assert db[b"val"] == b"head" + stamps[-1]  # type: ignore[index]


def test_read_and_commit_versions(db: Database) -> None:
    tr = db.create_transaction()
    rv = tr.get_read_version()
    tr[b"k"] = b"v"
    tr.commit()
    cv = tr.get_committed_version()
    assert isinstance(rv, int) and cv > rv
    ro = db.create_transaction()
    ro.get(b"k")
    ro.commit()
    assert ro.get_committed_version() == -1
    assert db.create_transaction().get_read_version() >= cv


# --- limits and bad input ------------------------------------------------------------------------


def code_of(fn: Any) -> int:
    with pytest.raises(EngineError) as err:
        fn()
    return err.value.code


def test_limits(db: Database) -> None:
    assert code_of(lambda: db.set(b"k" * 10_001, b"v")) == 2102  # type: ignore[attr-defined]
    assert code_of(lambda: db.set(b"k", b"v" * 100_001)) == 2103  # type: ignore[attr-defined]
    assert code_of(lambda: db.set(b"\xff/system", b"v")) == 2004  # type: ignore[attr-defined]
    db.set(b"k" * 10_000, b"v" * 100_000)  # exactly at the limits is fine
    assert db[b"k" * 10_000] == b"v" * 100_000  # type: ignore[index]

    @fdbqueue.transactional
    def too_large(tr: Any) -> None:
        for i in range(101):
            tr[b"big/%03d" % i] = b"x" * 99_990

    assert code_of(lambda: too_large(db)) == 2101
    assert db.get_range_startswith(b"big/") == []  # type: ignore[attr-defined]


def test_size_counts_conflict_ranges(db: Database) -> None:
    """Transaction::getSize (fdbclient/NativeAPI.actor.cpp) counts the mutations and the read
    and write conflict ranges: 1,000 sets of 9 KB keys are 9 MB of keys but 27 MB there."""

    @fdbqueue.transactional
    def sets(tr: Any, n: int) -> None:
        for i in range(1000):
            tr[b"big/%04d/" % i + b"k" * n] = b""

    assert code_of(lambda: sets(db, 9000)) == 2101
    assert db.get_range_startswith(b"big/") == []  # type: ignore[attr-defined]
    sets(db, 2990)  # 9.1 MB as FoundationDB counts
    assert len(db.get_range_startswith(b"big/")) == 1000  # type: ignore[attr-defined]


def test_system_keys_and_long_keys(db: Database) -> None:
    """ReadYourWritesTransaction::get (fdbclient/ReadYourWrites.cpp) refuses key >=
    getMaxReadKey() (b'\\xff' without read_system_keys) with 2004, and answers "absent" for a
    key longer than any stored one; conflict ranges and clears refuse ends past b'\\xff'."""
    tr = db.create_transaction()
    assert code_of(lambda: tr.get(b"\xff")) == 2004
    assert code_of(lambda: tr.snapshot.get(b"\xff/x")) == 2004
    assert tr.get(b"k" * 10_001) is None
    assert code_of(lambda: tr.add_read_conflict_range(b"a", b"\xff\x01")) == 2004
    assert code_of(lambda: tr.clear_range(b"a", b"\xff\x01")) == 2004
    tr.cancel()


def test_on_error_leaves_a_transaction_cancelled_after_a_fatal_error(db: Database) -> None:
    """RYWImpl::onError (fdbclient/ReadYourWrites.cpp): when it re-raises, the transaction is
    cancelled (resetPromise: transaction_cancelled) until reset."""
    tr = db.create_transaction()
    tr[b"k"] = b"v"
    with pytest.raises(EngineError):
        tr.on_error(EngineError(2103))
    assert code_of(lambda: tr.get(b"k")) == 1025
    assert code_of(tr.commit) == 1025
    tr.reset()
    tr[b"k"] = b"v"
    tr.commit()
    assert db[b"k"] == b"v"  # type: ignore[index]


def _age(db: Database, seconds: float) -> None:
    """Let ``seconds`` pass for ``db``'s open transactions (the in-process engines' clock)."""
    if isinstance(db, LocalDatabase):
        clock = db.clock
        db.clock = lambda: clock() + seconds  # type: ignore[method-assign]
    else:
        time.sleep(seconds)


def test_the_five_second_window_at_commit(db: Database) -> None:
    """Transaction::commitMutations (fdbclient/NativeAPI.actor.cpp): a read-only transaction
    returns at once, unchecked; one with writes whose write conflict ranges miss its read
    conflict ranges gets makeSelfConflicting, so the resolver checks its read version (1007)."""
    db[b"k"] = b"v"  # type: ignore[index]
    tr = db.create_transaction()
    assert tr.get(b"k") == b"v"
    _age(db, 5.5)
    tr.commit()  # read-only
    tr = db.create_transaction()
    assert tr.snapshot.get(b"k") == b"v"
    tr[b"k"] = b"snapshot"
    _age(db, 5.5)
    assert code_of(tr.commit) == 1007
    tr = db.create_transaction()
    tr[b"k"] = b"blind"
    _age(db, 5.5)
    tr.commit()  # no read version before commit: the one taken at commit is not too old
    assert db[b"k"] == b"blind"  # type: ignore[index]
    tr = db.create_transaction()
    tr[b"w"] = b"first"
    _age(db, 5.5)
    assert tr.get(b"k") == b"blind"  # the window starts at the read version, the first read
    tr.commit()
    assert db[b"w"] == b"first"  # type: ignore[index]


@pytest.mark.parametrize("bad", ["text", 3, None, bytearray(b"x")])
def test_non_bytes_rejected(db: Database, bad: Any) -> None:
    with pytest.raises(TypeError):
        db.set(bad, b"v")  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        db.set(b"k", bad)  # type: ignore[attr-defined]
    assert db.get_range(b"", b"\xff") == []  # type: ignore[attr-defined]


# --- the transactional decorator and the retry loop -----------------------------------------------


def test_transactional_joins_or_owns(db: Database) -> None:
    @fdbqueue.transactional
    def write(tr: Any, key: bytes, value: bytes = b"v") -> bytes:
        tr[key] = value
        return key

    assert write(db, b"a") == b"a"
    assert write(tr=db, key=b"b", value=b"kw") == b"b"  # tr by keyword
    tr = db.create_transaction()
    write(tr, b"c")
    tr.cancel()  # joined: the caller's abort takes the write with it
    assert db[b"c"] is None  # type: ignore[index]
    tr = db.create_transaction()
    write(tr, b"c")
    tr.commit()
    assert db[b"b"] == b"kw" and db[b"c"] == b"v"  # type: ignore[index]
    with pytest.raises(fdbqueue.QueueError):
        write("not a database", b"x")


def test_transactional_refuses_generators() -> None:
    with pytest.raises(ValueError):

        @fdbqueue.transactional
        def gen(tr: Any) -> Any:
            yield 1

    with pytest.raises(ValueError):

        @fdbqueue.transactional
        def no_tr(db: Any) -> None:
            pass


def test_function_returning_generator_refused(db: Database) -> None:
    @fdbqueue.transactional
    def lazy(tr: Any) -> Any:
        return (kv for kv in tr.get_range(b"", b"\xff"))

    with pytest.raises(ValueError):
        lazy(db)


def test_a_joined_function_returning_a_generator_is_the_callers(db: Database) -> None:
    """Only a function the decorator commits may not return a generator (its body may run
    again after the generator was handed out); joined, the caller's transaction reads it."""

    @fdbqueue.transactional
    def lazy(tr: Any) -> Any:
        return (n for n in (1, 2))

    tr = db.create_transaction()
    assert list(lazy(tr)) == [1, 2]
    assert list(lazy(tr=tr)) == [1, 2]
    tr.cancel()
    with pytest.raises(ValueError):
        lazy(tr=db)


def test_a_wrong_tr_is_named_after_right_ones(db: Database) -> None:
    @fdbqueue.transactional
    def write(tr: Any) -> None:
        tr[b"w"] = b"v"

    write(db)  # the kinds known now (adopt's cache): a wrong one must still be refused
    tr = db.create_transaction()
    write(tr)
    tr.commit()
    for wrong in (42, object(), b"tr"):
        with pytest.raises(fdbqueue.QueueError, match=r"write\(\), as 'tr': expected a Database"):
            write(wrong)
        with pytest.raises(fdbqueue.QueueError, match=r"write\(\), as 'tr'"):
            write(tr=wrong)


def test_retryable_errors_rerun_the_body(db: Database) -> None:
    attempts: list[int] = []

    @fdbqueue.transactional
    def flaky(tr: Any) -> int:
        tr[b"attempt/%d" % len(attempts)] = b"x"
        attempts.append(1)
        if len(attempts) < 3:
            raise EngineError(1020, "simulated conflict")
        return len(attempts)

    assert flaky(db) == 3
    # Only the attempt that committed left its writes.
    assert keys(db.get_range_startswith(b"attempt/")) == [b"attempt/2"]  # type: ignore[attr-defined]

    @fdbqueue.transactional
    def fatal(tr: Any) -> None:
        raise EngineError(2102, "not retryable")

    assert code_of(lambda: fatal(db)) == 2102


def test_on_error_and_options(db: Database) -> None:
    tr = db.create_transaction()
    tr[b"k"] = b"v"
    tr.on_error(EngineError(1020))  # retryable: resets the transaction
    tr.commit()
    assert db[b"k"] is None  # type: ignore[index]
    tr = db.create_transaction()
    tr.options.set_retry_limit(1)
    tr.on_error(EngineError(1020))
    with pytest.raises(EngineError):
        tr.on_error(EngineError(1020))
    tr = db.create_transaction()
    with pytest.raises(EngineError):
        tr.on_error(EngineError(2103))
    with pytest.raises(ValueError):
        db.create_transaction().on_error(ValueError("application error"))


def test_transaction_timeout(db: Database) -> None:
    tr = db.create_transaction()
    tr.options.set_timeout(50)
    tr.get(b"k")
    time.sleep(0.12)
    assert code_of(lambda: tr.get(b"k")) == 1031
    # The timeout cancels the transaction until reset: every later call, on_error too, raises
    # 1031 (ReadYourWritesTransaction's resetPromise; RYWImpl::onError rethrows its error).
    assert code_of(lambda: tr.get(b"k")) == 1031
    assert code_of(lambda: tr.on_error(EngineError(1020))) == 1031
    assert code_of(tr.commit) == 1031
    tr.reset()
    assert tr.get(b"k") is None


def test_a_timeout_set_after_the_first_read_stops_get_read_version(db: Database) -> None:
    """A transaction begun without a timeout takes the short way through its calls (nothing
    to check); a timeout set afterwards must still stop every call, ``get_read_version``
    (which the queue layer asks at every operation) too, and the commit."""
    tr = db.create_transaction()
    tr.get(b"k")  # begun, no timeout: the calls after take their short way
    assert tr.get_read_version() >= 0
    tr.options.set_timeout(50)
    time.sleep(0.12)
    assert code_of(tr.get_read_version) == 1031
    assert code_of(tr.commit) == 1031


def test_transaction_timeout_counts_from_creation_across_retries(db: Database) -> None:
    """RYW's timeout is timebomb(timeoutInSeconds + creationTime): creationTime is set when the
    transaction is created or reset, not by on_error (ReadYourWritesTransaction::resetTimeout,
    ::resetRyow, fdbclient/ReadYourWrites.cpp)."""
    tr = db.create_transaction()
    tr.options.set_timeout(150)
    tr.get(b"k")
    time.sleep(0.1)
    tr.on_error(EngineError(1020))
    time.sleep(0.1)
    assert code_of(lambda: tr.get(b"k")) == 1031
    tr = db.create_transaction()
    time.sleep(0.15)
    tr.options.set_timeout(100)
    assert code_of(lambda: tr.get(b"k")) == 1031
    tr.reset()  # a new creation time (and no timeout: reset clears the options)
    tr.options.set_timeout(5000)
    assert tr.get(b"k") is None


def test_reset_allows_reuse(db: Database) -> None:
    tr = db.create_transaction()
    tr[b"a"] = b"1"
    tr.commit()
    tr.reset()
    tr[b"b"] = b"2"
    tr.reset()
    tr[b"c"] = b"3"
    tr.commit()
    assert (db[b"a"], db[b"b"], db[b"c"]) == (b"1", None, b"3")  # type: ignore[index]


def test_on_finish_reports_the_outcome(db: Database) -> None:
    seen: list[int | None] = []

    def record(err: EngineError | None) -> None:
        seen.append(None if err is None else err.code)

    tr = db.create_transaction()
    tr.on_finish(record)
    tr[b"k"] = b"v"
    tr.commit()
    tr2 = db.create_transaction()
    tr2.on_finish(record)
    tr2[b"k"] = b"w"
    tr2.cancel()
    tr3 = db.create_transaction()
    tr3.on_finish(record)
    tr3[b"k"] = b"x"
    tr3.on_error(EngineError(1020))
    assert seen == [None, 1025, 1020]


# --- concurrency and watches ---------------------------------------------------------------------


def test_concurrent_read_modify_write_is_serializable(db: Database) -> None:
    @fdbqueue.transactional
    def incr(tr: Any) -> None:
        n = int(tr[b"counter"] or b"0")
        tr[b"counter"] = str(n + 1).encode()

    def worker() -> None:
        for _ in range(100):
            incr(db)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert db[b"counter"] == b"400"  # type: ignore[index]


def test_watch_fires_on_change(db: Database) -> None:
    db[b"w"] = b"0"  # type: ignore[index]
    value, watch = db.get_and_watch(b"w")  # type: ignore[attr-defined]
    assert value == b"0"
    assert watch.wait(0.05) is False  # nothing changed yet
    db[b"w"] = b"0"  # type: ignore[index]  # same value: no change to report
    assert watch.wait(0.05) is False
    start = time.monotonic()
    db[b"w"] = b"1"  # type: ignore[index]
    assert watch.wait(2.0) is True
    assert time.monotonic() - start < 1.0


def test_watch_from_another_thread(db: Database) -> None:
    _, watch = db.get_and_watch(b"w2")  # type: ignore[attr-defined]
    threading.Timer(0.05, lambda: db.set(b"w2", b"x")).start()  # type: ignore[attr-defined]
    assert watch.wait(5.0) is True


def test_watch_of_a_cancelled_transaction_fails(db: Database) -> None:
    tr = db.create_transaction()
    watch = tr.watch(b"w3")
    tr.cancel()
    with pytest.raises(EngineError) as err:
        watch.wait(1.0)
    assert err.value.code == 1025


def test_a_versionstamp_future_asked_before_or_after_the_commit(db: Database) -> None:
    """The future answers the same whenever it is asked for: before the commit (FoundationDB's
    usual order) or after it; a read-only commit and an uncommitted transaction have no stamp
    (2021), and a transaction that never committed has none either. (The in-process engines
    make the future when first asked; FoundationDB's future of an open transaction waits for
    its commit, and is asked before it.)"""
    if not isinstance(db, LocalDatabase):
        pytest.skip("the in-process engines' future, made when first asked")
    before = db.create_transaction()
    early = before.get_versionstamp()
    before[b"vs/a"] = b"1"
    before.commit()
    after = db.create_transaction()
    after[b"vs/b"] = b"2"
    after.commit()
    late = after.get_versionstamp()
    assert len(early.wait()) == len(late.wait()) == 10
    assert early.wait() < late.wait()
    assert late.wait()[:8] == struct.pack(">Q", after.get_committed_version())
    reader = db.create_transaction()
    assert reader[b"vs/a"] == b"1"
    reader.commit()
    with pytest.raises(EngineError) as caught:
        reader.get_versionstamp().wait()
    assert caught.value.code == 2021
    open_one = db.create_transaction()
    open_one[b"vs/c"] = b"3"
    with pytest.raises(EngineError) as caught:
        open_one.get_versionstamp().wait()
    assert caught.value.code == 2021
    open_one.cancel()
