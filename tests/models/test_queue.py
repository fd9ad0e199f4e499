"""The queue against a plain-Python model, on the sim engine with injected faults.

``sim://?seed=<drawn>&faults=0.05``: commits with writes fail with 1020, 1007 or 1021
(applied or not), so every Database call goes through the layer's retry loop and its
exactly-once checks. The model is a list in dequeue order (higher priority first, FIFO
within one); every dequeue must hand out exactly the message the model predicts, so a
lost, duplicated or reordered message fails the run.

Caller transactions (``@fdbqueue.transactional`` bodies) may also run more than once under
faults: they use the idempotent pattern FoundationDB's developer guide recommends
(developer-guide.rst, "Transactions with unknown results": a token made
outside the retry loop, written and checked inside it), and the model follows only the
outcome the committed attempt returned.

The deterministic tests at the end replay, with a scripted fault sequence, the
interleavings a seed finds only rarely.
"""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

import fdbqueue
from fdbqueue import Message, Queue
from fdbqueue.engines.sim.database import SimDatabase
from fdbqueue.testing import FaultScript

PRIORITIES = st.sampled_from([-1, 0, 0, 1, 5])
HEADERS = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"importance": st.sampled_from(["high", "low"])}, optional={"n": st.integers(0, 2)}
    ),
)
WHERE = st.sampled_from([{"importance": "high"}, {"importance": "low"}, {"n": 1}, {"importance": "urgent"}])
JSON_VALUES = st.one_of(st.none(), st.booleans(), st.integers(-(2**40), 2**40), st.text(max_size=5))
JSON_PAYLOADS = st.one_of(
    st.integers(),
    st.lists(JSON_VALUES, max_size=3),
    st.dictionaries(
        st.sampled_from(["a", "b", "ü"]), JSON_VALUES | st.lists(JSON_VALUES, max_size=2), max_size=3
    ),
)
SMALL_PAYLOADS = st.one_of(
    st.tuples(st.just("bytes"), st.binary(max_size=24)),
    st.tuples(st.just("text"), st.text(max_size=12)),
    st.tuples(st.just("json"), JSON_PAYLOADS),
)
PAYLOADS = st.one_of(
    SMALL_PAYLOADS,
    # larger than CHUNK_SIZE: stored in chunks, removed with the message
    st.tuples(st.just("big"), st.integers(0, 255)),
)
_MISSING = object()


class Abort(Exception):
    """The application aborts its transaction."""


def _payload(spec: tuple[str, Any]) -> object:
    kind, value = spec
    if kind == "big":
        return bytes([value]) * 25_000
    return value


class Entry:
    __slots__ = ("aborts", "headers", "id", "kind", "payload", "priority", "seq", "slack")

    def __init__(self, mid: str, spec: tuple[str, Any], priority: int, headers: Any, seq: int) -> None:
        self.id = mid
        self.kind, self.payload = spec[0], _payload(spec)
        self.priority = priority
        self.headers = dict(headers or {})
        self.seq = seq
        self.aborts = 0  # caller transactions that dequeued it and aborted: failed deliveries
        self.slack = 0  # caller attempts that took it and failed with a 1007

    def check(self, m: Message | None, what: str, *, delivered: bool = False) -> None:
        assert m is not None, f"{what}: expected message {self.id}, got None"
        assert m.id == self.id, f"{what}: expected message {self.id} (priority {self.priority}), got {m.id}"
        assert m.priority == self.priority
        # Every aborted in-transaction dequeue counts one failed delivery, exactly once. An
        # attempt that the engine failed with 1007 counts too (deliberately: a message whose
        # processing outlasts the 5 s window is poison), but the fault injected here is not
        # the body's, so the model allows it as slack; a conflict (1020) or an unknown result
        # (1021) never counts (delivery.count_failed_attempt). Delivered: counts this one.
        low = self.aborts + delivered
        assert low <= m.deliveries <= low + self.slack, (
            f"{what}: message {self.id} has deliveries={m.deliveries}, expected "
            f"{low}{f' to {low + self.slack}' if self.slack else ''} ({self.aborts} aborted "
            f"in-transaction dequeues{', this delivery' if delivered else ''})"
        )
        assert dict(m.headers) == self.headers
        if self.kind in ("bytes", "big"):
            assert m.payload == self.payload
        elif self.kind == "text":
            assert m.text() == self.payload
        else:
            assert m.json() == json.loads(json.dumps(self.payload))


class QueueModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.db: SimDatabase | None = None
        self.q = Queue("model")
        self.model: list[Entry] = []  # dequeue order
        self.seq = 0
        self.issued: set[str] = set()  # every id any enqueue returned
        self.consumed: set[str] = set()

    # -- model helpers ------------------------------------------------------------------------

    def _add(self, mid: str, spec: tuple[str, Any], priority: int, headers: Any) -> None:
        assert isinstance(mid, str) and mid not in self.issued, f"enqueue returned a used id {mid!r}"
        self.issued.add(mid)
        self.seq += 1
        self.model.append(Entry(mid, spec, priority, headers, self.seq))
        self.model.sort(key=lambda e: (-e.priority, e.seq))

    def _take(self, index: int, m: Message | None, what: str) -> None:
        e = self.model.pop(index)
        e.check(m, what, delivered=True)
        self.consumed.add(e.id)

    def _find(self, where: dict[str, Any], fallback: bool) -> int | None:
        for i, e in enumerate(self.model):
            if all(e.headers.get(k, _MISSING) == v for k, v in where.items()):
                return i
        return 0 if fallback and self.model else None

    def _once(self, body: Any, fail: bool) -> tuple[bool, Any, int]:
        """Run ``body(tr)`` in a caller transaction that is idempotent across retries.

        Returns (replayed, result, engine_failures): replayed when an attempt that ended
        in 1021 had in fact committed, and result is then what that attempt recorded
        under its token; engine_failures counts attempts that ended in an engine error
        the layer counts as a failed delivery: neither a conflict (1020), nor an unknown
        result (1021), nor the application's own abort (1025).
        """
        token = b"app/tok/" + uuid.uuid4().hex.encode()
        ended: list[Any] = []

        @fdbqueue.transactional
        def run(tr: Any) -> tuple[bool, Any]:
            tr.on_finish(ended.append)
            done = tr.get(token)
            if done is not None:
                return True, done.decode()
            result = body(tr)
            tr.set(token, (result if isinstance(result, str) else getattr(result, "id", "")).encode())
            if fail:
                raise Abort
            return False, result

        if fail:
            with pytest.raises(Abort):
                run(self.db)
            assert self.db is not None and self.db.get(token) is None  # the abort left no trace
            replayed, result = False, None
        else:
            replayed, result = run(self.db)
        failures = sum(
            1 for e in ended if e is not None and e.code not in (1020, 1025) and not e.maybe_committed
        )
        if failures:
            event("caller transaction: an attempt failed with 1007")
        return replayed, result, failures

    # -- rules --------------------------------------------------------------------------------

    @initialize(seed=st.integers(0, 2**32 - 1))
    def open_db(self, seed: int) -> None:
        db = fdbqueue.open(f"sim://?seed={seed}&faults=0.05")
        assert isinstance(db, SimDatabase)
        self.db = db
        # Aborted in-transaction dequeues count as failed deliveries; this model of the core
        # queue keeps them below max_deliveries (poison handling: tests/models/test_delivery.py).
        fdbqueue.create_queue(db, "model", max_deliveries=1_000_000)

    @rule(spec=PAYLOADS, priority=PRIORITIES, headers=HEADERS)
    def enqueue(self, spec: tuple[str, Any], priority: int, headers: Any) -> None:
        mid = self.q.enqueue(self.db, _payload(spec), priority=priority, headers=headers)
        self._add(mid, spec, priority, headers)

    @rule(specs=st.lists(SMALL_PAYLOADS, max_size=6), priority=PRIORITIES, headers=HEADERS)
    def enqueue_many(self, specs: list[tuple[str, Any]], priority: int, headers: Any) -> None:
        ids = self.q.enqueue_many(self.db, [_payload(s) for s in specs], priority=priority, headers=headers)
        assert len(ids) == len(specs)
        for mid, spec in zip(ids, specs, strict=False):
            self._add(mid, spec, priority, headers)

    @rule(spec=PAYLOADS, priority=PRIORITIES, headers=HEADERS, fail=st.booleans())
    def enqueue_in_transaction(self, spec: tuple[str, Any], priority: int, headers: Any, fail: bool) -> None:
        replayed, mid, _ = self._once(
            lambda tr: self.q.enqueue(tr, _payload(spec), priority=priority, headers=headers), fail
        )
        if not fail:
            self._add(mid, spec, priority, headers)
        if replayed:
            event("caller transaction: a 1021 attempt had committed")

    @rule()
    def dequeue(self) -> None:
        m = self.q.dequeue(self.db)
        if not self.model:
            assert m is None, f"dequeue of an empty queue returned {m}"
        else:
            self._take(0, m, "dequeue(db)")

    @rule(fail=st.booleans())
    def dequeue_in_transaction(self, fail: bool) -> None:
        replayed, got, failures = self._once(lambda tr: self.q.dequeue(tr), fail)
        if self.model:
            head = self.model[0]  # what every attempt took
            head.slack += failures
            if fail:
                head.aborts += 1  # back in its place, one failed delivery counted
                event("caller transaction aborted after a dequeue")
                return
        if fail:
            return
        if not self.model:
            assert got in (None, ""), f"dequeue of an empty queue returned {got}"
        elif replayed:
            event("caller transaction: a 1021 attempt had committed")
            assert got == self.model[0].id, "the committed attempt took another message than the head"
            self.consumed.add(self.model.pop(0).id)
        else:
            self._take(0, got, "dequeue(tr)")

    @rule(where=WHERE, fallback=st.booleans())
    def dequeue_where(self, where: dict[str, Any], fallback: bool) -> None:
        m = self.q.dequeue(self.db, where=where, fallback=fallback)
        i = self._find(where, fallback)
        if i is None:
            assert m is None, f"dequeue(where={where}, fallback={fallback}) returned {m}, expected None"
        else:
            self._take(i, m, f"dequeue(where={where}, fallback={fallback})")

    # Reads are grouped in two rules so that most steps write (and so meet injected faults).

    @rule(
        kind=st.sampled_from(["peek", "nth", "browse", "empty"]),
        k=st.integers(0, 12),
        batch=st.integers(1, 7),
    )
    def examine(self, kind: str, k: int, batch: int) -> None:
        if kind == "peek":
            m = self.q.peek(self.db)
            if self.model:
                self.model[0].check(m, "peek")
            else:
                assert m is None
        elif kind == "nth":
            m = self.q.nth(self.db, k)
            if k < len(self.model):
                self.model[k].check(m, f"nth({k})")
            else:
                assert m is None
        elif kind == "browse":
            got = list(self.q.browse(self.db, batch=batch))
            assert [m.id for m in got] == [e.id for e in self.model]
            for e, m in zip(self.model, got, strict=False):
                e.check(m, "browse")
        else:
            assert self.q.empty(self.db) == (not self.model)

    @rule(data=st.data())
    def get_by_id(self, data: st.DataObject) -> None:
        kinds = ["unknown"] + ["queued"] * bool(self.model) + ["consumed"] * bool(self.consumed)
        kind = data.draw(st.sampled_from(kinds))
        if kind == "queued":
            e = data.draw(st.sampled_from(self.model))
            e.check(self.q.get(self.db, e.id), "get(queued id)")
        elif kind == "consumed":
            mid = data.draw(st.sampled_from(sorted(self.consumed)))
            assert self.q.get(self.db, mid) is None, f"consumed message {mid} is still there"
        else:
            assert self.q.get(self.db, uuid.uuid4().hex) is None

    # -- invariants -----------------------------------------------------------------------------

    @invariant()
    def size_matches(self) -> None:
        if self.db is not None:
            assert self.q.size(self.db) == len(self.model)

    def teardown(self) -> None:
        if self.db is None:
            return
        faults = sum(self.db.stats.faults.values())
        event(f"faults injected: {'0' if not faults else '1-4' if faults < 5 else '5+'}")
        c = self.db.stats.commits
        event(f"commits: {'<10' if c < 10 else '10-39' if c < 40 else '40+'}")
        try:
            # Drain: exactly the model's messages, in its order, then nothing.
            while self.model:
                self._take(0, self.q.dequeue(self.db), "final drain")
            assert self.q.dequeue(self.db) is None
            assert self.q.size(self.db) == 0
            # Nothing of a fulfilled staged request or a message's chunks is left behind.
            for tag in ("r", "id", "b", "pop", "res"):
                left = self.db.get_range_startswith(self.q.keys.q.pack((tag,)))
                assert left == [], f"keys left under {tag!r}: {left[:3]}"
        finally:
            self.db.close()


