"""Task results: kept in the database under ``layout.TaskResultKeys`` with a TTL, written in
the transaction that settles the task (its value with the ack, its failure with the dead
letter), read and waited for on a watch (``Tasks.result``), and swept once past their TTL.

A record is JSON: ``{"s": "pending" | "ok" | "failed", "e": expires (a version), "q": the task's
queue, ...}`` with the value (``"v"``), or the failure's ``"type"`` and ``"text"``. The queue
says who may read it (a principal with the ``browse``, ``enqueue`` or ``dequeue`` right on it:
whoever may defer, run or look at the task; docs/security.md) and, pending, where a task its
worker never settled (a lease that ran out on the last delivery) is found: its error queue.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from fdbqueue.api.admin import queue_config
from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction, Watch
from fdbqueue.errors import (
    NoResultError,
    QueueError,
    QueueNotFoundError,
    TaskArgumentsError,
    TaskFailedError,
    TaskTimeoutError,
)
from fdbqueue.ops.privileges import check_any
from fdbqueue.ops.txn import run_once
from fdbqueue.store.clock import db_now, versions
from fdbqueue.store.layout import QueueKeys, TaskResultKeys
from fdbqueue.types import check_duration

# How long a result is kept: one day, as celery's ``result_expires`` default
# (docs.celeryq.dev, Configuration and defaults, result_expires).
DEFAULT_RESULT_TTL = 86400.0
# A result record is written "pending" at defer; one whose task never settles (its message
# deleted or purged) is forgotten after this long, past any sensible delay.
PENDING_TTL = 30 * 86400.0
MAX_RESULT_BYTES = 90_000  # under FoundationDB's 100,000-byte value limit, with the record's fields


# Who may read a task's outcome: whoever may defer it, run it or look at its queue.
READERS = ("browse", "enqueue", "dequeue")


def _record(state: str, expires: int, **fields: Any) -> bytes:
    return json.dumps({"s": state, "e": expires, **fields}, separators=(",", ":")).encode()


def write_pending(
    t: Transaction, root: tuple[Any, ...], mid: str, queue: str, task: str, delay: float
) -> None:
    """A "pending" result record for ``mid`` (task ``task`` on ``queue``, due in ``delay``
    seconds), unless one is there (a deduplicated defer)."""
    keys = TaskResultKeys(root)
    key = keys.result(mid)
    if t.get(key) is not None:
        return
    expires = db_now(t) + versions(PENDING_TTL + delay)
    t.set(key, _record("pending", expires, q=queue, task=task))
    t.set(keys.expiry(expires, mid), b"")


def encode_value(value: object) -> bytes:
    """A return value as JSON, or TaskArgumentsError when JSON cannot carry it (or it is too
    large to keep)."""
    try:
        raw = json.dumps(value, separators=(",", ":"), allow_nan=False).encode()
    except (TypeError, ValueError, RecursionError) as exc:
        raise TaskArgumentsError(f"the task's return value cannot be kept as JSON: {exc}") from None
    if len(raw) > MAX_RESULT_BYTES:
        raise TaskArgumentsError(
            f"the task's return value is {len(raw)} bytes as JSON, over {MAX_RESULT_BYTES}"
        )
    return raw


def write_result(
    t: Transaction,
    root: tuple[Any, ...],
    mid: str,
    queue: str,
    ttl: float,
    *,
    value: bytes | None = None,
    failure: tuple[str, str] | None = None,
) -> None:
    """Keep the outcome of ``mid`` (a task on ``queue``) for ``ttl`` seconds: its value (JSON
    bytes) or its failure (type, text). Blind writes: no conflict with anything."""
    keys = TaskResultKeys(root)
    expires = db_now(t) + versions(ttl)
    if failure is not None:
        rec = _record("failed", expires, q=queue, type=failure[0], text=failure[1])
    else:
        head = json.dumps({"s": "ok", "e": expires, "q": queue}, separators=(",", ":")).encode()
        rec = head[:-1] + b',"v":' + (value or b"null") + b"}"
    t.set(keys.result(mid), rec)
    t.set(keys.expiry(expires, mid), b"")


def failure_of(reason: str) -> tuple[str, str]:
    """A dead letter's reason (``"Type: text"``, as a worker writes it) as (type, text)."""
    head, sep, rest = reason.partition(": ")
    if sep and head.replace(".", "").replace("_", "").isalnum():
        return head, rest
    return reason, ""


