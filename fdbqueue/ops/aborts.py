"""Why a caller aborted the transaction that dequeued a message, and whether the engine failed.

A dequeue in a caller's transaction that does not commit counts a failed delivery
(``delivery.count_failed_attempt``, run once that transaction has ended). What it counts is
decided here, apart from the counting: the reason the caller gave before aborting
(:func:`failure_reason`), an abort the caller says is not the message's doing
(:func:`not_counted`), a failure of the engine's (:func:`engine_fault`, which a worker's
handling also asks), and the reason kept when the handler outlived FoundationDB's 5-second
window. Nothing here reads or writes the database: these are notes kept in this process,
by the Message object's identity.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from fdbqueue.errors import EngineError
from fdbqueue.store.record import fit_reason
from fdbqueue.types import Message

# Why a caller is about to abort the transaction that dequeued a message (by the Message
# object's identity, which the abort's callback holds): see failure_reason.
_failure_notes: dict[int, tuple[str, str, float | None, bool]] = {}

# The reason a failed delivery keeps when its transaction outlived the 5-second window: the
# resolver refuses a read version older than MAX_WRITE_TRANSACTION_LIFE_VERSIONS
# (fdbserver/core/ServerKnobs.cpp) with transaction_too_old.
TOO_OLD_REASON = (
    "the handler's transaction outlived FoundationDB's 5-second transaction limit (1007 transaction_too_old)"
)


@contextmanager
def failure_reason(
    msg: Message, reason: str, *, delay: float | None = None, discard: bool = False
) -> Iterator[None]:
    """Within the block, an abort of the caller's transaction that dequeued ``msg`` counts
    the failed delivery with ``reason`` (the message's ``last_error``; the dead letter's
    reason once it reaches max_deliveries), retried after ``delay`` (None: the queue's retry
    delay) or, ``discard``, dead-lettered now. Wrap the abort (``tr.cancel()``) in it."""
    _failure_notes[id(msg)] = (msg.id, fit_reason(reason), delay, discard)
    try:
        yield
    finally:
        _failure_notes.pop(id(msg), None)


def _noted(msg: Message) -> tuple[str, str, float | None, bool] | None:
    """What :func:`failure_reason` noted for ``msg`` (this very Message object), if anything."""
    noted = _failure_notes.get(id(msg))
    return noted if noted is not None and noted[0] == msg.id else None


def _reason_of(msg: Message, error: EngineError) -> str | None:
    noted = _noted(msg)
    if noted is not None:
        return noted[1]
    if error.code == 1007:
        return TOO_OLD_REASON
    if error.code == 1025:
        return None  # a plain abort: the caller did not say why
    return fit_reason(str(error))


@contextmanager
def not_counted(msg: Message) -> Iterator[None]:
    """Within the block, an abort of the caller's transaction that dequeued ``msg`` is not
    counted as a failed delivery: the engine failed (a full disk, an unreachable cluster),
    not the message. Wrap the abort (``tr.cancel()``) in it."""
    _uncounted[id(msg)] = msg.id
    try:
        yield
    finally:
        _uncounted.pop(id(msg), None)


_uncounted: dict[int, str] = {}


def engine_fault(error: EngineError) -> bool:
    """Whether a transaction that ended with ``error`` failed for the engine's reasons.

    4100 is what the engines report when a commit fails without a FoundationDB error (a
    full disk, an I/O error, an unreachable cluster); the retryable codes are contention,
    load or recovery (``fdb_error_predicate``, bindings/c/fdb_c.cpp). 1007 is not among
    them: a handler that outlives the 5-second window is the handler's doing.
    """
    return error.code == 4100 or (error.retryable and error.code != 1007)
