"""The queue: ordered, prioritised, transactional enqueue and dequeue, and worker-mode leases.

Every method takes ``tr`` first: a Transaction joins the caller's transaction (the
operation commits or aborts with it); a Database runs it in its own retried
transaction, exactly once even across commit_unknown_result (1021): ids and receipts
are made once, in the first attempt, and checked by the retries. Receipts, delays, TTLs,
leases and dedup windows are in database time (read versions, ``fdbqueue.store.clock``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, cast

from fdbqueue.api.examining import Examining
from fdbqueue.api.leases import Leases
from fdbqueue.engines.contract import (
    RETRY,
    Again,
    Attempt,
    Database,
    Done,
    Transaction,
    Verdict,
    Watch,
    adopt,
    engine_traits,
    is_transaction,
    retry,
)
from fdbqueue.errors import CorruptMessageError, EngineError, QueueError
from fdbqueue.ops import contention
from fdbqueue.ops.autonomous import enqueue_autonomous
from fdbqueue.ops.contended import take_contended
from fdbqueue.ops.delivery import open_for_dequeue
from fdbqueue.ops.enqueuing import deduplicated, enqueue_items, enqueue_one
from fdbqueue.ops.head import (
    TAKE_KEPT,
    TAKE_RESERVE,
    deliverable_head,
    failed_take,
    keeps_head,
    take_counted,
    take_kept,
    take_short,
)
from fdbqueue.ops.items import batch_items, new_item
from fdbqueue.ops.moves.departures import take
from fdbqueue.ops.moves.places import move_corrupt
from fdbqueue.ops.reading import to_message
from fdbqueue.ops.receipts import maybe_clear_old_receipts, new_receipt, read_receipt
from fdbqueue.ops.steps import Steps, drive
from fdbqueue.ops.sweep import sweep
from fdbqueue.ops.txn import as_database, run_once
from fdbqueue.ops.waiting import _blocking_steps, wait_ready_steps, watch_queue
from fdbqueue.store.budget import Budget
from fdbqueue.store.clock import db_now
from fdbqueue.store.entropy import new_id, random_bytes
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys
from fdbqueue.store.meta import TAKE_COUNTERS, Meta, read_meta_for
from fdbqueue.types import AutonomousId, Item, Message, SweepStats, check_duration

log = logging.getLogger("fdbqueue")


# The classes of the transactions adopt gives back as they are (an engine's own): Queue.dequeue
# asks it once per class.
_joined: set[type] = set()


class _Staged:
    """A dequeue's own transactions hand over to the staged request set (contention.py)."""


_STAGED = _Staged()
_Taken = tuple[Message | None, bool]  # the message, or None and whether the queue is strict
_Item = Item  # its old name


