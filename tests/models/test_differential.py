"""Differential test (the binding tester's idea): one random operation stream, every engine.

Hypothesis draws transactions of random reads, writes, atomic ops and selectors; the
stream runs on the sim engine and on the embedded engine, and every result (value,
range, resolved key, error code) and the final contents must be identical.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fdbqueue
from fdbqueue import EngineError, KeySelector

KEYS = st.sampled_from([b"", b"a", b"a\x00", b"ab", b"b", b"ba", b"c", b"q/1", b"q/2", b"z"])
VALUES = st.binary(max_size=6)
SELECTOR = st.builds(KeySelector, KEYS.filter(bool), st.booleans(), st.integers(min_value=-3, max_value=3))
ATOMIC = st.sampled_from(["add", "max", "min", "byte_max", "byte_min", "bit_xor", "compare_and_clear"])

OPS = st.one_of(
    st.tuples(st.just("set"), KEYS.filter(bool), VALUES),
    st.tuples(st.just("clear"), KEYS.filter(bool)),
    st.tuples(st.just("clear_range"), KEYS.filter(bool), KEYS),
    st.tuples(st.just("get"), KEYS.filter(bool), st.booleans()),
    st.tuples(st.just("range"), KEYS, KEYS, st.integers(0, 4), st.booleans(), st.booleans()),
    st.tuples(st.just("sel_range"), SELECTOR, SELECTOR, st.integers(0, 4)),
    st.tuples(st.just("get_key"), SELECTOR),
    st.tuples(st.just("atomic"), ATOMIC, KEYS.filter(bool), st.binary(min_size=1, max_size=3)),
    # 8-byte adds (the layer's counters): the embedded engine merges them until a read needs them
    st.tuples(
        st.just("atomic"),
        st.just("add"),
        KEYS.filter(bool),
        st.integers(-(2**63), 2**63 - 1).map(lambda n: n.to_bytes(8, "little", signed=True)),
    ),
)
TRANSACTIONS = st.lists(
    st.tuples(st.lists(OPS, max_size=8), st.sampled_from(["commit", "commit", "cancel"])),
    min_size=1,
    max_size=12,
)


def run_op(tr: Any, op: tuple[Any, ...]) -> Any:
    kind = op[0]
    try:
        if kind == "set":
            tr[op[1]] = op[2]
        elif kind == "clear":
            del tr[op[1]]
        elif kind == "clear_range":
            tr.clear_range(op[1], op[2])
        elif kind == "get":
            return (tr.snapshot if op[2] else tr).get(op[1])
        elif kind == "range":
            view = tr.snapshot if op[5] else tr
            return [tuple(kv) for kv in view.get_range(op[1], op[2], op[3], op[4])]
        elif kind == "sel_range":
            return [tuple(kv) for kv in tr.get_range(op[1], op[2], op[3])]
        elif kind == "get_key":
            return tr.get_key(op[1])
        elif kind == "atomic":
            getattr(tr, op[1])(op[2], op[3])
        return None
    except EngineError as exc:
        return ("error", exc.code)


def run_stream(url: str, stream: list[tuple[list[tuple[Any, ...]], str]]) -> list[Any]:
    db = fdbqueue.open(url)
    try:
        results: list[Any] = []
        for ops, end in stream:
            tr = db.create_transaction()
            results.append([run_op(tr, op) for op in ops])
            if end == "commit":
                try:
                    tr.commit()
                    results.append("committed")
                except EngineError as exc:
                    results.append(("commit error", exc.code))
                    tr.cancel()
            else:
                tr.cancel()
        results.append([tuple(kv) for kv in db.get_range(b"", b"\xff")])  # type: ignore[attr-defined]
        return results
    finally:
        db.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(TRANSACTIONS)
def test_sim_and_sqlite_agree(stream: list[tuple[list[tuple[Any, ...]], str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        sqlite_url = f"sqlite://{Path(tmp) / 'diff.db'}?sync=normal"
        expected = run_stream("memory://", stream)
        assert run_stream(sqlite_url, stream) == expected
