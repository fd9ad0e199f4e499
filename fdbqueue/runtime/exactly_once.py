"""Exactly-once mode: each message is claimed in a transaction of its own, then its handler
runs in the transaction that acks it (see :class:`~fdbqueue.runtime.worker.Worker`)."""

from __future__ import annotations

import time
from typing import Any

from fdbqueue.api.queue import Queue
from fdbqueue.engines.limits import TRANSACTION_WINDOW_SECONDS
from fdbqueue.errors import EngineError, LeaseError, QueueError, StopNow
from fdbqueue.ops import tracing
from fdbqueue.ops.aborts import TOO_OLD_REASON
from fdbqueue.ops.txn import run_once
from fdbqueue.runtime.handling import engine_failure, judge
from fdbqueue.runtime.worker_base import WorkerBase, log
from fdbqueue.store.clock import db_now, seconds_of
from fdbqueue.types import Message

# How long an exactly-once claim hides its message: past FoundationDB's 5-second transaction
# window (the handler's transaction cannot outlive it) with room for the wait for a writer and
# the nack after a failure. A worker that dies holding a claim delays its message this long.
CLAIM_SECONDS = 2 * TRANSACTION_WINDOW_SECONDS


class ExactlyOnce(WorkerBase):
    """The exactly-once loop and step of a worker (``mode="exactly_once"``)."""

    def _exactly_once_loop(self, until_empty: bool) -> None:
        while not self.stopping:
            progressed = False
            for q in self._rotation():
                if self.stopping:
                    return
                try:
                    outcome = self._exactly_once_step(q)
                except QueueError as exc:  # not the handler's: the dequeue itself failed
                    if engine_failure(exc):
                        self.backoff.wait(f"dequeue from {q.name!r}", exc, self._stop)
                    elif self.workset is not None:
                        self.workset.avoid(self.db, q, exc)
                    else:
                        log.warning("could not dequeue from %r: %s", q.name, exc)
                    continue
                if outcome == "skip":
                    continue  # backed off in the step, or the claim lost: nothing counted
                self._served(q, outcome is not None)
                self.backoff.reset()
                if outcome is not None:
                    progressed = True
                    if self._count(q, outcome == "ok", too_slow=outcome == "too_slow"):
                        return
            if not progressed and not self._throttle_pause():
                self._idle(until_empty)

    def _exactly_once_step(self, q: Queue) -> str | None:
        """Claim the next message of ``q``, then run the handler and remove the message in
        one transaction, retried as ``@transactional`` retries (a conflict runs both again).

        The claim is a short lease taken in a transaction of its own: it counts the delivery
        before the handler runs, and hides the message from the other workers meanwhile. The
        handler's transaction aborts when it fails, so a count written there would be undone;
        one written after it (as an in-transaction ``dequeue`` does) let concurrent workers
        each take the same message as its first delivery. A claim that the handler's
        transaction does not settle ends as a failure (a nack with the reason), as a release
        when the engine failed (not counted), or, if this process dies, when the claim runs
        out (counted).

        Returns None when nothing was ready, ``"ok"`` when it committed, ``"failed"`` when
        the handler raised, ran past ``time_limit`` or its transaction could not commit,
        ``"too_slow"`` when the transaction outlived the 5-second limit (1007), ``"skip"``
        when nothing is counted here (the engine failed: backed off; or the claim was lost).
        """
        with self._rate_limited():
            m = q.lease(self.db, self.lease_seconds or CLAIM_SECONDS)
        if m is None:
            self._note_throttle()
            return None
        self._registry.begin(q.name, m.id)
        tr = self.db.create_transaction()
        unknown = False  # an attempt ended in commit_unknown_result: it may have landed
        try:
            while True:
                begun = db_now(tr)
                try:
                    try:
                        q.ack(tr, m)  # the message goes when, and only if, tr commits
                    except LeaseError:
                        if unknown:
                            return "ok"  # the attempt that ended unknown committed
                        log.warning("the claim on %s of %r ran out before its handler began", m.id, q.name)
                        return "skip"
                    began = time.perf_counter()
                    tracing.run(q.name, m.id, m.headers, self.handler, tr, m)
                    if self.time_limit is not None and time.perf_counter() - began > self.time_limit:
                        tr.cancel()
                        return self._timed_out(q, m, began)
                    self._observe(q, began, "ok")
                    tr.commit()
                    return "ok"
                except EngineError as exc:
                    if exc.code == 1007:
                        # Ended first: measuring takes a transaction, which must not nest
                        # inside this one (the embedded engine's single writer).
                        tr.cancel()
                        if not self._outlived(begun):  # within the window (a recovery): again
                            tr.reset()
                            continue
                        log.warning(
                            "handler on queue %r, message %s (delivery %d) outlived FoundationDB's "
                            "5-second transaction limit (1007 transaction_too_old): its writes were "
                            "not committed and the delivery counts as failed; keep exactly-once "
                            "handlers well under 5 s, or use mode='lease'",
                            q.name,
                            m.id,
                            m.deliveries,
                            extra={"queue": q.name, "message_id": m.id, "deliveries": m.deliveries},
                        )
                        self._give_back(q, m, TOO_OLD_REASON)
                        return "too_slow"
                    if exc.retryable:
                        unknown = unknown or exc.maybe_committed
                        try:
                            tr.on_error(exc)
                            continue
                        except EngineError as final:  # out of retries
                            exc = final
                    if engine_failure(exc):
                        return self._engine_failed(tr, q, m, exc)
                    return self._failed(tr, q, m, exc)
                except StopNow:
                    tr.cancel()
                    self._release(q, m)  # back where it was, the delivery not counted
                    raise
                except Exception as exc:
                    if engine_failure(exc):  # the commit, or the handler's own reads and writes
                        return self._engine_failed(tr, q, m, exc)
                    return self._failed(tr, q, m, exc)  # a failure, or a Retry or Discard
        finally:
            tr.cancel()
            self._registry.end(m.id)

    def _engine_failed(self, tr: Any, q: Queue, m: Message, exc: BaseException) -> str:
        """The engine failed around ``m``'s handling: abort, give the claim back without
        counting the delivery, then back off."""
        tr.cancel()
        self._release(q, m)
        self.backoff.wait(f"exactly-once handling of {m.id} on {q.name!r}", exc, self._stop)
        return "skip"

    def _failed(self, tr: Any, q: Queue, m: Message, exc: BaseException) -> str:
        """The handler (or its commit) failed on ``m``: abort, then settle the claim as
        :func:`judge` says (the delivery is counted already)."""
        tr.cancel()
        outcome = judge(exc, q, m, log)
        self._give_back(q, m, outcome.reason, delay=outcome.delay, discard=outcome.discard)
        self._tally(outcome.kind)
        return "failed"

    def _outlived(self, begun: int) -> bool:
        """True when the transaction that read at version ``begun`` is now past the
        5-second window, by database time (a fresh read version)."""
        now = run_once(self.db, lambda t, _: db_now(t))
        return seconds_of(now - begun) > TRANSACTION_WINDOW_SECONDS
