"""The read-your-writes overlay (fdbqueue/engines/local/writemap.py) against a dict model.

Random sets, clears, range clears, then every kind of read - get, range reads forward and
reverse with limits, key selectors - must answer as a plain dict holding the snapshot with
the writes applied in order does.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fdbqueue
from fdbqueue.engines.contract import ATOMIC_OPS, SYSTEM_KEYS, KeySelector, KeyValue
from fdbqueue.engines.local.writemap import WriteMap

keys = st.binary(min_size=0, max_size=3).map(lambda b: bytes(x % 4 for x in b))  # few, colliding keys
values = st.binary(min_size=0, max_size=2)
writes = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values),
        st.tuples(st.just("clear"), keys, st.just(b"")),
        st.tuples(st.just("clear_range"), keys, keys),
    ),
    max_size=25,
)
reads = st.lists(
    st.one_of(
        st.tuples(st.just("get"), keys, keys, st.just(0), st.just(False)),
        st.tuples(st.just("range"), keys, keys, st.integers(0, 5), st.booleans()),
        st.tuples(st.just("selector"), keys, keys, st.integers(-4, 4), st.booleans()),
    ),
    max_size=15,
)


def _model_range(model: dict[bytes, bytes], b: bytes, e: bytes, limit: int, reverse: bool) -> list[KeyValue]:
    out = [KeyValue(k, model[k]) for k in sorted(model) if b <= k < e]
    if reverse:
        out.reverse()
    return out[:limit] if limit else out


def _model_selector(model: dict[bytes, bytes], sel: KeySelector) -> bytes:
    ks = sorted(model)
    key, or_equal, offset = sel
    # FoundationDB's rule: the last key < anchor (<= with or_equal), then move offset keys.
    i = bisect_left(ks, key + b"\x00" if or_equal else key) - 1 + offset
    if i < 0:
        return b""
    return ks[i] if i < len(ks) else SYSTEM_KEYS


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(keys, values, max_size=12), writes, reads)
def test_overlay_reads_as_the_model(snapshot: dict[bytes, bytes], ops: list, queries: list) -> None:  # type: ignore[type-arg]
    calls = []

    def base(b: bytes, e: bytes, limit: int, reverse: bool) -> list[KeyValue]:
        calls.append((b, e, limit, reverse))
        return _model_range(snapshot, b, e, limit, reverse)

    wm = WriteMap()
    model = dict(snapshot)
    for op, a, b in ops:
        if op == "set":
            wm.set(a, b)
            model[a] = b
        elif op == "clear":
            wm.set(a, None)
            model.pop(a, None)
        elif a <= b:
            wm.clear_range(a, b)
            for k in [k for k in model if a <= k < b]:
                del model[k]
    for kind, a, b, n, flag in queries:
        if kind == "get":
            decided, value = wm.get(a)
            assert (value if decided else snapshot.get(a)) == model.get(a)
        elif kind == "range":
            assert wm.get_range(base, a, b, n, flag) == _model_range(model, a, b, n, flag), (a, b, n, flag)
        else:
            sel = KeySelector(a, flag, n)
            assert wm.resolve(base, sel) == _model_selector(model, sel), sel
    # Replaying what commit applies - cleared ranges, then values - gives the model.
    applied = dict(snapshot)
    for b, e in wm.cleared_ranges:
        for k in [k for k in applied if b <= k < e]:
            del applied[k]
    for k, v in wm.values.items():
        if v is None:
            applied.pop(k, None)
        else:
            applied[k] = v
    assert applied == model


def test_untouched_ranges_go_straight_to_the_snapshot() -> None:
    wm = WriteMap()
    wm.set(b"m", b"1")
    wm.clear_range(b"x", b"z")
    assert not wm.touches(b"a", b"m") and not wm.touches(b"n", b"x") and not wm.touches(b"z", b"\xff")
    assert wm.touches(b"a", b"m\x00") and wm.touches(b"y", b"y\x00") and wm.touches(b"w", b"x\x00")


# -- the same, end to end: one transaction on the embedded engine and on the simulation --------

atomic_ops = st.sampled_from(sorted(ATOMIC_OPS))
engine_ops = st.lists(
    st.one_of(
        st.tuples(st.just("set"), keys, values),
        st.tuples(st.just("clear"), keys, st.just(b"")),
        st.tuples(st.just("clear_range"), keys, keys),
        st.tuples(atomic_ops, keys, st.binary(min_size=0, max_size=8)),
        st.tuples(st.just("range"), keys, keys),
        st.tuples(st.just("selector"), keys, st.just(b"")),
    ),
    max_size=30,
)


@pytest.fixture(scope="module")
def two_engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Any]]:
    sqlite_db = fdbqueue.open(f"sqlite://{tmp_path_factory.mktemp('ryw')}/q.db?sync=normal")
    sim_db = fdbqueue.open("memory://")
    yield sqlite_db, sim_db
    sqlite_db.close()
    sim_db.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.dictionaries(keys.map(lambda k: b"p" + k), values, max_size=10), engine_ops, st.data())
def test_read_your_writes_on_sqlite_as_on_the_simulation(
    two_engines: tuple[Any, Any], stored: dict[bytes, bytes], ops: list[tuple[str, bytes, bytes]], data: Any
) -> None:
    seen = []
    for db in two_engines:
        db.clear_range(b"p", b"q")
        for k, v in stored.items():
            db.set(k, v)
        tr = db.create_transaction()
        out: list[object] = []
        for op, a, b in ops:
            a, b = b"p" + a, b"p" + b
            if op == "set":
                tr.set(a, b[1:])
            elif op == "clear":
                tr.clear(a)
            elif op == "clear_range":
                tr.clear_range(min(a, b), max(a, b))
            elif op == "range":
                for limit in (0, 1, 3):
                    for reverse in (False, True):
                        out.append(tr.get_range(min(a, b), max(a, b) + b"\x00", limit, reverse))
                        out.append(tr.snapshot.get_range(min(a, b), max(a, b), limit, reverse))
            elif op == "selector":
                for offset in (-2, 0, 1, 3):
                    for or_equal in (False, True):
                        out.append(tr.get_key(KeySelector(a, or_equal, offset)))
            else:
                getattr(tr, op)(a, b[1:])
                out.append(tr.get(a))
        out.append(tr.get_many([b"p" + bytes([i]) for i in range(4)]))
        out.append(tr.get_range(b"p", b"q"))
        tr.commit()
        out.append(db.get_range(b"p", b"q"))
        seen.append(out)
    assert seen[0] == seen[1]
