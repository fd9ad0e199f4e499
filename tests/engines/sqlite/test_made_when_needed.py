"""The parts of an embedded transaction made only when needed (issue 30, eighth pass): its
options, its write map's sorted keys and cleared ranges, its reads' dict, and the retry
loop's step and ``Attempt`` of ``transactional``'s call on a Database. Each test tries to
break what the laziness could get wrong: a part asked for late, after writes, after a reset,
after a commit, or across a retry."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue.engines.contract import Again, Attempt, Done
from fdbqueue.engines.local.writemap import WriteMap
from fdbqueue.engines.transactional import transactional
from fdbqueue.errors import EngineError


@pytest.fixture
def db(tmp_path: Path) -> Any:
    handle = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    yield handle
    handle.close()


def test_options_are_made_when_asked_with_their_defaults_and_a_reset_drops_them(db: Any) -> None:
    tr = db.create_transaction()
    tr[b"a"] = b"1"
    tr.commit()
    assert tr._options is None  # nothing asked: none made
    tr = db.create_transaction()
    assert (tr.options.timeout_ms, tr.options.retry_limit, tr.options.max_retry_delay_ms) == (0, -1, 1000)
    assert tr.options.volatile == ()
    tr.options.set_retry_limit(3)
    tr.options.set_volatile_prefix(b"v")
    assert tr.options is tr.options  # one object, kept
    tr.reset()
    assert tr._options is None and tr.options.retry_limit == -1 and tr.options.volatile == ()
    tr.cancel()
    # (A timeout set on options made only after the first operation still fires:
    # tests/engines/sqlite/test_flat_commit.py, which now runs exactly that case.)


def test_the_write_map_is_made_for_a_range_and_keeps_every_later_write(db: Any) -> None:
    db[b"k1"], db[b"k5"], db[b"k9"] = b"s1", b"s5", b"s9"
    tr = db.create_transaction()
    tr[b"k3"] = b"w3"
    tr.clear(b"k5")
    tr.add(b"n", (1).to_bytes(8, "little"))
    assert tr._wm is None  # point writes only: no map
    assert [kv.key for kv in tr.get_range(b"k", b"l")] == [b"k1", b"k3", b"k9"]
    wm = tr._wm
    assert isinstance(wm, WriteMap) and wm.values is tr._values  # one dict, both views
    tr[b"k4"] = b"w4"  # after the map's sorted keys were made: they must see it
    tr.clear(b"k9")
    assert [kv.key for kv in tr.get_range(b"k", b"l")] == [b"k1", b"k3", b"k4"]
    assert [kv.key for kv in tr.get_range(b"k", b"l", reverse=True)] == [b"k4", b"k3", b"k1"]
    tr.clear_range(b"k1", b"k35")
    tr[b"k2"] = b"w2"  # inside the cleared range, written after it
    assert [kv.key for kv in tr.get_range(b"k", b"l")] == [b"k2", b"k4"]
    assert tr.get(b"k1") is None and tr.get(b"k3") is None and tr.get(b"k2") == b"w2"
    assert tr.get_many([b"k1", b"k2", b"k9", b"n"]) == [None, b"w2", None, (1).to_bytes(8, "little")]
    tr.commit()
    assert [(kv.key, kv.value) for kv in db.get_range(b"k", b"l")] == [(b"k2", b"w2"), (b"k4", b"w4")]
    assert db.get(b"n") == (1).to_bytes(8, "little")


def test_reads_before_the_begin_and_after_the_commit_cannot_reach_another_transaction(db: Any) -> None:
    db[b"a"] = b"1"
    tr = db.create_transaction()
    with pytest.raises(TypeError):  # the stand-in refuses writes: nothing can leak through it
        tr._seen[b"x"] = b"y"
    assert tr.get(b"a") == b"1"
    tr[b"b"] = b"2"
    tr.commit()
    with pytest.raises(TypeError):
        tr._seen[b"x"] = b"y"
    with pytest.raises(EngineError) as caught:
        tr.get(b"a")  # a committed transaction refuses, as before
    assert caught.value.code == 2017
    tr.reset()
    assert tr.get(b"a") == b"1" and tr.get(b"b") == b"2"  # reset: reads again
    tr[b"c"] = b"3"
    tr.commit()
    other = db.create_transaction()  # the next transaction reads what the last one kept
    assert other.get_many([b"a", b"b", b"c", b"zz"]) == [b"1", b"2", b"3", None]
    other.cancel()


def test_transactional_on_a_database_retries_commits_and_answers_as_retry_loop(db: Any) -> None:
    runs: list[int] = []

    @transactional
    def flaky(tr: Any, n: int, *, tag: bytes) -> int:
        runs.append(n)
        tr[b"t" + tag] = b"%d" % len(runs)
        if len(runs) < 3:
            raise EngineError(1020, "not_committed")  # retryable: the loop runs it again
        return n * 2

    assert flaky(db, 21, tag=b"x") == 42
    assert runs == [21, 21, 21] and db.get(b"tx") == b"3"  # only the last attempt committed

    @transactional
    def stop(tr: Any) -> Done[str]:
        tr[b"never"] = b"1"
        return Done("stopped")  # retry_loop's answer: not committed

    assert stop(db) == "stopped" and db.get(b"never") is None

    count: list[int] = []

    @transactional
    def twice(tr: Any) -> Any:
        count.append(1)
        tr[b"n%d" % len(count)] = b"1"
        return Again() if len(count) < 2 else "done"

    assert twice(db) == "done" and db.get(b"n1") == db.get(b"n2") == b"1"

    @transactional
    def fails(tr: Any) -> None:
        tr[b"f"] = b"1"
        raise EngineError(2004, "not retryable")

    with pytest.raises(EngineError) as caught:
        fails(db)
    assert caught.value.code == 2004 and db.get(b"f") is None
    # The store lock was given back: another transaction commits at once.
    db[b"after"] = b"1"
    assert db.get(b"after") == b"1"


def test_an_attempt_counts_from_its_class_defaults_and_each_is_its_own() -> None:
    first, second = Attempt(), Attempt()
    assert (first.tries, first.unknown, first.conflicts) == (0, False, 0)
    first.tries += 1
    first.unknown = True
    first.conflicts += 2
    assert (first.tries, first.unknown, first.conflicts) == (1, True, 2)
    assert (second.tries, second.unknown, second.conflicts) == (0, False, 0)
    assert (Attempt.tries, Attempt.unknown, Attempt.conflicts) == (0, False, 0)


def test_get_many_checks_its_keys_as_the_general_path_does(db: Any) -> None:
    """``_read_many``'s common case checks the keys joined (no 0xff byte, within one key's
    limit) and asks ``max`` only otherwise: keys with 0xff inside, a system key, a key past
    the limit and many keys adding up past it each answer, and count, as the general path."""
    from fdbqueue.engines.local.transaction import LocalTransaction

    inside = [b"a\xffb", b"c\xff", b"d"]
    long_ones = [b"k%05d" % i + b"x" * 200 for i in range(60)]  # 12k bytes together, each short
    db[b"a\xffb"], db[long_ones[7]] = b"1", b"2"
    for keys in (inside, long_ones, [b"a", b"x" * 20_000, b"a\xffb"]):
        fast, general = db.create_transaction(), db.create_transaction()
        try:
            got = fast.get_many(keys)
            fast_size = fast._size
            fast.cancel()
            assert got == LocalTransaction._read_many(general, keys, False)
            assert fast_size == general._size
        finally:
            general.cancel()
    for bad in ([b"a", b"\xff"], [b"\xff\x00", b"b"], [b"a", "b"]):
        for read in (lambda tr, keys: tr.get_many(keys), lambda tr, keys: [tr.get(k) for k in keys]):
            tr = db.create_transaction()
            with pytest.raises((EngineError, TypeError)) as caught:
                read(tr, bad)
            tr.cancel()
            kind = (type(caught.value), getattr(caught.value, "code", None))
            assert kind == ((TypeError, None) if "b" in bad else (EngineError, 2004))
