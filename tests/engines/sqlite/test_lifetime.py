"""A transaction of the embedded engine is freed when its last reference goes.

An operation makes a transaction each time: one that only the cyclic garbage collector could
free (a reference cycle through it) would keep it and all it holds - its write map, its
reads - until the next collection, and make every collection walk them. (The sim engine's
are freed so too: tests/engines/sim/test_lifetime.py.)
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue.engines.local.transaction import LocalTransaction


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


def test_a_transaction_made_flat_has_the_state_the_shared_half_would_give_it(tmp_path: Path) -> None:
    """``SqliteTransaction`` sets ``LocalTransaction``'s fields itself (one call, not a chain of
    ``super()``): made, and after ``reset``, every field holds what ``LocalTransaction``'s own
    ``__init__`` and ``_clear_state`` would have set - a field added there and not here fails."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        tr = db.create_transaction()

        def state(t: object) -> dict[str, object]:
            out: dict[str, object] = {}
            for cls in type(t).__mro__:
                for name in getattr(cls, "__slots__", ()):
                    if name in ("__dict__", "__weakref__") or name in out:
                        continue
                    value = getattr(t, name, "<unset>")
                    # new objects compare by kind and content (a list, the options' fields)
                    if type(value).__module__.startswith("fdbqueue"):
                        value = (
                            type(value),
                            sorted(getattr(value, "__dict__", {}).items())
                            or [(s, getattr(value, s, None)) for s in getattr(type(value), "__slots__", ())],
                        )
                    out[name] = value
            return out

        made = state(tr)
        # every field set (a field LocalTransaction.__init__ gained and this one did not: unset),
        # but the cursor, which begin sets
        assert [n for n in made if made[n] == "<unset>"] == ["_cur"], made
        LocalTransaction._clear_state(tr)  # type: ignore[arg-type]  # the shared half's own
        assert state(tr) == made
        tr[b"k"] = b"v"
        tr.reset()
        after = state(tr)
        assert after["_started"] is None and after["_state"] == "open" and tr._values == {}  # type: ignore[attr-defined]
        LocalTransaction._clear_state(tr)  # type: ignore[arg-type]
        assert state(tr) == after
        tr.cancel()
    finally:
        db.close()