QueueModel.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=80,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
    # No shrinking: the faults a run meets follow from the drawn seed and the count of
    # commits before them, so dropping a step moves every later fault and the shrinker
    # spends minutes on variants that no longer fail. A failure prints its full steps and
    # a @reproduce_failure blob instead.
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    print_blob=True,
)
TestQueueModel = QueueModel.TestCase


def test_faults_are_injected_and_survived() -> None:
    """The URL the model runs on does inject all three faults, and enqueues survive them."""
    db = fdbqueue.open("sim://?seed=11&faults=0.05")
    q = Queue("model")
    ids = [q.enqueue(db, f"m{i}") for i in range(300)]
    assert isinstance(db, SimDatabase)
    assert set(db.stats.faults) == {1020, 1021, 1007}, db.stats.faults
    assert len(set(ids)) == 300 and q.size(db) == 300
    assert [m.id for m in q.browse(db)] == ids


# ---------------------------------------------------------------------------------------------
# Exactly-once across commit_unknown_result, with scripted faults (deterministic).


@pytest.fixture
def scripted() -> Any:
    db = fdbqueue.open("sim://?seed=1")
    assert isinstance(db, SimDatabase)
    yield db, FaultScript(db)
    db.close()


@pytest.mark.parametrize("first", [("1021", True), ("1021", False)], ids=["applied", "not-applied"])
@pytest.mark.parametrize("then", [None, 1020, 1007, ("1021", True), ("1021", False)], ids=str)
def test_enqueue_exactly_once_when_commit_result_is_unknown(scripted: Any, first: Any, then: Any) -> None:
    db, faults = scripted
    q = Queue("jobs")
    w = q.enqueue(db, b"warm-up")  # the queue exists
    faults.arm([first, then])
    a = q.enqueue(db, b"A")
    faults.arm([first, then])
    ids = q.enqueue_many(db, [b"B", b"C"])
    assert [m.id for m in q.browse(db)] == [w, a, *ids]
    assert q.size(db) == 4


