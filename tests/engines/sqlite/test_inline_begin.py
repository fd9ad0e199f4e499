"""A transaction's begin in fewer calls: ``SqliteTransaction._touch`` begins an open
transaction itself, and ``WritableStore.begin`` takes the store lock inline (the thread mutex
without waiting, then the other processes' lock), else through ``SharedStore.acquire``; a
commit releases both halves in one call (``StoreLock.release``). These tests try to break the
shortcuts: the lock held by another open file description (as another process holds it), the
lock's acquire failing inside, another thread holding the store, a begin that failed, a
timeout set before the first operation.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.sqlite import storelock as _storelock
from fdbqueue.engines.sqlite.database import SqliteDatabase
from fdbqueue.engines.sqlite.page import map_page
from fdbqueue.engines.sqlite.storelock import StoreLock
from fdbqueue.errors import EngineError, StoreLockedError
from fdbqueue.store.clock import fake_clock


@pytest.fixture
def path(tmp_path: Path) -> str:
    return str(tmp_path / "q.db")


@pytest.fixture
def db(path: str) -> Iterator[SqliteDatabase]:
    handle = fdbqueue.open(f"sqlite://{path}?sync=normal&lock_timeout=0.3")
    assert isinstance(handle, SqliteDatabase)
    try:
        yield handle
    finally:
        handle.close()


def _commit(db: SqliteDatabase, key: bytes) -> None:
    tr = db.create_transaction()
    tr[key] = b"v"
    tr.commit()


def _read(db: SqliteDatabase, key: bytes) -> bytes | None:
    tr = db.create_transaction()
    try:
        return tr.get(key)
    finally:
        tr.cancel()


def test_a_lock_held_elsewhere_times_out_and_leaves_the_thread_mutex_free(
    db: SqliteDatabase, path: str
) -> None:
    fd = os.open(path + "-lock", os.O_RDWR)  # another open file description: as another process
    mapped, page = map_page(fd)
    other = StoreLock(fd, page)
    try:
        assert other.acquire(1.0, True) is None
        with pytest.raises(StoreLockedError) as err:
            _commit(db, b"a")
        assert f"process {os.getpid()} holds it (in a transaction" in str(err.value)
        shared = db._store.shared  # type: ignore[attr-defined]
        assert shared.owner is None and not shared.mutex.locked()
        other.release()
        _commit(db, b"a")  # the next begin takes it: nothing was left held
        assert shared.owner is None and not shared.mutex.locked()  # the commit released both halves
        assert _read(db, b"a") == b"v"
    finally:
        other.close()
        mapped.close()
        os.close(fd)


def test_a_failure_inside_the_locks_acquire_releases_the_thread_mutex(
    db: SqliteDatabase, path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The waiting way: the begin's one call (StoreLock.take) finds the byte held by another
    open file description and hands over to SharedStore.acquire, whose StoreLock.acquire fails."""
    acquire = StoreLock.acquire
    fails = [True]

    def fail_once(self: StoreLock, timeout: float, stealable: bool) -> str | None:
        if fails:
            fails.pop()
            raise KeyboardInterrupt
        return acquire(self, timeout, stealable)

    fd = os.open(path + "-lock", os.O_RDWR)  # another open file description: as another process
    mapped, page = map_page(fd)
    other = StoreLock(fd, page)
    try:
        assert other.acquire(1.0, True) is None
        monkeypatch.setattr(_storelock.StoreLock, "acquire", fail_once)
        with pytest.raises(KeyboardInterrupt):
            _commit(db, b"b")
        assert not fails  # it went the waiting way
        shared = db._store.shared  # type: ignore[attr-defined]
        assert shared.owner is None and not shared.mutex.locked()
    finally:
        other.release()
        other.close()
        mapped.close()
        os.close(fd)
    _commit(db, b"b")
    assert _read(db, b"b") == b"v"


def test_a_failure_inside_the_begins_one_call_releases_the_thread_mutex(
    db: SqliteDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The one-call way (StoreLock.take): a failure as it locks the lease's byte leaves both
    halves free, and the next begin takes them."""
    lock_byte = _storelock._fcntl
    fails = [True]

    def fail_once(fd: int, cmd: int, arg: bytes) -> object:
        if fails and cmd == _storelock._SETLK:
            fails.pop()
            raise KeyboardInterrupt
        return lock_byte(fd, cmd, arg)

    monkeypatch.setattr(_storelock, "_fcntl", fail_once)
    with pytest.raises(KeyboardInterrupt):
        _commit(db, b"b")
    assert not fails
    shared = db._store.shared  # type: ignore[attr-defined]
    assert shared.owner is None and not shared.mutex.locked()
    _commit(db, b"b")
    assert _read(db, b"b") == b"v"


def test_another_thread_holding_the_store_is_waited_for(db: SqliteDatabase) -> None:
    held = threading.Event()
    done = threading.Event()
    errors: list[BaseException] = []

    def hold() -> None:
        try:
            tr = db.create_transaction()
            tr[b"c"] = b"first"
            assert tr.get(b"c") == b"first"  # begun: the store lock taken
            held.set()
            done.wait(0.1)
            tr.commit()
        except BaseException as exc:
            errors.append(exc)
            held.set()

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    _commit(db, b"d")  # waits for the thread's commit (the mutex's slow path), then takes it
    t.join(10)
    assert not errors
    assert _read(db, b"c") == b"first" and _read(db, b"d") == b"v"


def test_a_begin_that_failed_is_made_again_by_the_next_operation(db: SqliteDatabase, path: str) -> None:
    fd = os.open(path + "-lock", os.O_RDWR)
    mapped, page = map_page(fd)
    other = StoreLock(fd, page)
    try:
        assert other.acquire(1.0, True) is None
        tr = db.create_transaction()
        with pytest.raises(StoreLockedError):
            tr.get(b"e")  # its first operation: the begin waits, then gives up
        other.release()
        assert tr.get(b"e") is None  # begun now, by this operation
        tr[b"e"] = b"v"
        tr.commit()
        assert _read(db, b"e") == b"v"
    finally:
        other.close()
        mapped.close()
        os.close(fd)


def test_a_timeout_set_before_the_first_operation_is_checked_at_the_begin(db: SqliteDatabase) -> None:
    with fake_clock() as clock:
        tr = db.create_transaction()
        tr.options.set_timeout(100)
        clock.advance(0.2)
        with pytest.raises(EngineError) as err:
            tr.get(b"f")  # begins (not live: a timeout is set), then finds it past
        assert err.value.code == 1031
        shared = db._store.shared  # type: ignore[attr-defined]
        assert shared.owner is None and not shared.mutex.locked()  # the lock it took, released
        with pytest.raises(EngineError) as again:
            tr.set(b"f", b"v")
        assert again.value.code == 1031
    _commit(db, b"f")
    assert _read(db, b"f") == b"v"
