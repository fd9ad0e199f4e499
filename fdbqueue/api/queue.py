"""The queue: ordered, prioritised, transactional enqueue and dequeue, and worker-mode leases.

Every method takes ``tr`` first: a Transaction joins the caller's transaction (the
operation commits or aborts with it); a Database runs it in its own retried
transaction, exactly once even across commit_unknown_result (1021): ids and receipts
are made once, in the first attempt, and checked by the retries. Receipts, delays, TTLs,
leases and dedup windows are in database time (read versions, ``fdbqueue.store.clock``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from functools import partial
from typing import Any, TypeVar, cast

from fdbqueue.api.redrive import delete_by_id
from fdbqueue.engines.contract import (
    RETRY,
    Again,
    Attempt,
    Database,
    Done,
    KeySelector,
    Transaction,
    Verdict,
    Watch,
    adopt,
    engine_traits,
    is_transaction,
    retry,
    retry_loop,
)
from fdbqueue.errors import (
    CorruptMessageError,
    EngineError,
    QueueError,
    QueueStoppedError,
)
from fdbqueue.ops import contention, ratelimit
from fdbqueue.ops.autonomous import enqueue_autonomous
from fdbqueue.ops.browse import browse, nth_in_order
from fdbqueue.ops.delivery import (
    ack_in,
    ack_own,
    ack_short,
    check_lease_seconds,
    extend_in,
    locate,
    message_elsewhere,
    nack_in,
    open_for_dequeue,
    release_in,
    to_message,
)
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
from fdbqueue.ops.leasing import lease_batch, lease_own, lease_short
from fdbqueue.ops.moves import move_corrupt, take, wake
from fdbqueue.ops.privileges import check, checked
from fdbqueue.ops.receipts import maybe_clear_old_receipts, new_receipt, read_receipt, run_once_confirmed
from fdbqueue.ops.settling import ack_many, nack_many
from fdbqueue.ops.steps import Steps, drive
from fdbqueue.ops.sweep import sweep
from fdbqueue.ops.txn import as_database, run_once
from fdbqueue.ops.views import due_unswept, ready_count
from fdbqueue.ops.waiting import blocking_steps, strict_of, wait_ready_steps, watch_queue
from fdbqueue.store.budget import Budget
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import TAKE_COUNTERS, Meta, config_or_create, read_meta_for
from fdbqueue.store.entropy import new_id, random_bytes
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys
from fdbqueue.store.record import Record, check_reason, decode_record
from fdbqueue.types import AutonomousId, Item, Message, SweepStats, check_duration, check_where

log = logging.getLogger("fdbqueue")
R = TypeVar("R")


# The classes of the transactions adopt gives back as they are (an engine's own): Queue.dequeue
# asks it once per class.
_joined: set[type] = set()


class _Staged:
    """A dequeue's own transactions hand over to the staged request set (contention.py)."""


_STAGED = _Staged()
_Taken = tuple[Message | None, bool]  # the message, or None and whether the queue is strict
_Item = Item  # its old name


