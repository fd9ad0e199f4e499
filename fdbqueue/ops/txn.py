"""Running layer operations: in the caller's transaction, or in one of their own."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from fdbqueue.engines.contract import Database, Transaction, adopt, is_transaction, retry_loop
from fdbqueue.errors import QueueError

__all__ = ["as_database", "run_once"]

T = TypeVar("T")


def run_once(tr: Transaction | Database, body: Callable[[Transaction, bool], T]) -> T:
    """Run ``body(tr, maybe_committed_before)`` in the caller's or its own retried transaction.

    ``maybe_committed_before`` is True on an attempt that follows a commit_unknown_result:
    the body then checks whether its earlier attempt committed (ids made outside the loop).
    A commit that may have landed but cannot be retried raises :class:`CommitUnknownError`
    (see :func:`fdbqueue.errors.unknown_outcome`), never the bare error: the caller must not take it for a
    failure and do it again.
    """
    tr = adopt(tr)  # a raw fdb.Database is wrapped, a raw fdb.Transaction joined
    if is_transaction(tr):
        return body(tr, False)  # type: ignore[arg-type]
    # Adopted and checked above: the loop itself, without retry's second look at ``tr``.
    return retry_loop(tr, lambda t, attempt: body(t, attempt.unknown), None, True)  # type: ignore[arg-type]


def as_database(tr: object) -> Database:
    db = adopt(tr)
    if is_transaction(db):
        raise QueueError(f"this operation needs a Database, not a transaction ({type(tr).__name__})")
    return db  # type: ignore[return-value]
