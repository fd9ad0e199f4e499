"""engines.base.retry: the one retry loop under run_transaction, run_once and the layer's loops.

On the sim engine with scripted commit outcomes (fdbqueue.testing.FaultScript): a conflict
(1020) and a too-old read version (1007) are retried; what is not retryable is raised; a commit
that may have landed followed by a failure that ends the loop is a CommitUnknownError when the
caller asks for it; ``Again`` commits and goes on in a reset transaction; ``Done`` ends without
a commit; an ``on_error`` hook can retry, raise, or end the loop with a value.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

import fdbqueue
from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import RAISE, RETRY, Again, Attempt, Done, Transaction, retry
from fdbqueue.engines.sim.database import SimDatabase, SimTransaction
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import CommitUnknownError, EngineError, QueueError
from fdbqueue.ops.contention import BATCH, fulfil
from fdbqueue.ops.steps import refused
from fdbqueue.ops.txn import run_once
from fdbqueue.ops.waiting import watch_queue
from fdbqueue.store.clock import db_now
from fdbqueue.testing import FaultScript


@pytest.fixture
def db() -> Iterator[SimDatabase]:
    database = fdbqueue.open("sim://?seed=1")
    assert isinstance(database, SimDatabase)
    yield database
    database.close()


def read(db: SimDatabase, key: bytes) -> bytes | None:
    return run_transaction(db, lambda tr: tr.get(key))


class Steps:
    """A step that reads serializably (so that a 1020 can be given) and writes one key."""

    def __init__(self, key: bytes = b"k") -> None:
        self.key = key
        self.seen: list[tuple[int, bool, int]] = []  # (tries, unknown, conflicts) at each call
        self.ends: list[int | None] = []  # how each attempt's transaction ended (on_finish)

    def __call__(self, tr: Transaction, attempt: Attempt) -> Any:
        self.seen.append((attempt.tries, attempt.unknown, attempt.conflicts))
        tr.on_finish(lambda e: self.ends.append(None if e is None else e.code))
        tr.get(b"guard")
        tr.set(self.key, str(len(self.seen)).encode())
        return len(self.seen)


def test_a_conflict_and_a_too_old_read_version_are_retried(db: SimDatabase) -> None:
    step = Steps()
    with FaultScript(db) as script:
        script.arm([1020, 1007, None])
        assert retry(db, step) == 3
        assert script.fired == [1020, 1007, None]
    assert step.seen == [(0, False, 0), (1, False, 1), (2, False, 1)]
    assert step.ends == [1020, 1007, None]
    assert read(db, b"k") == b"3"  # the third attempt's write, the only one that landed


def test_an_error_that_is_not_retryable_is_raised_and_the_transaction_cancelled(db: SimDatabase) -> None:
    calls: list[int | None] = []

    def step(tr: Transaction, attempt: Attempt) -> None:
        tr.on_finish(lambda e: calls.append(None if e is None else e.code))
        tr.set(b"k", b"v")
        raise EngineError(2101, "too large")

    with pytest.raises(EngineError) as err:
        retry(db, step)
    assert type(err.value) is EngineError and err.value.code == 2101
    assert calls == [2101]  # one attempt: on_error ended it with the error, nothing retried
    assert read(db, b"k") is None


def test_an_unknown_outcome_then_a_failure_is_commit_unknown_when_asked(db: SimDatabase) -> None:
    step = Steps()
    with FaultScript(db) as script:
        # The first commit lands but reports 1021; the retry's commit times out (1031, not
        # retryable): whether the operation happened can no longer be learnt.
        script.arm([("1021", True), ("1031", False)])
        with pytest.raises(CommitUnknownError) as err:
            retry(db, step, unknown_outcome=True)
    assert "1031" in str(err.value) and isinstance(err.value.__cause__, EngineError)
    assert step.seen == [(0, False, 0), (1, True, 0)]  # the retry was told to check first
    assert read(db, b"k") == b"1"


def test_an_unknown_outcome_is_raised_bare_unless_asked(db: SimDatabase) -> None:
    for unknown_outcome in (False, lambda attempt: False):
        with FaultScript(db) as script:
            script.arm([("1021", True), ("1031", False)])
            with pytest.raises(EngineError) as err:
                retry(db, Steps(), unknown_outcome=unknown_outcome)
        assert type(err.value) is EngineError and err.value.code == 1031


def test_a_failure_without_an_earlier_unknown_commit_is_not_commit_unknown(db: SimDatabase) -> None:
    def step(tr: Transaction, attempt: Attempt) -> None:
        tr.set(b"k", b"v")
        raise EngineError(2101, "too large")

    with pytest.raises(EngineError) as err:
        retry(db, step, unknown_outcome=True)
    assert type(err.value) is EngineError and err.value.code == 2101


def test_again_commits_resets_and_keeps_only_what_committed(db: SimDatabase) -> None:
    done: list[int] = []  # the parts whose transaction committed, through Again's `then`
    seen: list[tuple[int, bytes | None]] = []
    attempts: list[Attempt] = []

    def step(tr: Transaction, attempt: Attempt) -> int | Again:
        attempts.append(attempt)
        assert len(attempts) < 10, "the loop does not move on"
        part = len(done)
        seen.append((part, tr.get(b"part")))  # the reset transaction sees the last commit
        tr.set(b"part", str(part).encode())
        tr.set(b"part%d" % part, b"x")
        if part < 2:
            return Again(lambda: done.append(part))
        return part

    with FaultScript(db) as script:
        script.arm([None, 1020, None, None])
        assert retry(db, step) == 2
    assert done == [0, 1]
    assert seen == [(0, None), (1, b"0"), (1, b"0"), (2, b"1")]
    assert len({id(a) for a in attempts}) == 1 and attempts[0].conflicts == 1  # one operation
    assert [read(db, b"part%d" % i) for i in range(3)] == [b"x", b"x", b"x"]


def test_done_ends_without_a_commit(db: SimDatabase) -> None:
    ends: list[int | None] = []

    def step(tr: Transaction, attempt: Attempt) -> Done[str]:
        tr.on_finish(lambda e: ends.append(None if e is None else e.code))
        tr.set(b"k", b"v")
        return Done("nothing to do")

    assert retry(db, step) == "nothing to do"
    assert ends == [1025]  # cancelled, not committed
    assert read(db, b"k") is None


def test_an_on_error_hook_can_end_the_loop_with_a_value(db: SimDatabase) -> None:
    step = Steps()
    hooked: list[tuple[int, int]] = []

    def hook(exc: EngineError, attempt: Attempt) -> Any:
        hooked.append((exc.code, attempt.conflicts))  # the counters already include exc
        return "gave up" if exc.code == 1020 else RETRY

    with FaultScript(db) as script:
        script.arm([1007, 1020])
        assert retry(db, step, on_error=hook) == "gave up"
    assert hooked == [(1007, 0), (1020, 1)]
    assert len(step.seen) == 2 and step.ends == [1007, 1020]
    assert read(db, b"k") is None


def test_an_on_error_hook_can_raise_a_retryable_error_as_it_is(db: SimDatabase) -> None:
    step = Steps()
    with FaultScript(db) as script:
        script.arm([1020])
        with pytest.raises(EngineError) as err:
            retry(db, step, on_error=lambda exc, attempt: RAISE)
    assert err.value.code == 1020 and len(step.seen) == 1


def test_run_once_tells_the_body_of_an_earlier_unknown_commit(db: SimDatabase) -> None:
    told: list[bool] = []

    def body(tr: Transaction, maybe_committed: bool) -> None:
        told.append(maybe_committed)
        tr.set(b"k", b"v")

    with FaultScript(db) as script:
        script.arm([("1021", False), ("1031", False)])
        with pytest.raises(CommitUnknownError):
            run_once(db, body)
    assert told == [False, True]


def test_the_loop_needs_a_database(db: SimDatabase) -> None:
    tr = db.create_transaction()
    with pytest.raises(QueueError, match="retry needs a Database"):
        retry(tr, lambda t, a: None)  # type: ignore[arg-type]
    with pytest.raises(QueueError, match="run_transaction needs a Database"):
        run_transaction(tr, lambda t: None)  # type: ignore[arg-type]
    tr.cancel()


# The layer's own loops on retry keep what they did: contention.fulfil pairs a batch per
# transaction, counts only the batches that committed, and stops at a conflict (another
# waiter paired those requests) instead of retrying; waiting.watch_queue answers a refused
# watch (1032) rather than raising it.


def _waiting(db: SimDatabase, n: int) -> Queue:
    q = Queue("jobs")

    def fill(tr: Transaction) -> None:
        q.enqueue_many(tr, [b"m%d" % i for i in range(n)])
        now = db_now(tr)
        for i in range(n):
            tr.set(q.keys.pop_key(now, b"req%05d" % i), b"")  # a staged dequeue's request

    run_transaction(db, fill)
    return q


def _requests(db: SimDatabase, q: Queue) -> int:
    return len(run_transaction(db, lambda tr: tr.get_range(*q.keys.pop_range())))


def test_fulfil_counts_the_pairs_of_every_committed_batch(db: SimDatabase) -> None:
    q = _waiting(db, BATCH + 50)
    assert fulfil(db, q.keys) == BATCH + 50  # two transactions: a full batch, then the rest
    assert _requests(db, q) == 0


def test_fulfil_stops_at_a_conflict_with_what_it_made(db: SimDatabase) -> None:
    q = _waiting(db, BATCH + 50)
    with FaultScript(db) as script:
        script.arm([None, 1020])  # the first batch commits, the second conflicts
        assert fulfil(db, q.keys) == BATCH
    assert _requests(db, q) == 50  # not retried: another waiter's fulfil pairs those
    with FaultScript(db) as script:
        script.arm([1020])
        assert fulfil(db, q.keys) == 0
    assert _requests(db, q) == 50


def test_watch_queue_turns_a_watch_refused_when_made_into_a_refused_watch(
    db: SimDatabase, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The sim fails a watch past its limit when waited on; an engine may refuse it when made
    # (the error then comes from ``watch`` or the commit), which watch_queue must not raise.
    q = Queue("jobs")
    q.enqueue(db, b"x")
    q.dequeue(db)
    made: list[int] = []

    def refuse(self: SimTransaction, key: bytes) -> Any:
        made.append(1)
        raise EngineError(1032, "too many outstanding watches")

    monkeypatch.setattr(SimTransaction, "watch", refuse)
    w = watch_queue(db, q.keys)
    assert refused(w) and made == [1]  # not retried: a refused watch is an answer
    monkeypatch.undo()
    w = watch_queue(db, q.keys)
    assert not refused(w) and not w.is_ready()
    w.cancel()
