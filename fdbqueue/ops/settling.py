"""Batched settlement: ``ack_many`` and ``nack_many`` settle many leased messages in one
transaction, and a lease-mode Worker's :class:`Settler` gathers the acks of finished handlers
for a short linger, so that a batch costs one commit, not one per message.

One name per idea: to *settle* is to end a lease, acking or nacking (here, in batches;
``delivery.ack_in`` / ``delivery.nack_in`` settle one message inside a transaction). Learning
whether an attempt that ended in commit_unknown_result (1021) landed is another idea:
``receipts.run_once_confirmed``, which every settlement given a Database runs in.

A message is settled only when the transaction holding its ack commits: until then it is in
flight under its lease, and a crash between the handler's return and that commit delivers it
again when the lease runs out - lease mode is at-least-once, batched or not (the linger only
widens that window by a few milliseconds). The receipt checks are those of ``ack``: a message
whose lease has gone (expired, or taken back by a sweep) is not acked by a stale holder.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Generic, Protocol, TypeVar

from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import (
    AfterAckRefused,
    ClusterUnavailableError,
    CommitUnknownError,
    EngineError,
    LeaseError,
    QueueError,
    StoreError,
)
from fdbqueue.ops import workindex
from fdbqueue.ops.delivery import ack_many_in, nack_in
from fdbqueue.ops.leasing import lease_batch
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import config_or_create
from fdbqueue.store.entropy import random_bytes
from fdbqueue.store.layout import READY_PARTS, QueueKeys, ready_count
from fdbqueue.store.record import check_reason
from fdbqueue.types import Message, check_duration


class Handle(Protocol):
    """What the settler needs of a worker's queue handle (``Queue``): its keys, and its own
    ``lease_many`` for a lease with no acks to commit beside it."""

    @property
    def keys(self) -> QueueKeys: ...

    def lease_many(self, tr: Database, n: int, lease_seconds: float | None = None, /) -> list[Message]: ...


Q = TypeVar("Q", bound=Handle)
T = TypeVar("T")


class AfterAck:
    """What a lease-mode handler may return to have writes commit in the transaction that acks
    its message (and only if that ack lands): a task's result, the next task of a chain. Plain
    data with a :meth:`write` method, so that it can cross a process boundary."""

    __slots__ = ()

    def write(self, tr: Transaction) -> None:
        """Write, inside ``tr``, what must commit with the ack."""
        raise NotImplementedError


Pending = tuple[Q, Message, AfterAck | None]
DeadHook = Callable[[Transaction, Message, str], None]


def write_after(t: Transaction, m: Message, after: AfterAck) -> None:
    """``after.write(t)``; a refusal (a QueueError that is not the engine failing, which is
    retried or backed off as ever) raises :class:`AfterAckRefused` for ``m``."""
    try:
        after.write(t)
    except (EngineError, StoreError, ClusterUnavailableError, CommitUnknownError):
        raise
    except QueueError as exc:
        raise AfterAckRefused(m.id, f"{type(exc).__name__}: {exc}") from exc


log = logging.getLogger("fdbqueue.runtime.worker")

IDLE_EXIT = 0.2  # seconds the settler's thread waits for acks before it ends (an idle worker)
MAX_BATCH = 1000  # messages one ack_many or nack_many settles at most (a transaction's size)


def _check(keys: QueueKeys, msgs: Sequence[Message]) -> list[Message]:
    out = list(msgs)
    if len(out) > MAX_BATCH:
        raise QueueError(f"at most {MAX_BATCH} messages a call, got {len(out)}")
    for m in out:
        if not isinstance(m, Message) or not m.receipt:
            raise LeaseError("ack_many and nack_many take Messages returned by lease()")
        if m.queue != keys.name:
            raise QueueError(f"message {m.id} is of queue {m.queue!r}, not {keys.name!r}")
    return out


def ack_in_batch(t: Transaction, keys: QueueKeys, msgs: list[Message]) -> list[Message]:
    """Ack ``msgs`` of ``keys``' queue in ``t`` (the receipts and the guard read in one round
    trip); returns those acked, leaving out any whose lease has gone."""
    if not msgs:
        return []
    return ack_many_in(keys, t, msgs, None)  # database time once the records are read


def ack_many(tr: Transaction | Database, keys: QueueKeys, msgs: Sequence[Message]) -> list[Message]:
    """See :meth:`Queue.ack_many`."""
    batch = _check(keys, msgs)
    return run_once_confirmed(tr, keys, lambda t: ack_in_batch(t, keys, batch))


def nack_many(
    tr: Transaction | Database,
    keys: QueueKeys,
    msgs: Sequence[Message],
    *,
    delay: float | None = None,
    reason: str | None = None,
) -> list[str | None]:
    """See :meth:`Queue.nack_many`."""
    batch = _check(keys, msgs)
    if delay is not None:
        delay = check_duration("delay", delay)
    if reason is not None:
        if not isinstance(reason, str):
            raise QueueError("reason must be a str")
        check_reason(reason)

    def body(t: Transaction) -> list[str | None]:
        cfg = config_or_create(t, keys)
        now = db_now(t)
        out: list[str | None] = []
        for m in batch:
            try:
                out.append(nack_in(keys, t, cfg, m, delay, reason, now))
            except LeaseError:
                out.append(None)  # its lease is gone: back in the queue already
        return out

    return run_once_confirmed(tr, keys, body)


class Settler(Generic[Q]):
    """A lease-mode worker's pending acks: a handler that returned adds its message
    (:meth:`add`); they are acked together, in one transaction, ``linger`` seconds after the
    first of them (by this object's thread) or at once when ``batch`` are waiting, or sooner
    with the worker's next lease, in the same transaction (:meth:`take`). ``done(q, acked,
    lost)`` is called after each settlement."""

    def __init__(
        self,
        db: Database,
        linger: float,
        batch: int,
        done: Callable[[Q, int, list[Message]], None],
        on_dead: DeadHook | None = None,
        refused: Callable[[Q, Message, str], None] | None = None,
    ) -> None:
        self.db, self.linger, self.batch, self.done = db, linger, batch, done
        self.on_dead, self.refused = on_dead, refused
        self._refused: dict[str, str] = {}  # message id -> why its AfterAck was refused
        self._pending: list[Pending[Q]] = []
        self._first = 0.0
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self._unsettled = 0  # added, not yet reported settled (or failed)

    def unsettled(self) -> int:
        """Messages handed to :meth:`add` whose settlement has not been reported yet."""
        with self._cond:
            return self._unsettled

    def add(self, q: Q, m: Message, after: AfterAck | None = None) -> None:
        """``m``'s handler returned: ack it with the next batch (``after`` written with the ack)."""
        with self._cond:
            if not self._pending:
                self._first = time.monotonic()
            self._pending.append((q, m, after))
            self._unsettled += 1
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="fdbqueue-settler", daemon=True)
                self._thread.start()
            if len(self._pending) == 1 or len(self._pending) >= self.batch:
                self._cond.notify()  # once a batch: a thread switch a message would cost more

    def take(self) -> list[Pending[Q]]:
        """The pending acks, handed to the caller to commit with its next lease."""
        with self._cond:
            got, self._pending = self._pending, []
            return got

    def settle(self, t: Transaction, got: list[Pending[Q]]) -> list[Any]:
        """Ack ``got`` in ``t``, with the writes each acked message's handler asked for; what
        :meth:`report` needs once ``t`` commits. A message whose writes were refused at an
        earlier attempt (:class:`AfterAckRefused`, see :meth:`confirmed`) is dead-lettered
        in ``t`` instead, with the handler's ``on_dead``."""
        out: list[Any] = []
        refused = [(q, m) for q, m, _ in got if m.id in self._refused]
        rest = [p for p in got if p[1].id not in self._refused] if refused else got
        for q, msgs in _by_queue(rest).items():
            acked = ack_in_batch(t, q.keys, msgs)
            out.append((q, msgs, acked, []))
        afters = {m.id: after for _, m, after in rest if after is not None}
        if afters:  # only for messages whose ack is in this transaction: a lost lease writes nothing
            for _, _, acked, _ in out:
                for m in acked:
                    after = afters.get(m.id)
                    if after is not None:
                        write_after(t, m, after)
        now = db_now(t) if refused else 0
        for q, m in refused:
            reason = self._refused[m.id]
            try:
                nack_in(q.keys, t, config_or_create(t, q.keys), m, None, reason, now, True)
            except LeaseError:
                out.append((q, [m], [], []))  # its lease is gone: back in the queue already
                continue
            if self.on_dead is not None:
                self.on_dead(t, m, reason)
            out.append((q, [m], [], [(m, reason)]))
        return out

    def confirmed(self, keys: QueueKeys, body: Callable[[Transaction], T]) -> T:
        """``run_once_confirmed(self.db, keys, body)``, where ``body`` settles: an attempt whose
        AfterAck was refused is abandoned (nothing of it commits) and run again with that
        message dead-lettered rather than acked (each message refused once at most)."""
        while True:
            try:
                return run_once_confirmed(self.db, keys, body)
            except AfterAckRefused as exc:
                if exc.message_id in self._refused:
                    raise QueueError(f"message {exc.message_id} refused twice: {exc.reason}") from exc
                self._refused[exc.message_id] = exc.reason

    def report(self, results: list[Any]) -> None:
        for q, msgs, acked, dead in results:
            ids = {m.id for m in acked} | {m.id for m, _ in dead}
            self.done(q, len(acked), [m for m in msgs if m.id not in ids])
            for m, reason in dead:
                self._refused.pop(m.id, None)
                if self.refused is not None:
                    self.refused(q, m, reason)
            for m in msgs:
                if m.id not in ids:
                    self._refused.pop(m.id, None)
            with self._cond:
                self._unsettled -= len(msgs)

    def flush(self) -> None:
        """Ack what is pending now, in one transaction."""
        self.settle_now(self.take())

    def settle_now(self, got: list[Pending[Q]]) -> None:
        """Ack ``got`` in a transaction of its own, exactly once across commit_unknown_result."""
        if not got:
            return
        try:
            # One transaction for every queue's acks: settled on the first queue's receipts.
            results = self.confirmed(got[0][0].keys, lambda t: self.settle(t, got))
        except QueueError as exc:
            # Not acked: their leases run out and they are delivered again (at least once).
            log.warning("could not ack %d messages: %s; they will be delivered again", len(got), exc)
            with self._cond:
                self._unsettled -= len(got)
                for _, m, _ in got:
                    self._refused.pop(m.id, None)
            return
        self.report(results)

    def close(self) -> None:
        """Ack what is pending, then stop the thread."""
        with self._cond:
            self._closed = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.flush()

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._pending and not self._closed:
                    self._cond.wait(IDLE_EXIT)
                if self._closed or not self._pending:
                    self._thread = None  # idle: a later add starts another
                    return
                due = self._first + self.linger
                while self._pending and len(self._pending) < self.batch and not self._closed:
                    left = due - time.monotonic()
                    if left <= 0:
                        break
                    self._cond.wait(left)
            self.flush()


