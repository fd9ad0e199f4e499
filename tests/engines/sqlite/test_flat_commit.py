"""The embedded engine's flat commit (``SqliteTransaction.commit``) against the general one.

The common case - begun, no timeout, within the size limit and the 5-second window - goes
straight to the engine's commit; everything else takes ``LocalTransaction.commit``. These
tests try to break the shortcut: the same outcome and state either way, a timeout or a window
that runs out after the transaction began, a commit that fails at its guard, a transaction
committed twice; and the version clock's inline read (the page trusted, this process's base
known) against a base left behind and a page left pending.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.local.transaction import LocalTransaction
from fdbqueue.engines.sqlite.database import SqliteDatabase
from fdbqueue.engines.sqlite.page import PENDING
from fdbqueue.errors import EngineError
from fdbqueue.store.clock import fake_clock


@pytest.fixture
def db(tmp_path: Path) -> Iterator[SqliteDatabase]:
    handle = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    assert isinstance(handle, SqliteDatabase)
    try:
        yield handle
    finally:
        handle.close()


def _run(db: SqliteDatabase, commit: object, key: bytes) -> tuple[object, ...]:
    """One transaction that reads, writes, adds, clears and stamps, committed by ``commit``;
    what it leaves: its state, the versions, the stamp, the callbacks' arguments, the store."""
    tr = db.create_transaction()
    finished: list[object] = []
    tr.on_finish(finished.append)
    assert tr.get(key) is None
    tr[key] = b"v"
    tr.add(key + b"/n", (1).to_bytes(8, "little"))
    tr.clear(key + b"/gone")
    tr.set_versionstamped_value(key + b"/s", b"\x00" * 10 + (0).to_bytes(4, "little"))
    stamp = tr.get_versionstamp()
    rv = tr.get_read_version()
    commit(tr)  # type: ignore[operator]
    version = tr.get_committed_version()
    after = db.create_transaction()
    stored = after.snapshot.get_range_startswith(key)
    after.cancel()
    return (
        tr._state,  # type: ignore[attr-defined]
        version > rv,
        stamp.wait() == version.to_bytes(8, "big") + b"\x00\x00",
        finished,
        [(kv.key[len(key) :], kv.value if kv.key != key + b"/s" else kv.value[:8]) for kv in stored],
        tr._locked,  # type: ignore[attr-defined]
    )


def test_the_flat_and_the_general_commit_leave_the_same_state(db: SqliteDatabase) -> None:
    flat = _run(db, lambda tr: tr.commit(), b"a")
    general = _run(db, LocalTransaction.commit, b"b")
    assert flat[0] == "committed" and flat[1] and flat[2] and flat[3] == [None] and not flat[5]
    assert flat[:4] == general[:4] and flat[5] == general[5]
    assert [k for k, _ in flat[4]] == [k for k, _ in general[4]] == [b"", b"/n", b"/s"]  # type: ignore[union-attr]


def test_a_timeout_set_after_the_first_operation_still_fails_the_commit(db: SqliteDatabase) -> None:
    with fake_clock() as clock:
        tr = db.create_transaction()
        tr[b"k"] = b"v"  # begun: the transaction is live
        tr.options.set_timeout(100)
        clock.advance(0.2)
        with pytest.raises(EngineError) as err:
            tr.commit()
        assert err.value.code == 1031 and err.value.during_commit
    probe = db.create_transaction()
    assert probe.get(b"k") is None  # nothing applied, the store lock released
    probe.cancel()


def test_a_commit_past_the_window_is_too_old_and_applies_nothing(db: SqliteDatabase) -> None:
    with fake_clock() as clock:
        tr = db.create_transaction()
        assert tr.get(b"k") is None  # the read version taken
        tr[b"k"] = b"v"
        clock.advance(5.5)
        with pytest.raises(EngineError) as err:
            tr.commit()
        assert err.value.code == 1007 and err.value.during_commit
    probe = db.create_transaction()
    assert probe.get(b"k") is None
    probe.cancel()


def test_a_commit_refused_at_its_guard_fails_as_the_general_path_fails(db: SqliteDatabase) -> None:
    """The lease taken over (the pin refuses): 1007, nothing applied, the store lock released,
    the callbacks told, no versionstamp; the same through both paths."""
    store = db._store
    own_pin = store.pin
    outcomes = []
    for commit in (lambda tr: tr.commit(), LocalTransaction.commit):
        store.pin = lambda: False  # type: ignore[method-assign]
        try:
            tr = db.create_transaction()
            finished: list[object] = []
            tr.on_finish(finished.append)
            tr[b"k"] = b"v"
            stamp = tr.get_versionstamp()
            with pytest.raises(EngineError) as err:
                commit(tr)  # type: ignore[operator]
        finally:
            store.pin = own_pin  # type: ignore[method-assign]  # the store's own again
        with pytest.raises(EngineError) as no_stamp:
            stamp.wait()
        outcomes.append(
            (
                err.value.code,
                err.value.during_commit,
                tr._state,  # type: ignore[attr-defined]
                [getattr(e, "code", e) for e in finished],
                no_stamp.value.code,
                tr._locked,  # type: ignore[attr-defined]
            )
        )
        probe = db.create_transaction()
        assert probe.get(b"k") is None  # nothing applied, and the lock was released
        probe.cancel()
    assert outcomes[0] == outcomes[1] == (1007, True, "failed", [1007], 2020, False)
    tr = db.create_transaction()  # and the next commit, pinned again, lands
    tr[b"k"] = b"v"
    tr.commit()
    assert db.get(b"k") == b"v"