def _read_result(
    t: Transaction, root: tuple[Any, ...], keys: TaskResultKeys, mid: str
) -> dict[str, Any] | None:
    raw = t.get(keys.result(mid))
    if raw is None:
        return None
    rec: dict[str, Any] = json.loads(raw)
    queue = rec.get("q")
    if isinstance(queue, str):  # the task's queue: its rights say who may read what it returned
        check_any(t, QueueKeys.make(queue, root), READERS)
    if rec.get("s") != "pending" and int(rec.get("e", 0)) <= db_now(t):
        return None  # past its TTL: gone, whether or not a sweep has cleared it yet
    return rec


def result(db: Database, root: tuple[Any, ...], mid: str, timeout: float | None) -> Any:
    """See :meth:`TaskRegistry.result`."""
    if not isinstance(mid, str) or not mid:
        raise QueueError(f"a task's message id is a non-empty str, got {mid!r}")
    if timeout is not None:
        timeout = check_duration("timeout", timeout)
    keys = TaskResultKeys(root)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:

        def look(t: Transaction, _: bool) -> tuple[dict[str, Any] | None, Watch | None]:
            # The read and the watch in one transaction: a result written after the read
            # fires it (FoundationDB's developer guide, "Watches").
            rec = _read_result(t, root, keys, mid)
            return rec, (t.watch(keys.result(mid)) if rec is not None and rec["s"] == "pending" else None)

        rec, watch = run_once(db, look)
        if rec is None:
            raise NoResultError(
                f"no result is kept for task {mid}: not a task with store_result=True, never "
                "deferred, or its result outlived its TTL"
            )
        if rec["s"] == "ok":
            return rec.get("v")
        if rec["s"] == "failed":
            raise TaskFailedError(mid, str(rec.get("type", "")), str(rec.get("text", "")))
        left = None if deadline is None else deadline - time.monotonic()
        assert watch is not None
        try:
            fired = watch.wait(left) if left is None or left > 0 else False
        finally:
            watch.cancel()
        if not fired:
            _dead_letter_check(db, root, mid, rec)
            raise TaskTimeoutError(f"task {mid} has no result after {timeout:g} s (still pending)")


def _dead_letter_check(db: Database, root: tuple[Any, ...], mid: str, rec: Mapping[str, Any]) -> None:
    """A pending task whose message reached its error queue with no failure recorded (its
    lease ran out on the last delivery: the worker died): raise its failure from there."""
    name = rec.get("q")
    if not isinstance(name, str):
        return
    try:
        errq = queue_config(db, name, root=root).error_queue_for(name)
        m = Queue(errq, root=root).get(db, mid)
    except (QueueNotFoundError, QueueError):
        return
    if m is not None and m.origin == name:
        raise TaskFailedError(mid, *failure_of(m.reason or "dead-lettered"))


def sweep_results(tr: Transaction | Database, root: tuple[Any, ...], limit: int = 1000) -> int:
    """Clear up to ``limit`` results past their TTL; returns how many. Idempotent."""

    def body(t: Transaction, _: bool) -> int:
        keys = TaskResultKeys(root)
        now = db_now(t)
        n = 0
        begin, end = keys.expired_range(now)
        for kv in t.get_range(begin, end, limit=limit):
            expires, mid = keys.parse_expiry(kv.key)
            raw = t.get(keys.result(mid))
            if raw is not None and int(json.loads(raw).get("e", 0)) <= expires:
                t.clear(keys.result(mid))  # not rewritten since (a pending record's final outcome)
                n += 1
            t.clear(kv.key)
        return n

    return run_once(tr, body)
