"""What a handler may have committed with its message's settlement, in the same transaction:
writes with the ack (a returned :class:`~fdbqueue.ops.settling.AfterAck`) and writes with the
dead letter (the handler's ``on_dead``). Tasks keep their results and chains so
(``fdbqueue.runtime.tasks``)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import AfterAckRefused
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.settling import AfterAck, write_after
from fdbqueue.types import Message

DeadHook = Callable[[Transaction, Message, str], None]


def dead_hook(handler: object) -> DeadHook | None:
    """The handler's ``on_dead(tr, message, reason)``, if it has one: called inside the
    transaction whose nack dead-letters a message it failed on (a task's failure result)."""
    hook = getattr(handler, "on_dead", None)
    return hook if callable(hook) else None


def nack_noting(
    db: Database,
    q: Queue,
    m: Message,
    *,
    reason: str | None,
    delay: float | None = None,
    discard: bool = False,
    on_dead: DeadHook | None = None,
) -> str:
    """Nack the leased ``m``; when that dead-letters it, ``on_dead`` writes in the same
    transaction (exactly once across commit_unknown_result, as :meth:`Queue.nack`)."""
    if on_dead is None:
        return q.nack(db, m, delay=delay, reason=reason, discard=discard)

    def body(t: Transaction) -> str:
        where = q.nack(t, m, delay=delay, reason=reason, discard=discard)
        if where == "dead":
            on_dead(t, m, reason or "max_deliveries")
        return where

    return run_once_confirmed(db, q.keys, body)


def ack_after(
    db: Database, q: Queue, m: Message, after: AfterAck | None, on_dead: DeadHook | None = None
) -> str | None:
    """Ack the leased ``m`` with the writes its handler asked for (:class:`AfterAck`), in one
    transaction, exactly once across commit_unknown_result. Those writes refused
    (:class:`AfterAckRefused`: the next task's queue not the principal's to enqueue on,
    paused...): nothing of that attempt commits, ``m`` is dead-lettered with the reason
    (``on_dead`` in that transaction) and the reason returned; else None."""
    if after is None:
        q.ack(db, m)
        return None

    def body(t: Transaction) -> None:
        q.ack(t, m)
        write_after(t, m, after)

    try:
        run_once_confirmed(db, q.keys, body)
    except AfterAckRefused as exc:
        nack_noting(db, q, m, reason=exc.reason, discard=True, on_dead=on_dead)
        return exc.reason
    return None


def log_refused(log: logging.Logger, q: Queue, m: Message, reason: str) -> None:
    """Log that what ``m``'s handler asked to commit with its ack was refused (a chain into a
    queue not the worker's to enqueue on...), so ``m`` was dead-lettered: the Worker's and the
    AsyncWorker's one line."""
    log.error(
        "message %s on %r dead-lettered: the writes its handler asked for with the ack were refused: %s",
        m.id,
        q.name,
        reason,
        extra={"queue": q.name, "message_id": m.id, "deliveries": m.deliveries},
    )
