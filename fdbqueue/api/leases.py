"""A queue's worker mode: leases, and their settlement (ack, nack, release, extend).

:class:`Leases` is a base of :class:`fdbqueue.api.queue.Queue`: the methods a worker calls,
apart from the queue's enqueue and dequeue (``queue.py``) because they are the other way of
consuming a queue - a message hidden until it is settled, rather than removed - and a reader
of one seldom needs the other. Every method takes ``tr`` first, as ``Queue``'s do: a
Transaction joins the caller's transaction; a Database runs its own, exactly once across
commit_unknown_result (a receipt: ``fdbqueue.ops.receipts.run_once_confirmed``). The base
declares, under ``TYPE_CHECKING``, the field of the queue it uses (``keys``) and holds none.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from fdbqueue.engines.contract import Attempt, Database, Transaction, Watch, adopt, is_transaction, retry_loop
from fdbqueue.errors import QueueError
from fdbqueue.ops import ratelimit
from fdbqueue.ops.contended import lease_contended
from fdbqueue.ops.delivery import (
    ack_in,
    ack_own,
    ack_short,
    check_lease_seconds,
    extend_in,
    nack_in,
    release_in,
)
from fdbqueue.ops.head import TAKE_RESERVE
from fdbqueue.ops.leasing import lease_batch, lease_own, lease_short
from fdbqueue.ops.moves.places import wake
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.settling import ack_many, nack_many
from fdbqueue.ops.steps import Steps, drive
from fdbqueue.ops.waiting import _blocking_steps, strict_of, watch_queue
from fdbqueue.store.budget import Budget
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import config_or_create
from fdbqueue.store.entropy import random_bytes
from fdbqueue.store.record import check_reason, decode_record
from fdbqueue.types import Message, check_duration, check_where

if TYPE_CHECKING:
    from fdbqueue.store.layout import QueueKeys


class Leases:
    """Worker mode on a queue: take a message hidden until ack, nack, release or lease expiry."""

    if TYPE_CHECKING:
        keys: QueueKeys  # the queue's keys (Queue.__init__)

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
                if one is None:  # among other consumers (the kept head paused): ops/contended.py
                    one = lease_contended(self.keys, t, secs, receipt)
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


def _lease_args(
    n: object, lease_seconds: object, where: object
) -> tuple[float | None, dict[str, Any] | None]:
    """``lease_many``'s arguments checked: the lease in seconds (None: the queue's) and ``where``."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise QueueError(f"n must be an int >= 1, got {n!r}")
    return (None if lease_seconds is None else check_lease_seconds(lease_seconds)), check_where(where)


__all__ = ["Leases"]
