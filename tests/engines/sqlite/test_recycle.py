"""A transaction of the retry loop kept for the next operation (``SqliteDatabase.recycle``).

Kept only when nothing but the loop refers to it, so that no one can tell: each test below
holds on to a transaction some way (a reference, a weak one, an attribute, an error's
traceback) and checks that it was not made new under the holder, or changes what a
transaction carries (options, a timeout) and checks that the next operation does not see it.
"""

from __future__ import annotations

import threading
import time
import weakref
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.contract import Transaction, retry_loop, run_transaction
from fdbqueue.engines.sqlite.database import SqliteDatabase
from fdbqueue.engines.sqlite.transaction import SqliteTransaction
from fdbqueue.errors import EngineError


@pytest.fixture
def db(tmp_path: Path) -> SqliteDatabase:
    handle = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    assert isinstance(handle, SqliteDatabase)
    yield handle
    handle.close()


def _state(tr: SqliteTransaction) -> dict[str, object]:
    """Every slot's value; new objects (the options, the write map) by kind and content."""
    out: dict[str, object] = {}
    for cls in type(tr).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if name in ("__dict__", "__weakref__", "_cur", "_conn", "_created") or name in out:
                continue
            value = getattr(tr, name, "<unset>")
            if type(value).__module__.startswith("fdbqueue"):
                slots = [s for c in type(value).__mro__ for s in getattr(c, "__slots__", ()) if s != "_owner"]
                value = (type(value), [(s, getattr(value, s, None)) for s in slots])
            out[name] = value
    return out


def _spare_ids(db: SqliteDatabase) -> list[int]:
    return [id(t) for t in db._spares]


def test_the_next_operation_runs_on_the_transaction_the_last_one_made(db: SqliteDatabase) -> None:
    seen: list[int] = []

    def step(tr: Transaction) -> None:
        seen.append(id(tr))
        tr.set(b"k%d" % len(seen), b"v")

    for _ in range(3):
        run_transaction(db, step)
    assert seen[0] == seen[1] == seen[2]  # made once (this interpreter counts references as measured)
    assert len(db._spares) == 1
    assert db.get(b"k3") == b"v"


def test_a_transaction_made_new_has_the_state_of_a_new_one(db: SqliteDatabase) -> None:
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, b"a")
    q.enqueue(db, b"b")
    assert q.dequeue(db) is not None  # reads, sets, clears: every field moved
    (spare,) = db._spares
    fresh = SqliteTransaction(db, db._store)
    assert spare.db is None  # parked without its database: no reference cycle
    spare.db = db
    assert _state(spare) == _state(fresh)
    spare.db = None  # type: ignore[assignment]
    fresh.cancel()


def test_a_transaction_still_referred_to_is_not_made_new(db: SqliteDatabase) -> None:
    kept: list[Transaction] = []

    def step(tr: Transaction) -> None:
        kept.append(tr)
        tr.set(b"k", b"v")

    run_transaction(db, step)
    assert db._spares == []
    (tr,) = kept
    assert tr.get_committed_version() > 0  # still the committed transaction, as its holder left it
    run_transaction(db, lambda t: t.set(b"other", b"w"))
    assert tr.get_committed_version() > 0 and tr._state == "committed"  # type: ignore[attr-defined]
    assert id(tr) not in _spare_ids(db)


def test_a_weak_reference_or_an_attribute_keeps_it_out(db: SqliteDatabase) -> None:
    refs: list[weakref.ref[Transaction]] = []

    def weakly(tr: Transaction) -> None:
        refs.append(weakref.ref(tr))
        tr.set(b"k", b"v")

    run_transaction(db, weakly)
    assert db._spares == [] and refs[0]() is None  # freed, not kept for someone to see again

    def marked(tr: Transaction) -> None:
        tr.mine = 1  # type: ignore[attr-defined]
        tr.set(b"k", b"w")

    run_transaction(db, marked)
    assert db._spares == []


def test_an_error_keeps_it_out(db: SqliteDatabase) -> None:
    run_transaction(db, lambda tr: tr.set(b"k", b"v"))
    assert len(db._spares) == 1

    def fails(tr: Transaction) -> None:
        tr.set(b"k", b"w")
        raise ValueError("no")

    with pytest.raises(ValueError):
        run_transaction(db, fails)
    assert db._spares == []  # the spare was taken and, cancelled, not given back
    assert db.get(b"k") == b"v"


def test_options_and_the_timeout_do_not_carry_over(db: SqliteDatabase) -> None:
    def with_options(tr: Transaction) -> None:
        tr.options.set_timeout(50)
        tr.options.set_retry_limit(3)
        tr.options.set_volatile_prefix(b"v/")
        tr.set(b"v/k", b"1")

    run_transaction(db, with_options)
    assert len(db._spares) == 1

    def plain(tr: Transaction) -> tuple[int, int, tuple[bytes, ...]]:
        time.sleep(0.1)  # past the last one's timeout, were it kept
        tr.set(b"k", b"2")
        return tr.options.timeout_ms, tr.options.retry_limit, tr.options.volatile

    assert run_transaction(db, plain) == (0, -1, ())
    assert db.get(b"k") == b"2"


def test_the_timeout_counts_from_when_it_is_handed_out(db: SqliteDatabase) -> None:
    run_transaction(db, lambda tr: tr.set(b"k", b"v"))
    assert len(db._spares) == 1
    time.sleep(0.3)  # parked longer than the timeout below

    def timed(tr: Transaction) -> None:
        tr.options.set_timeout(200)
        tr.set(b"k", b"w")

    run_transaction(db, timed)  # 1031 if it counted from the first operation's creation
    assert db.get(b"k") == b"w"


def test_threads_sharing_a_database_each_get_their_own(db: SqliteDatabase) -> None:
    q = fdbqueue.Queue("jobs")
    q.enqueue_many(db, [b"%d" % i for i in range(400)])
    got: list[bytes] = []
    lock = threading.Lock()

    def drain() -> None:
        while True:
            m = q.dequeue(db)
            if m is None:
                return
            with lock:
                got.append(m.payload)

    threads = [threading.Thread(target=drain) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(b"%d" % i for i in range(400))  # each once
    assert len(db._spares) <= 2


def test_a_closed_database_keeps_none(db: SqliteDatabase) -> None:
    run_transaction(db, lambda tr: tr.set(b"k", b"v"))
    assert len(db._spares) == 1
    db.close()
    assert db._spares == []
    with pytest.raises(fdbqueue.StoreError):
        db.create_transaction()


def test_a_commit_that_fails_keeps_it_out(db: SqliteDatabase) -> None:
    """A commit refused (here: too big, 2101) ends the loop with the error: not kept."""

    def big(tr: Transaction) -> None:
        for i in range(120):
            tr.set(b"k%d" % i, b"x" * 90_000)

    with pytest.raises(EngineError):
        retry_loop(db, lambda tr, attempt: big(tr), None, False)
    assert db._spares == []