class Queue:
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

    # -- reading messages ----------------------------------------------------------------------

    def _message(self, tr: Any, key: bytes, raw: bytes, *, delivered: bool = False) -> Message:
        return self._to_message(tr, key, decode_record(raw, self.keys, key), delivered=delivered)

    def _to_message(self, tr: Any, key: bytes, rec: Record, *, delivered: bool = False) -> Message:
        return to_message(tr, self.keys, key, rec, delivered=delivered)

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

    def lease(
        self, tr: Transaction | Database, lease_seconds: float | None = None, *, timeout: float | None = None
    ) -> Message | None:
        """Take the next message in worker mode: hidden until ack, nack or lease expiry.

        Every lease counts a delivery. Composes inside a caller's transaction; ``timeout``
        (blocking) needs a Database. ``lease_seconds`` defaults to the queue's setting.
        """
        if timeout is None:  # the common lease: its own transaction and step (ops/leasing.py), there first
            secs = None if lease_seconds is None else check_lease_seconds(lease_seconds)
            one = lease_own(tr, self.keys, secs)
            if one is not None:
                return one[0] if one else None
        got = self.lease_many(tr, 1, lease_seconds, timeout=timeout)
        return got[0] if got else None

    def lease_many(
        self,
        tr: Transaction | Database,
        n: int,
        lease_seconds: float | None = None,
        *,
        timeout: float | None = None,
        where: Mapping[str, Any] | None = None,
    ) -> list[Message]:
        """Lease up to ``n`` messages in one transaction (a worker's prefetch); [] when none.
        ``where``: only messages whose headers match it (a forward's filter)."""
        tr = adopt(tr)
        if is_transaction(tr):
            secs, where = _lease_args(n, lease_seconds, where)
            if timeout:
                raise QueueError("a blocking lease cannot join a caller's transaction; pass a Database")
            receipt = random_bytes(16).hex()
            return lease_batch(self.keys, tr, secs, receipt, n, None, where)  # type: ignore[arg-type]
        if timeout is None:  # non-blocking: the one attempt the steps would run, without them
            secs, where = _lease_args(n, lease_seconds, where)
            return self._lease_attempt(cast("Database", tr), n, secs, where)(False)[0] or []
        return drive(self.lease_steps(cast("Database", tr), n, lease_seconds, timeout, where)) or []

    def lease_steps(
        self,
        db: Database,
        n: int,
        lease_seconds: float | None,
        timeout: float | None,
        where: Mapping[str, Any] | None,
    ) -> Steps[list[Message] | None]:
        """:meth:`lease_many` in a Database, as steps: see :meth:`dequeue_steps`."""
        secs, where = _lease_args(n, lease_seconds, where)
        return _blocking_steps(db, self.keys, timeout, self._lease_attempt(db, n, secs, where))

    def _lease_attempt(
        self, db: Database, n: int, secs: float | None, where: Mapping[str, Any] | None
    ) -> Callable[[bool], tuple[list[Message] | None, Watch | None]]:
        """One attempt of a lease of up to ``n`` (its arguments checked): ``attempt(want_watch)``
        gives what it leased, or None and the watch to wait on (``want_watch``)."""
        receipt = random_bytes(16).hex()  # made outside the retry loop: settles a 1021
        taken: list[Message] = []
        budget = Budget(TAKE_RESERVE)
        short = n == 1 and where is None

        def step(t: Transaction, at: Attempt) -> list[Message]:
            if at.unknown and taken:
                raw = t.get(self.keys.inflight_key(taken[0].id))
                if (
                    raw is not None
                    and decode_record(raw, self.keys, self.keys.inflight_key(taken[0].id)).extra.get(
                        "receipt"
                    )
                    == taken[0].receipt
                ):
                    return list(taken)  # the attempt that ended in commit_unknown_result committed
            if short:  # the common lease of one: its own step (ops/leasing.py lease_short), there first
                one = lease_short(self.keys, t, secs, receipt)
                if one is not None:
                    taken[:] = got = [one]
                    return got
            budget.next_transaction()
            got = lease_batch(self.keys, t, secs, receipt, n, budget, where)
            taken[:] = got  # what this attempt leased, kept for a retry to recognise
            return got

        def attempt(want_watch: bool) -> tuple[list[Message] | None, Watch | None]:
            ratelimit.throttled()  # forget an earlier lease's: this one says
            # run_once's loop on ``db`` (a Database, adopted by every caller): no second look.
            got = retry_loop(db, step, None, True)
            while not got and budget.more:  # expired messages moved aside: go on in another
                got = retry_loop(db, step, None, True)
            if got or not want_watch:
                return got, None
            held = ratelimit.throttled()
            if held is not None:  # ready, but the rate limit holds it back: until a token
                return None, ratelimit.timer_watch(self.keys.wake, held)
            return None, watch_queue(db, self.keys, strict_of(db, self.keys))

        return attempt

    def ack(self, tr: Transaction | Database, m: Message) -> None:
        """Settle a leased message: it is done and removed. LeaseError if the lease is gone.

        Given a Database, exactly once across commit_unknown_result (a receipt: see
        ``fdbqueue.ops.receipts.run_once_confirmed``): it returns only if its own commit landed."""
        if ack_own(tr, self.keys, m):  # its own transaction, the common ack its own step (ops/delivery.py)
            return

        def body(t: Transaction) -> None:
            if ack_short(self.keys, t, m):  # the common ack: its own step (ops/delivery.py)
                return
            if ack_in(self.keys, t, m, None).extra.get("strict"):
                wake(t, self.keys)  # strict order: the next delivery may go ahead now

        run_once_confirmed(tr, self.keys, body)

    def ack_many(self, tr: Transaction | Database, messages: Sequence[Message]) -> list[Message]:
        """Ack leased ``messages`` (at most 1,000) in one transaction, with :meth:`ack`'s
        receipt checks; returns those acked: one whose lease has gone (expired, or taken back
        by a sweep) is left out, not raised. Composes inside a caller's transaction; given a
        Database, exactly once across commit_unknown_result, as :meth:`ack`."""
        return ack_many(tr, self.keys, messages)

    def nack_many(
        self,
        tr: Transaction | Database,
        messages: Sequence[Message],
        *,
        delay: float | None = None,
        reason: str | None = None,
    ) -> list[str | None]:
        """:meth:`nack` for many leased messages in one transaction; where each went
        (``ready``, ``delayed``, ``dead``, ``expired``), or None for one whose lease had gone.
        Settled like :meth:`ack_many`."""
        return nack_many(tr, self.keys, messages, delay=delay, reason=reason)

    def nack(
        self,
        tr: Transaction | Database,
        m: Message,
        *,
        delay: float | None = None,
        reason: str | None = None,
        discard: bool = False,
    ) -> str:
        """Give a leased message back: to its original place after ``delay`` (default: the
        queue's retry delay), or to the error queue (tagged ``reason``) once it has had
        max_deliveries, or at once with ``discard``. Returns where it went: ``ready``,
        ``delayed``, ``dead``, ``expired``. Settled like :meth:`ack`: LeaseError only if its
        own commit did not land."""
        if delay is not None:
            delay = check_duration("delay", delay)
        if reason is not None and not isinstance(reason, str):
            raise QueueError("reason must be a str")
        if reason is not None:
            check_reason(reason)

        def body(t: Transaction) -> str:
            cfg = config_or_create(t, self.keys)
            return nack_in(self.keys, t, cfg, m, delay, reason, db_now(t), discard)

        return run_once_confirmed(tr, self.keys, body)

    def release(self, tr: Transaction | Database, m: Message) -> None:
        """Give a leased message back to its place at once, without counting the delivery
        (a worker shutting down returns what it prefetched but never started). Settled
        like :meth:`ack`."""

        run_once_confirmed(tr, self.keys, lambda t: release_in(self.keys, t, m, db_now(t)))

    def extend(self, tr: Transaction | Database, m: Message, lease_seconds: float) -> Message:
        """Renew a lease for ``lease_seconds`` from now; returns the message with its new
        deadline. Settled like :meth:`ack`: the lease of the attempt that landed."""
        secs = check_lease_seconds(lease_seconds)

        return run_once_confirmed(tr, self.keys, lambda t: extend_in(self.keys, t, m, secs, db_now(t)))

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

    # -- examining without consuming ----------------------------------------------------------

    def peek(self, tr: Transaction | Database) -> Message | None:
        """The next message dequeue would return, left in place."""
        return self.nth(tr, 0)

    def nth(self, tr: Transaction | Database, n: int) -> Message | None:
        """The message at 0-based position ``n`` in dequeue order, or None."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise QueueError(f"n must be an int >= 0, got {n!r}")

        begin, end = self.keys.ready_range()

        def body(t: Transaction, _: bool) -> Message | None:
            # One key selector resolved by the storage servers, then one point read: not the
            # n + 1 records a range read would bring back (key selectors with an offset:
            # documentation/sphinx/source/developer-guide.rst in apple/foundationdb). While
            # expired or due messages wait for a sweep, positions are counted as browse
            # counts them (fdbqueue/ops/views.py): a walk in dequeue order.
            meta = checked(t, self.keys, "browse")
            due = due_unswept(t, self.keys, meta, db_now(t))
            if due:
                return nth_in_order(self.keys, t, n, meta, due)
            row = t.get_range(KeySelector.first_greater_or_equal(begin) + n, end, limit=1)
            return self._message(t, row[0].key, row[0].value) if row else None

        return run_once(tr, body)

    def get(self, tr: Transaction | Database, msg_id: str) -> Message | None:
        """The message with id ``msg_id`` wherever it waits (ready, leased, delayed), or None."""
        if not isinstance(msg_id, str):
            raise QueueError(f"message id must be a str, not {type(msg_id).__name__}")

        def body(t: Transaction, _: bool) -> Message | None:
            check(t, self.keys, "browse")
            where = locate(t, self.keys, msg_id)
            raw = None if where is None else t.get(where)
            if where is None or raw is None:
                return None
            if self.keys.unpack_tail(where)[0] == "r":
                return self._message(t, where, raw)
            return message_elsewhere(self.keys, t, where, raw)

        return run_once(tr, body)

    def delete(self, tr: Transaction | Database, msg_id: str) -> bool:
        """Remove message ``msg_id`` wherever it waits (ready, leased, delayed); True if it
        was there. A leased message's holder then gets LeaseError on ack. Journaled
        ``delete``; needs ``admin``; composes inside the caller's transaction."""
        return delete_by_id(tr, self.keys, msg_id)

    def size(self, tr: Transaction | Database) -> int:
        """Ready messages, by database time (fdbqueue/ops/views.py: not those past their TTL, with
        delayed ones that are due): the atomic counter, corrected by a bounded read of what
        is due and not yet swept; snapshot reads."""
        return run_once(tr, lambda t, _: ready_count(t, self.keys, checked(t, self.keys, "browse")))

    def empty(self, tr: Transaction | Database) -> bool:
        """True when no message is ready (``size() == 0``)."""
        return self.size(tr) == 0

    def browse(
        self, tr: Transaction | Database, *, limit: int | None = None, batch: int = 100
    ) -> Iterator[Message]:
        """Walk ready messages in dequeue order without consuming them (a cursor).

        Each batch is its own read (a Database) or a read in the caller's transaction.
        The cursor keeps its place across concurrent dequeues, and a higher-priority
        message that arrives behind it is still visited (the cursor moves back, as a
        browsing subscription does in Apache Qpid's queue design). Messages are classified
        by database time, as a dequeue would: an expired message is not shown, and a due
        delayed one is shown where a dequeue would make it ready, before any sweep.
        """
        return browse(self.keys, tr, limit=limit, batch=batch)