@pytest.mark.parametrize("take", [("1021", True), ("1021", False)], ids=["applied", "not-applied"])
@pytest.mark.parametrize("confirm", [None, 1020, 1007, ("1021", True), ("1021", False)], ids=str)
@pytest.mark.parametrize("where", [None, {"k": "v"}], ids=["plain", "where"])
def test_dequeue_exactly_once_when_commit_result_is_unknown(
    scripted: Any, take: Any, confirm: Any, where: Any
) -> None:
    """The take commit ends in 1021; the next commit (which settles it) fails with ``confirm``.

    Whatever happens, the first dequeue returns A and the second B: nothing is lost.
    """
    db, faults = scripted
    q = Queue("jobs")
    a, b = q.enqueue_many(db, [b"A", b"B"], headers={"k": "v"})
    faults.arm([take, confirm])
    first = q.dequeue(db, where=where)
    second = q.dequeue(db, where=where)
    assert (first and first.id, second and second.id) == (a, b), (
        f"took {first and first.payload!r} then {second and second.payload!r}; "
        f"A was {'lost' if q.get(db, a) is None else 'skipped'}"
    )
    assert q.dequeue(db) is None and q.size(db) == 0


@pytest.mark.parametrize("outcome", [None, 1020, 1007, ("1021", True), ("1021", False)], ids=str)
def test_aborted_dequeue_counts_one_delivery_when_the_count_commit_fails(scripted: Any, outcome: Any) -> None:
    """An aborted in-transaction dequeue counts one failed delivery, in a transaction of the
    layer's own; that commit ends in ``outcome`` and is retried: still one count."""
    db, faults = scripted
    q = Queue("jobs")
    a, b = q.enqueue_many(db, [b"A", b"B"])

    @fdbqueue.transactional
    def consume(tr: Any) -> None:
        assert q.dequeue(tr).id == a  # type: ignore[union-attr]
        raise Abort

    faults.arm([outcome])  # the next commit with writes is the layer's count of the failure
    with pytest.raises(Abort):
        consume(db)
    assert faults.pending == []  # the count commit took the scripted outcome
    back = q.peek(db)
    assert back is not None and back.id == a, "the aborted message is not back in its place"
    assert back.deliveries == 1, f"one aborted delivery was counted {back.deliveries} times"
    m = q.dequeue(db)
    assert m is not None and m.id == a and m.deliveries == 2
    assert [x.id for x in q.browse(db)] == [b] and q.size(db) == 1
