"""The embedded engine's free-space reserve (``reserve=`` in the URL): producers are turned
away while the device holding the store has less free space than the reserve, so that the
last space is the consumers'; consumers and settling never are.

A reserve larger than any disk puts a real store "below its reserve" on any machine, so these
run everywhere; tests/engines/sqlite/test_full_disk.py fills a real small tmpfs.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import InvalidURLError, Queue, StoreError, StoreFullError
from fdbqueue.engines.sqlite.diskroom import DEFAULT_RESERVE, parse_reserve

HUGE = "reserve=100000000G"  # 100 EB: more than any disk has free


def test_the_reserve_parses_bytes_with_units() -> None:
    assert parse_reserve("0", "u") == 0
    assert parse_reserve("4096", "u") == 4096
    assert parse_reserve("64M", "u") == 64 * 1024**2
    assert parse_reserve("64m", "u") == 64 * 1024**2
    assert parse_reserve("512K", "u") == 512 * 1024
    assert parse_reserve("2G", "u") == 2 * 1024**3
    assert parse_reserve("1.5M", "u") == 3 * 512 * 1024
    assert DEFAULT_RESERVE >= 16 * 1024**2  # covers a full WAL's checkpoint, with margin


@pytest.mark.parametrize("bad", ["", "-1", "-5M", "ten", "5X", "M", "nan", "inf", "1e400", "5MB0"])
def test_a_bad_reserve_is_a_clear_url_error(tmp_path: Path, bad: str) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?reserve={bad}"
    with pytest.raises(InvalidURLError) as info:
        fdbqueue.open(url)
    assert f"reserve={bad!r}" in str(info.value) and "reserve=64M" in str(info.value), info.value
    assert not (tmp_path / "q.db").exists()  # refused before anything was made


def test_below_the_reserve_every_producer_is_refused_and_every_consumer_drains(tmp_path: Path) -> None:
    path = tmp_path / "q.db"
    plain = fdbqueue.open(f"sqlite://{path}")
    fdbqueue.create_queue(plain, "jobs")
    fdbqueue.create_queue(plain, "bounded", max_size=100, overflow="block")
    q, bounded = Queue("jobs"), Queue("bounded")
    q.enqueue_many(plain, [b"m%d" % i for i in range(6)])
    bounded.enqueue(plain, b"b0")
    plain.close()

    db = fdbqueue.open(f"sqlite://{path}?{HUGE}")
    refusals = [
        lambda: q.enqueue(db, b"new"),
        lambda: q.enqueue_many(db, [b"n1", b"n2"]),
        lambda: bounded.enqueue(db, b"new", timeout=5),  # a blocking enqueue: refused, no wait
        lambda: fdbqueue.transactional(lambda tr: q.enqueue(tr, b"in a caller's tr"))(db),
        lambda: fdbqueue.transactional(lambda tr: q.enqueue(tr, b"auto", autonomous=True))(db),
    ]
    for refuse in refusals:
        with pytest.raises(StoreFullError) as info:
            refuse()
        assert isinstance(info.value, StoreError)
        text = str(info.value)
        assert "q.db" in text and "below the reserve" in text and "MB free" in text, text
        assert "reserve=" in text and "nothing was enqueued" in text, text
    assert q.size(db) == 6 and bounded.size(db) == 1  # nothing written

    got = [q.dequeue(db).payload for _ in range(2)]  # type: ignore[union-attr]
    m = q.lease(db, 60)
    assert m is not None
    q.ack(db, m)
    got.append(m.payload)
    m = q.lease(db, 60)
    assert m is not None
    q.nack(db, m, delay=0)  # redelivered below
    m2 = q.lease(db, 60)
    assert m2 is not None and m2.payload == m.payload
    q.release(db, m2)
    while (m3 := q.dequeue(db)) is not None:
        got.append(m3.payload)
    assert sorted(got) == [b"m%d" % i for i in range(6)]  # nothing lost, nothing twice
    q.sweep(db)
    assert fdbqueue.purge_queue(db, "bounded") == 1
    fdbqueue.destroy_queue(db, "bounded")
    db.close()

    # Reopened without the reserve (reserve=0: off), producers work again.
    db = fdbqueue.open(f"sqlite://{path}?reserve=0")
    q.enqueue(db, b"after")
    assert q.dequeue(db).payload == b"after"  # type: ignore[union-attr]
    db.close()
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchall() == [("ok",)]


def test_the_default_reserve_lets_producers_write_where_there_is_room(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs")
    Queue("jobs").enqueue(db, b"x")  # the test machine has more than the default reserve free
    db.close()


def test_other_engines_never_refuse_a_producer() -> None:
    # FoundationDB manages its own space (its ratekeeper throttles before storage runs out);
    # the simulation holds its data in memory.
    db = fdbqueue.open("memory://")
    fdbqueue.create_queue(db, "jobs")
    Queue("jobs").enqueue(db, b"x")
    with pytest.raises(InvalidURLError):
        fdbqueue.open("memory://?reserve=1M")


def test_the_default_spelt_as_the_url_spells_it_is_the_default() -> None:
    from fdbqueue.engines.sqlite.diskroom import DEFAULT_TEXT

    assert parse_reserve(DEFAULT_TEXT, "u") == DEFAULT_RESERVE