def _check_mapping(where: object) -> None:
    if where is not None and not isinstance(where, Mapping):
        raise QueueError("where must be a mapping of header names to values")


def _lease_args(
    n: object, lease_seconds: object, where: object
) -> tuple[float | None, dict[str, Any] | None]:
    """``lease_many``'s arguments checked: the lease in seconds (None: the queue's) and ``where``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise QueueError(f"n must be an int >= 1, got {n!r}")
    return (None if lease_seconds is None else check_lease_seconds(lease_seconds)), check_where(where)


def _blocking_steps(
    db: Database,
    keys: QueueKeys,
    timeout: float | None,
    attempt: Callable[[bool], tuple[R | None, Watch | None]],
) -> Steps[R | None]:
    """:func:`blocking_steps`, saying ``QueueStoppedError`` when the wait ends on a paused queue.

    A blocking dequeue waits through a pause (resuming wakes it); if the queue is still
    paused when the wait ends, it says so as a non-blocking dequeue does, not "nothing ready".
    """
    stopped: list[QueueStoppedError] = []

    def watched(want_watch: bool) -> tuple[R | None, Watch | None]:
        stopped.clear()
        try:
            return attempt(want_watch)
        except QueueStoppedError as exc:
            stopped.append(exc)
            raise

    got = yield from blocking_steps(db, keys, timeout, watched)
    if got is None and stopped:
        raise stopped[0]
    return got


__all__ = ["Queue"]
