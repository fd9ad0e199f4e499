"""A transaction of the embedded engine is freed when its last reference goes.

An operation makes a transaction each time: one that only the cyclic garbage collector could
free (a reference cycle through it) would keep it and all it holds - its write map, its
reads - until the next collection, and make every collection walk them. (The sim engine's
write map still holds a method of its transaction: a cycle, on an engine made for tests.)
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue


@pytest.fixture
def url(tmp_path: Path) -> str:
    return f"sqlite://{tmp_path / 'q.db'}"


@pytest.fixture
def no_collector() -> Iterator[None]:
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_a_committed_transaction_is_freed_without_the_cyclic_collector(url: str, no_collector: None) -> None:
    db = fdbqueue.open(url)
    try:
        tr = db.create_transaction()
        assert tr.snapshot.get_many([b"a", b"b"]) == [None, None]
        assert tr.snapshot.get(b"a") is None
        tr[b"a"] = b"1"
        tr.add(b"n", b"\x01" + b"\x00" * 7)
        tr.commit()
        gone = weakref.ref(tr)
        del tr
        assert gone() is None  # freed by its reference count alone
        snap = db.create_transaction().snapshot  # a view kept alone still reads
        assert snap.get(b"a") == b"1"
        snap._tr.cancel()  # type: ignore[attr-defined]
        del snap
        # Queue operations leave no garbage for the collector either.
        q = fdbqueue.Queue("jobs")
        q.enqueue(db, b"x")
        q.enqueue(db, b"y")
        assert gc.collect() == 0
    finally:
        db.close()
