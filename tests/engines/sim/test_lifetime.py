"""A transaction of the sim engine is freed when its last reference goes, as the embedded
engine's is (tests/engines/sqlite/test_lifetime.py).

One in a reference cycle waits for the cyclic collector; and one whose last reference a
finaliser drops during a collection (the fdb bindings' Transaction objects sit in cycles and
destroy their handle when collected: the FoundationDB double then lets go of its sim
transaction) waits for the NEXT collection: garbage that a test running later in the same
process finds (the embedded engine's lifetime test, after tests/contract, found 45 objects).
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest

from fdbqueue.engines.sim.database import SimDatabase


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


def _used(db: SimDatabase) -> Any:
    """A transaction that read, wrote, read its own writes back (the write map's hook) and
    stays open."""
    tr = db.create_transaction()
    assert tr.get(b"a") is None
    tr[b"a"] = b"1"
    tr.add(b"n", (1).to_bytes(8, "little"))
    assert [kv.key for kv in tr.get_range(b"", b"\xff")] == [b"a", b"n"]
    return tr


def test_a_sim_transaction_is_freed_without_the_cyclic_collector(no_collector: None) -> None:
    db = SimDatabase()
    committed, dropped = _used(db), _used(db)
    committed.commit()
    refs = [weakref.ref(committed), weakref.ref(dropped)]
    del committed, dropped
    assert [r() for r in refs] == [None, None]  # freed by their reference counts alone


class _Handle:
    """What a bindings' Transaction is to the double: in a cycle, and its finaliser lets go of
    the engine's transaction, which a registry (the double's table of handles) holds."""

    def __init__(self, registry: dict[int, Any], tr: Any) -> None:
        self.registry, self.key, self.me = registry, id(tr), self
        registry[self.key] = tr

    def __del__(self) -> None:
        self.registry.pop(self.key, None)


def test_a_sim_transaction_let_go_by_a_finaliser_leaves_nothing_for_the_next_collection(
    no_collector: None,
) -> None:
    db = SimDatabase()
    registry: dict[int, Any] = {}
    _Handle(registry, _used(db))
    assert registry
    gc.collect()  # the handle's finaliser runs: the registry lets go of the transaction
    assert not registry
    assert gc.collect() == 0