def test_a_committed_transaction_refuses_a_second_commit(db: SqliteDatabase) -> None:
    tr = db.create_transaction()
    tr[b"k"] = b"v"
    tr.commit()
    with pytest.raises(EngineError) as err:
        tr.commit()
    assert err.value.code == 2017


def test_the_clock_read_inline_catches_up_a_base_left_behind(db: SqliteDatabase) -> None:
    """A process whose base of the version clock is far behind the page's last commit (its
    monotonic clock behind the others') still commits above the last version."""
    tr = db.create_transaction()
    tr[b"k"] = b"1"
    tr.commit()
    last = tr.get_committed_version()
    shared = db._store.shared  # type: ignore[attr-defined]
    shared.clock_base -= 10**12  # far behind: the inline read must not take it
    behind = shared.clock_base
    tr = db.create_transaction()
    tr[b"k"] = b"2"
    tr.commit()
    assert tr.get_committed_version() > last
    assert shared.clock_base > behind  # caught up with the last commit


def test_the_clock_read_inline_reads_meta_when_the_page_is_pending(db: SqliteDatabase) -> None:
    """A commit that died half-way leaves the page's clock pending: the next commit reads
    meta's reservation (every committed version is below it) instead of the page."""
    tr = db.create_transaction()
    tr[b"k"] = b"1"
    tr.commit()
    page = db._store.page  # type: ignore[attr-defined]
    tag, last, reserved, _, base = page.clock()
    page.pack_clock(tag, 0, 0, PENDING, base)  # a page that lost its last version, pending
    tr = db.create_transaction()
    tr[b"k"] = b"2"
    tr.commit()
    version = tr.get_committed_version()
    assert version > last and version > reserved  # from meta's reservation, not the page's 0
    assert page.clock()[3] == 0  # settled again


def test_a_timeout_set_after_the_first_operation_is_checked_by_the_next_write(db: SqliteDatabase) -> None:
    """The hot calls look at one flag (``_live``): setting a timeout must clear it, so that the
    next set, clear or add checks the timeout again."""
    with fake_clock() as clock:
        tr = db.create_transaction()
        tr[b"a"] = b"1"
        tr.options.set_timeout(100)
        clock.advance(0.2)
        for write in (lambda: tr.set(b"b", b"2"), lambda: tr.clear(b"b"), lambda: tr.add(b"n", b"\x01" * 8)):
            with pytest.raises(EngineError) as err:
                write()
            assert err.value.code == 1031
        tr.reset()


def test_a_nested_transaction_is_never_live_and_may_not_write(db: SqliteDatabase) -> None:
    """A transaction begun while this thread holds the store lock reads a snapshot of its own
    (nested): not live, so its writes take the general path, which refuses them."""
    outer = db.create_transaction()
    outer[b"k"] = b"outer"
    inner = db.create_transaction()
    assert inner.get(b"k") is None  # the last committed state
    assert not inner._live  # type: ignore[attr-defined]
    for write in (
        lambda: inner.set(b"k", b"x"),
        lambda: inner.clear(b"k"),
        lambda: inner.add(b"n", b"\x01" * 8),
        lambda: inner.set_versionstamped_value(b"s", b"\x00" * 10 + b"\x00" * 4),
    ):
        with pytest.raises(fdbqueue.NestedTransactionError):
            write()
    inner.cancel()
    outer.commit()


def test_a_read_version_read_inline_is_never_below_the_last_commit(db: SqliteDatabase) -> None:
    """``read_version``'s inline read of the clock: with this process's base left far behind
    (its monotonic clock behind the others'), or the page pending, the read version is still
    at least the last commit's version, and the commit after it above both."""
    tr = db.create_transaction()
    tr[b"k"] = b"1"
    tr.commit()
    last = tr.get_committed_version()
    shared = db._store.shared  # type: ignore[attr-defined]
    shared.clock_base -= 10**12
    tr = db.create_transaction()
    rv = tr.get_read_version()
    assert rv >= last
    tr[b"k"] = b"2"
    tr.commit()
    assert tr.get_committed_version() > rv
    last = tr.get_committed_version()
    page = db._store.page  # type: ignore[attr-defined]
    tag, _, reserved, _, base = page.clock()
    page.pack_clock(tag, 0, 0, PENDING, base)  # the page lost its last version, pending
    tr = db.create_transaction()
    rv = tr.get_read_version()
    assert rv >= reserved > last  # from meta's reservation, not the page's 0
    tr.cancel()