FIRST_SPREAD = 4  # a work set's lease passes over fewer than this many ready messages
HEAD_SPREAD = 8  # contended or retried: fewer than this many


def lease_settling(
    db: Database,
    settler: Settler[Q] | None,
    q: Q,
    n: int,
    lease_seconds: float | None,
    *,
    retire: bool = False,
    claim: bytes | None = None,
    contended: bool = False,
    owned: bool = False,
    tries: list[int] | None = None,
) -> list[Message]:
    """Lease up to ``n`` of ``q`` (``Queue.lease_many``), committing the acks waiting in
    ``settler`` in the same transaction: one commit for a batch's acks and the next batch's
    leases, exactly once across commit_unknown_result (``run_once_confirmed``). With
    ``retire`` (a work set's consumer), a lease that finds nothing retires the queue from
    the work index in the same transaction (``workindex.retire``), rather than in one more;
    with ``claim`` (the consumer's token) one that takes messages claims the queue
    (``workindex.claim``); ``contended``: another consumer claims it, so this one picks at
    random among the first ready messages rather than take the same head; ``owned``: this
    consumer claims it, and keeps the claim when it finds it empty and does not retire it.
    ``tries``: a one-element list the number of attempts is counted into."""
    got = [] if settler is None else settler.take()
    if not got and not retire and claim is None:
        return q.lease_many(db, n, lease_seconds)
    receipt = random_bytes(16).hex()  # made outside the retry loop, as lease_many's

    attempts = [0] if tries is None else tries  # how many attempts it took, for the caller

    def body(t: Transaction) -> tuple[list[Any], list[Message]]:
        if not retire and claim is None:
            # A plain lease goes first, before anything is written: its range read of the
            # ready messages then meets no write of this transaction, and the embedded engine
            # builds no sorted index of the acks' clears to keep up for each of the lease's
            # writes (engines/local/writemap.py). The outcome is the same in either order: the
            # acked messages are in flight, never among the ready ones; one whose lease expired
            # is given back by the lease's due check and leased again, and its ack finds it
            # gone, as it found it expired (tests/runtime/test_settling_order.py).
            leased = lease(t)
            return (settler.settle(t, got) if settler is not None and got else []), leased
        # The acks first, then the lease: a lease that finds nothing retires the queue from
        # the work index (workindex.retire), which parks it until its first lease deadline
        # while lease entries remain - so the acks this transaction carries must be gone from
        # the lease index before it looks (leasing first parked a queue its own acks emptied:
        # test_fairness' test_a_pattern_serves_only_its_queues waited out the lease).
        results = settler.settle(t, got) if settler is not None and got else []
        return results, lease(t)

    def lease(t: Transaction) -> list[Message]:
        if claim is not None and not contended and workindex.taken_by_other(t, q.keys, claim):
            return []  # claimed since this consumer's scan: its claimer's to serve
        # A work set's consumer picks at random among the first ready messages (one of
        # many consumers of many queues: no head to keep to), wider when another consumer
        # claims the queue.
        spread = 0
        if claim is not None:
            if attempts[0]:
                # A retry, most often after a conflict over the same head: another consumer
                # took it. Under commit latency a second try meets a third consumer there as
                # often as not: this one moves on (its turn goes on with other queues), and
                # commits only the acks it carries.
                attempts[0] += 1
                return []
            spread = HEAD_SPREAD if contended else FIRST_SPREAD
        attempts[0] += 1
        leased = lease_batch(q.keys, t, lease_seconds, receipt, n, spread=spread)
        if retire and not leased:
            workindex.retire(t, q.keys, db_now(t))
        elif claim is not None and leased:
            # read by the lease; the ready count is ready - taken + (wake - counted) (layout.py)
            left = ready_count(*t.snapshot.get_many([q.keys.counter(c) for c in READY_PARTS]))
            workindex.claim(t, q.keys, claim, left > 0)
        elif claim is not None and not contended:
            # Empty for now, and nobody else's: what comes next is this consumer's, the
            # others skip the queue meanwhile instead of all probing it (QuiCK's pointer lease).
            workindex.claim(t, q.keys, claim, False)
        return leased

    try:
        if settler is not None and got:
            results, leased = settler.confirmed(q.keys, body)
        else:
            results, leased = run_once_confirmed(db, q.keys, body)
    except QueueError:
        if settler is not None and got:
            settler.settle_now(got)  # the lease failed (a paused queue, a failing engine): acks alone
        raise
    if settler is not None and got:
        settler.report(results)
    return leased


def _by_queue(got: list[Pending[Q]]) -> dict[Q, list[Message]]:
    out: dict[Q, list[Message]] = {}
    for q, m, _ in got:
        out.setdefault(q, []).append(m)
    return out
