"""Running layer operations: in the caller's transaction, or in one of their own."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TypeVar

from fdbqueue.engines.base import Database, Transaction, adopt, is_transaction
from fdbqueue.errors import EngineError, QueueError

T = TypeVar("T")


def run_once(tr: Transaction | Database, body: Callable[[Transaction, bool], T]) -> T:
    """Run ``body(tr, maybe_committed_before)`` in the caller's or its own retried transaction.

    ``maybe_committed_before`` is True on an attempt that follows a commit_unknown_result:
    the body then checks whether its earlier attempt committed (ids made outside the loop).
    """
    tr = adopt(tr)  # a raw fdb.Database is wrapped, a raw fdb.Transaction joined
    if is_transaction(tr):
        return body(tr, False)  # type: ignore[arg-type]
    t = tr.create_transaction()  # type: ignore[union-attr]
    unknown = False
    try:
        while True:
            try:
                result = body(t, unknown)
                t.commit()
                return result
            except EngineError as exc:
                unknown = unknown or exc.maybe_committed
                t.on_error(exc)
    except BaseException:
        t.cancel()
        raise


def as_database(tr: object) -> Database:
    db = adopt(tr)
    if is_transaction(db):
        raise QueueError(f"this operation needs a Database, not a transaction ({type(tr).__name__})")
    return db  # type: ignore[return-value]


def seconds(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise QueueError(f"{name} must be a number of seconds, not {value!r}")
    if value < 0:
        raise QueueError(f"{name} must be >= 0, got {value}")
    return float(value)
