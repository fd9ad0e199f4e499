"""Database time: the local engines' read versions, and the layer ordering and ageing by them.

FoundationDB hands out read versions that advance at about VERSIONS_PER_SECOND even when
nothing commits (``fdbserver/sequencer/masterserver.cpp``: each commit version moves on by
VERSIONS_PER_SECOND times the time elapsed; proxies commit empty batches when idle,
``MAX_COMMIT_BATCH_INTERVAL`` in ``fdbserver/core/ServerKnobs.cpp``), every later commit is
above them, and no client's wall clock takes part. The layer decides every deadline by them.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue, QueueConfig, UnsupportedLayerFormatError
from fdbqueue.engines.contract import Database
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.store.clock import fake_clock
from fdbqueue.store.layout import QueueKeys
from tests.support.engines import engine_url

LOCAL = ["memory", "sim", "sqlite"]


@pytest.fixture(params=LOCAL)
def local_db(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(engine_url(str(request.param), tmp_path))
    try:
        yield db
    finally:
        db.close()


def read_version(db: Database) -> int:
    tr = db.create_transaction()
    try:
        return tr.get_read_version()
    finally:
        tr.cancel()


def commit_version(db: Database, key: bytes = b"k") -> int:
    tr = db.create_transaction()
    tr.set(key, b"v")
    tr.commit()
    return tr.get_committed_version()


# -- the engines -------------------------------------------------------------------------------


def test_read_versions_advance_when_nothing_commits(local_db: Database) -> None:
    commit_version(local_db)
    with fake_clock() as clock:
        first = read_version(local_db)
        clock.advance(2.0)
        second = read_version(local_db)
    assert 2 * VERSIONS_PER_SECOND <= second - first < 2 * VERSIONS_PER_SECOND + 1000


def test_read_versions_advance_in_real_time(local_db: Database) -> None:
    commit_version(local_db)
    first = read_version(local_db)
    time.sleep(0.05)
    assert read_version(local_db) - first >= 0.05 * VERSIONS_PER_SECOND


def test_every_later_commit_is_above_every_read_version(local_db: Database) -> None:
    with fake_clock():  # a frozen clock: the versions' own order must still hold
        for i in range(50):
            rv = read_version(local_db)
            cv = commit_version(local_db, b"k%d" % (i % 3))
            assert cv > rv
            assert read_version(local_db) >= cv


def test_read_versions_ignore_wall_clock_corrections(
    local_db: Database, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A wall clock set 2 h ahead, then corrected: versions neither jump nor stand still."""
    ahead = 7200
    real_time, real_ns = time.time, time.time_ns
    with fake_clock() as clock:
        monkeypatch.setattr(time, "time", lambda: real_time() + ahead)
        monkeypatch.setattr(time, "time_ns", lambda: real_ns() + ahead * 10**9)
        before = read_version(local_db)
        committed = commit_version(local_db)
        monkeypatch.undo()
        assert committed - before < VERSIONS_PER_SECOND, "the commit version followed the wall clock"
        clock.advance(1.0)
        after = read_version(local_db)
    assert VERSIONS_PER_SECOND <= after - committed < VERSIONS_PER_SECOND + 1000


def test_sqlite_versions_are_shared_by_every_handle_and_survive_reopening(tmp_path: Path) -> None:
    url = engine_url("sqlite", tmp_path)
    a, b = fdbqueue.open(url), fdbqueue.open(url)
    try:
        cv = commit_version(a)
        assert read_version(b) >= cv
        assert commit_version(b) > cv
    finally:
        a.close()
        b.close()
    c = fdbqueue.open(url)
    try:
        assert read_version(c) > cv
    finally:
        c.close()


# -- the layer format ---------------------------------------------------------------------------


def _write_format_1_store(db: Database) -> None:
    """What fdbqueue 1.x leaves: the root's format key at 1.0 and a queue whose settings
    carry no format (its deadlines were wall-clock microseconds)."""
    keys = QueueKeys.make("jobs")
    settings = {f.name: getattr(QueueConfig(), f.name) for f in dataclasses.fields(QueueConfig)}
    tr = db.create_transaction()
    tr.set(keys.format, b"1.0")
    tr.set(keys.config, json.dumps(settings, sort_keys=True).encode())
    tr.set(keys.listing, b"")
    tr.commit()


def test_a_store_of_layer_format_1_is_refused(local_db: Database) -> None:
    _write_format_1_store(local_db)
    q = Queue("jobs")
    calls = [
        lambda: q.enqueue(local_db, b"x"),
        lambda: q.dequeue(local_db),
        lambda: q.lease(local_db),
        lambda: q.sweep(local_db),
        lambda: fdbqueue.queue_config(local_db, "jobs"),
        lambda: fdbqueue.create_queue(local_db, "other"),
    ]
    for call in calls:
        with pytest.raises(UnsupportedLayerFormatError, match=r"format 1\.0.*wall-clock"):
            call()
    raw = local_db.get(QueueKeys.make("jobs").config)  # type: ignore[attr-defined]
    assert raw is not None and b'"format"' not in raw, "the refused store was rewritten"


def test_a_new_store_records_layer_format_2(local_db: Database) -> None:
    fdbqueue.create_queue(local_db, "jobs")
    keys = QueueKeys.make("jobs")
    assert local_db.get(keys.format) == b"2.0"  # type: ignore[attr-defined]
    assert json.loads(local_db.get(keys.config))["format"] == "2.0"  # type: ignore[attr-defined]