class Queue(Leases, Examining):
    """A handle on one queue: no I/O until used; the queue is created on first use with defaults.

    ``Queue("jobs", root=("myapp",))`` keeps the queue's keys under another root subspace.
    """

    def __init__(self, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
        self.keys = QueueKeys.make(name, root)
        self.name = self.keys.name
        self.root = tuple(root)

    def __repr__(self) -> str:
        return f"Queue({self.name!r})"

    # -- enqueue -------------------------------------------------------------------------------

    def enqueue(
        self,
        tr: Transaction | Database,
        payload: object,
        *,
        priority: int = 0,
        delay: float = 0.0,
        ttl: float | None = None,
        headers: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
        autonomous: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Add one message; returns its id. Composes inside the caller's transaction.

        ``payload``: bytes, str (UTF-8) or anything JSON-serialisable. Higher ``priority``
        is dequeued first, FIFO within a priority. Conflict-free against other enqueues.
        ``delay``: seconds before it can be dequeued; ``ttl``: seconds before it expires.
        ``dedup_key``: within the queue's dedup window, a second enqueue with the same key
        writes nothing and returns the first message's id. ``autonomous``: commit on its
        own, even if the caller's transaction aborts (on the embedded engine: as soon as
        the caller's transaction ends). A full queue raises QueueFullError, or with the
        overflow policy ``block`` waits for room: ``timeout`` None until there is room,
        S up to S seconds, 0 not at all (waiting needs a Database; interruptible).
        """
        if (
            payload.__class__ is bytes
            and priority.__class__ is int
            and -(2**31) <= priority < 2**31
            and delay.__class__ is float
            and delay == 0.0
            and ttl is None
            and headers is None
            and dedup_key is None
            and not autonomous
            and timeout is None
        ):  # the common call: new_item's checks conclude so (enqueuing.enqueue_one)
            return enqueue_one(self.keys, tr, payload, priority)
        item = new_item(payload, priority, headers, delay, ttl, dedup_key)
        if autonomous:
            tr = adopt(tr)  # a raw fdb.Database is wrapped, a raw fdb.Transaction joined
            if is_transaction(tr):
                return self._autonomous(tr, item)  # type: ignore[arg-type]
        return enqueue_items(self.keys, tr, [item], timeout)[0]  # which adopts ``tr``

    def enqueue_many(
        self,
        tr: Transaction | Database,
        payloads: Iterable[object],
        *,
        priority: int = 0,
        headers: Mapping[str, Any] | None = None,
        ttl: float | None = None,
        delay: float = 0.0,
        timeout: float | None = None,
    ) -> list[str]:
        """Add several messages atomically (one transaction), in order; returns their ids.

        An item may be a :class:`NewMessage`, with its own priority, headers, delay, ttl and
        ``dedup_key`` (its fields left None take the call's): an item whose key the queue has
        seen within its dedup window, or that repeats a key earlier in the batch, writes
        nothing and its id is the first message's.

        All or nothing: a batch that does not fit a bounded queue raises QueueFullError
        (saying how many it holds, its max_size and the batch's size), or waits for room as
        :meth:`enqueue` does; a batch larger than max_size is refused at once. A batch past
        what FoundationDB accepts in one transaction (10,000,000 bytes less the layer's
        margin: docs/budgets.md) is refused with BudgetExceededError before anything is written.
        """
        items = batch_items(self.keys, payloads, priority, headers, delay, ttl)
        return enqueue_items(self.keys, tr, items, timeout) if items else []

    def deduplicated(self, tr: Transaction | Database, dedup_key: str) -> str | None:
        """The id an enqueue with ``dedup_key`` would return now without writing, or None.

            That is the first message's id while the key is within the queue's dedup window
            (database time). Needs the ``enqueue`` right: it answers what such an enqueue would.
        Read-only; composes inside a caller's transaction, where it and a
            following ``enqueue(tr, ..., dedup_key=...)`` see the same state.
        """
        return deduplicated(self.keys, tr, dedup_key)

    def _autonomous(self, tr: Transaction, item: Item) -> AutonomousId:
        """Enqueue in a transaction of its own, whatever becomes of the caller's (``autonomous.py``)."""
        return enqueue_autonomous(self.keys, tr, item._replace(fixed_id=True, id=item.id or new_id()))

    # -- dequeue and leases --------------------------------------------------------------------

    def dequeue(
        self,
        tr: Transaction | Database,
        *,
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
        fallback: bool = False,
    ) -> Message | None:
        """Remove and return the next message (higher priority first, FIFO within), or None.

        Given a Transaction, the message is gone when the caller commits and back in its
        place if the caller aborts; an abort counts as a failed delivery (poison
        handling: after max_deliveries the message goes to the error queue). Given a
        Database: its own transaction, exactly once; under contention it switches to the
        staged dequeue-request set; with ``timeout`` it blocks on a watch (no polling),
        which needs a Database since a watch only arms when its transaction commits.
        ``where`` takes the oldest message whose headers match; with ``fallback`` the
        oldest message when none matches.
        """
        if where is None and not timeout and tr.__class__ in _joined:
            # The common call in a caller's transaction: its own step (ops/head.py take_short),
            # else the long way in the same transaction.
            msg = take_short(self.keys, tr)  # type: ignore[arg-type]
            if msg is None:  # among other consumers (the kept head paused): ops/contended.py
                msg = take_contended(self.keys, tr)  # type: ignore[arg-type]
            return msg if msg is not None else self._take(tr, None, False, in_caller=True)  # type: ignore[arg-type]
        tr = adopt(tr)
        if is_transaction(tr):
            _joined.add(tr.__class__)  # (adopt gave it back as it is: an engine's transaction)
            _check_mapping(where)
            if timeout:
                raise QueueError(
                    "a blocking dequeue cannot join a caller's transaction (it must commit to "
                    "wait); pass a Database, or use timeout=None"
                )
            return self._take(tr, where, fallback, in_caller=True)  # type: ignore[arg-type]
        if timeout is None:  # non-blocking: the one attempt the steps would run, without them
            _check_mapping(where)
            return self._dequeue_own(as_database(tr), where, fallback, False)[0]
        return drive(self.dequeue_steps(as_database(tr), timeout, where, fallback))

    def dequeue_steps(
        self, db: Database, timeout: float | None, where: Mapping[str, Any] | None, fallback: bool
    ) -> Steps[Message | None]:
        """:meth:`dequeue` in a Database, as steps (``fdbqueue.ops.steps``): what the blocking API
        and ``fdbqueue.aio`` both run. Arguments are checked here."""
        _check_mapping(where)
        return _blocking_steps(db, self.keys, timeout, partial(self._dequeue_own, db, where, fallback))

    def sweep(self, tr: Transaction | Database, *, limit: int = 100) -> SweepStats:
        """Expired leases back, due delayed messages in, TTLs out, old dedup entries forgotten.

        Idempotent and safe from many workers at once. Given a Database it runs
        transactions of up to ``limit`` moves per index until nothing is due; given a
        Transaction, one such step inside it. Needs no right: it does only what the next
        dequeue would (docs/api.md); a forwarder holding ``admin`` on its source sweeps it.
        """
        tr = adopt(tr)
        if is_transaction(tr):
            return sweep(self.keys, tr, db_now(tr), limit)  # type: ignore[arg-type]
        db = as_database(tr)
        total = SweepStats()
        while True:
            st = run_once(db, lambda t, _: sweep(self.keys, t, db_now(t), limit))
            total.add(st)
            if st.total() == 0:
                return total

    def wait(self, db: Database, timeout: float | None = None) -> bool:
        """Block until a message may be ready, up to ``timeout`` seconds (a watch, no polling).

        True at once when a message is ready. For consumers that dequeue inside their
        own transactions, which cannot block. Needs a Database, and ``dequeue`` (whether
        a message is ready is the queue's to tell its consumers).
        """
        if is_transaction(db) or not hasattr(db, "create_transaction"):
            raise QueueError("wait() needs a Database: a watch arms only when its transaction commits")
        if timeout is not None:
            timeout = check_duration("timeout", timeout)
        return drive(wait_ready_steps(db, self.keys, timeout))

    def _dequeue_own(
        self, db: Database, where: Mapping[str, Any] | None, fallback: bool, want_watch: bool
    ) -> tuple[Message | None, Watch | None]:
        keys = self.keys
        may_conflict, may_unknown = engine_traits(db)
        rand = random_bytes(8) if may_unknown else b""
        receipt: bytes | None = None  # made in the first attempt, from its read version
        taken: Message | None = None
        staged_ok = False
        budget = Budget(TAKE_RESERVE)
        resume: bytes | None = None  # where a filtered scan goes on, after a committed transaction
        # Where nothing conflicts and no commit is unknown (no staged set, no receipt) a take
        # without a filter may be take_short's.
        short = where is None and not may_conflict and not may_unknown

        def resumed() -> None:
            nonlocal resume
            resume = budget.resume

        def step(t: Transaction, attempt: Attempt) -> _Taken | _Staged | Again | Done[_Taken | _Staged]:
            nonlocal receipt, taken, staged_ok
            if short:  # the common take's own step (ops/head.py), else the long way below
                msg = take_short(keys, t, False)
                if msg is None:  # among other consumers (the kept head paused): ops/contended.py
                    msg = take_contended(keys, t, False)
                if msg is not None:
                    taken = msg
                    return msg, False
            budget.next_transaction()
            budget.resume = resume
            if may_unknown and receipt is None:
                receipt = new_receipt(t, keys, rand)
            if attempt.unknown and taken is not None and receipt and read_receipt(t, keys, receipt):
                # The attempt with the unknown result did commit. Read-only, this check
                # cannot itself end unknown; the receipt is swept later.
                return Done((taken, False))
            kept = where is None and keeps_head(t, keys)
            meta = read_meta_for(t, keys, TAKE_KEPT if kept else TAKE_COUNTERS)
            strict = meta.config is not None and meta.config.strict_order
            staged_ok = may_conflict and where is None and not strict
            if staged_ok and contention.waiting_requests(t, keys):
                return Done(_STAGED)  # others are queued in the staged set: do not jump the line
            msg = self._take(t, where, fallback, meta=meta, budget=budget, kept=kept)
            if msg is None and budget.more:
                # This transaction's budget is spent (expired messages moved aside, a
                # filter scan's share read): keep what it did, go on in the next one.
                return Again(resumed)
            if msg is None:
                return None, strict
            if receipt is not None:
                t.set(receipt, msg.id.encode())
                maybe_clear_old_receipts(t, keys)
            taken = msg
            return msg, False

        def on_error(exc: EngineError, attempt: Attempt) -> _Taken | _Staged | Verdict:
            settling = attempt.unknown and taken is not None  # must learn if that take landed
            if attempt.conflicts >= 2 and staged_ok and not settling:
                # Plain dequeues keep colliding: the staged request set costs about
                # three commits a message and pays off only from a few dequeuers.
                return _STAGED
            return RETRY

        # cast: mypy infers the loop's result type from a union of two as object.
        got = cast(
            "_Taken | _Staged",
            retry(db, step, on_error=on_error, unknown_outcome=lambda attempt: taken is not None),
        )
        if not isinstance(got, _Staged):
            msg, strict = got
            if msg is None:
                return None, (watch_queue(db, keys, strict) if want_watch else None)
            return msg, None
        msg = contention.staged_dequeue(db, keys)  # by the module: tests and benchmarks count its calls
        return msg, (watch_queue(db, keys) if msg is None and want_watch else None)

    def _take(
        self,
        tr: Transaction,
        where: Mapping[str, Any] | None,
        fallback: bool,
        *,
        in_caller: bool = False,
        meta: Meta | None = None,
        budget: Budget | None = None,
        kept: bool = False,
    ) -> Message | None:
        keys = self.keys
        # The counters it looks at and adds to, no more (read_meta_for); the wake counter too
        # when it may take a kept head (ops/head.py: keeps_head).
        if meta is None:
            kept = where is None and keeps_head(tr, keys)
            meta = read_meta_for(tr, keys, TAKE_KEPT if kept else TAKE_COUNTERS)
        opened = open_for_dequeue(tr, keys, meta)
        if opened is None:
            return None
        cfg, meta = opened
        due = meta.waiting()
        raw = meta.raw
        now = db_now(tr)
        head = None
        if kept and not due and not cfg.strict_order:  # (kept: no filter)
            # The common case: a kept head (ops/head.py), without the scan's arguments; its
            # counters written as read (take_counted: nothing was moved on the way).
            head = take_kept(keys, tr, raw, now)
            if head is not None and not head[1].chunks and head[1].expires_us is None:
                key, rec = head  # no payload chunks to read, no TTL to estimate: the Message here
                msg = Message.from_record(
                    rec, keys.name, keys.priority_of(key), key, rec.payload, delivered=True
                )
                if not take_counted(tr, keys, key, rec, raw, cfg.journal):
                    take(tr, keys, key, rec, journaled=cfg.journal)
                if in_caller:
                    tr.on_finish(partial(failed_take, keys, tr.db, msg))
                return msg
        counts = raw if kept and head is None else None  # with the ready and wake counters
        clean: list[bool] = []  # deliverable_head: nothing moved, the counters read still current
        if head is not None:
            clean.append(True)
        while True:
            if head is None:
                head = deliverable_head(
                    keys,
                    tr,
                    cfg,
                    where,
                    fallback,
                    now,
                    check_due=due,
                    budget=budget,
                    kept=counts,
                    clean=clean,
                )
                counts = None  # once: a damaged message moved aside below changes the counters
                if head is None:
                    return None
            key, rec = head
            try:
                msg = to_message(tr, keys, key, rec, delivered=True)
                break
            except CorruptMessageError as exc:  # its payload chunks are damaged
                move_corrupt(keys, tr, cfg, key, rec.encode(), exc, budget)
                clean.clear()
                head = None
        if not (clean and take_counted(tr, keys, key, rec, raw, cfg.journal)):
            take(tr, keys, key, rec, journaled=cfg.journal)
        if in_caller:
            tr.on_finish(partial(failed_take, keys, tr.db, msg))
        return msg


def _check_mapping(where: object) -> None:
    if where is not None and not isinstance(where, Mapping):
        raise QueueError("where must be a mapping of header names to values")


__all__ = ["Queue"]
