"""Every error fdbqueue raises derives from :class:`QueueError`.

Engine errors carry FoundationDB's numeric ``code`` and its retryable /
maybe-committed split, whatever the engine, so that code written against the
embedded engine handles a cluster's errors the same way.
"""

from __future__ import annotations

import math

# FoundationDB error codes (api-error-codes.rst) that the engines raise or pass through.
ERROR_NAMES: dict[int, str] = {
    1007: "transaction_too_old",
    1009: "future_version",
    1020: "not_committed",
    1021: "commit_unknown_result",
    1025: "transaction_cancelled",
    1031: "transaction_timed_out",
    1032: "too_many_watches",
    1036: "accessed_unreadable",
    1037: "process_behind",
    1038: "database_locked",
    1039: "cluster_version_changed",
    1042: "proxy_memory_limit_exceeded",
    1051: "batch_transaction_throttled",
    1078: "grv_proxy_memory_limit_exceeded",
    1101: "operation_cancelled",
    1213: "tag_throttled",
    1235: "transaction_throttled_hot_shard",
    1242: "transaction_rejected_range_locked",
    2004: "key_outside_legal_range",
    2005: "inverted_range",
    2006: "invalid_option_value",
    2017: "used_during_commit",
    2020: "no_commit_version",
    2021: "transaction_read_only",
    2101: "transaction_too_large",
    2102: "key_too_large",
    2103: "value_too_large",
    4100: "internal_error",
}

# fdb_error_predicate(FDB_ERROR_PREDICATE_RETRYABLE_NOT_COMMITTED / MAYBE_COMMITTED)
RETRYABLE_NOT_COMMITTED = frozenset({1020, 1007, 1009, 1037, 1038, 1042, 1051, 1078, 1213, 1235, 1242})
MAYBE_COMMITTED = frozenset({1021, 1039})
RETRYABLE = RETRYABLE_NOT_COMMITTED | MAYBE_COMMITTED
# A commit that failed with one of these may still land: the note on the
# automatic_idempotency option (fdbclient/vexillographer/fdb.options) says so of
# cluster_version_changed and transaction_timed_out thrown during a commit.
MAYBE_COMMITTED_DURING_COMMIT = frozenset({1031, 1039})


class QueueError(Exception):
    """An fdbqueue operation failed."""

    def __init__(self, *args: object) -> None:
        # The class docstring's first line is the default message (procrastinate's idiom).
        if not args and self.__doc__:
            args = (self.__doc__.strip().splitlines()[0],)
        super().__init__(*args)


class EngineError(QueueError):
    """The storage engine refused or failed a transaction."""

    def __init__(self, code: int, message: str | None = None, *, during_commit: bool = False) -> None:
        self.code = int(code)
        self.name = ERROR_NAMES.get(self.code, "unknown_error")
        # True when a commit raised it: 1031 then leaves the outcome unknown too.
        self.during_commit = bool(during_commit)
        super().__init__(f"{self.name} ({self.code})" + (f": {message}" if message else ""))

    @property
    def retryable(self) -> bool:
        """True when running the transaction again may succeed (on_error retries it)."""
        return self.code in RETRYABLE

    @property
    def maybe_committed(self) -> bool:
        """True when the transaction may have committed: 1021 and 1039, and 1031 raised by a
        commit (a timeout does not stop a commit already sent, as FoundationDB's own client
        simulates: ``simulateTimeoutInFlightCommit`` in ``fdbclient/ReadYourWrites.cpp``).
        The retry must be idempotent."""
        return self.code in MAYBE_COMMITTED or (
            self.during_commit and self.code in MAYBE_COMMITTED_DURING_COMMIT
        )


class StoreLockedError(EngineError):
    """The embedded store's lock stayed held by another process past ``lock_timeout``.

    An :class:`EngineError` 1037 (retryable, as before): its message names the holder's pid,
    whether it is stopped, and how long this waiter saw it unchanged.
    """

    def __init__(self, message: str) -> None:
        super().__init__(1037, message)


class InvalidURLError(QueueError):
    """The database URL is malformed or names an unknown engine."""


class StoreError(QueueError):
    """The store cannot be opened: missing, corrupt, foreign or of a newer format."""


class StoreFullError(StoreError):
    """An enqueue was refused: the device holding the store has less free space than the
    reserve kept for consumers (the embedded engine's ``reserve=``); nothing was written."""


class UnsupportedFormatError(StoreError):
    """The store was written by a newer, incompatible fdbqueue format."""


class ClusterUnavailableError(QueueError):
    """The FoundationDB cluster or its client library cannot be reached."""


class NestedTransactionError(QueueError):
    """A second transaction was opened on the embedded engine while this thread holds one.

    The embedded engine has a single writer; waiting for it here would deadlock.
    """


class InvalidTextError(QueueError, ValueError):
    """A str that UTF-8 cannot encode (it holds a lone surrogate): keys and payloads are UTF-8."""


class QueueStoppedError(QueueError):
    """This direction of the queue is disabled (stopped)."""


class QueueFullError(QueueError):
    """The queue holds max_size messages."""

    def __init__(self, *args: object, block: bool = False) -> None:
        super().__init__(*args)
        self.block = block  # the queue's overflow policy is "block": waiting may help


class CommitUnknownError(QueueError):
    """A commit ended in commit_unknown_result and its outcome can no longer be learnt.

    The retry came later than the receipt that settles it is kept (database time, so a
    recovery's version jump counts): the operation may or may not have happened. Not
    retried, since guessing could write it twice or report a loss as a success; check
    the queue (by message id) before doing it again.
    """


def unknown_outcome(exc: EngineError) -> CommitUnknownError:
    """The error for a call whose commit may have landed and cannot be retried or settled."""
    return CommitUnknownError(
        f"the outcome is unknown: a commit may have landed, and the transaction then ended with "
        f"{exc.name} ({exc.code}) before its retry could learn whether it did; it may or may "
        "not have happened, so check before doing it again"
    )


class CorruptMessageError(QueueError):
    """A stored message record or payload chunk failed its checksum or cannot be decoded.

    ``queue`` and ``key`` name where it is stored; ``msg_id`` is its id when the key names
    one (the record's own id field cannot be trusted once its bytes are damaged).
    """

    def __init__(
        self,
        detail: str = "",
        *,
        queue: str | None = None,
        key: bytes | None = None,
        msg_id: str | None = None,
    ) -> None:
        self.detail = detail
        self.queue = queue
        self.key = key
        self.msg_id = msg_id
        where = []
        if msg_id is not None:
            where.append(f"message {msg_id!r}")
        if queue is not None:
            where.append(f"in queue {queue!r}")
        if key is not None:
            where.append(f"at key {key!r}")
        super().__init__(
            "corrupt message" + (" " + " ".join(where) if where else "") + (f": {detail}" if detail else "")
        )


# The errors below belong to one part of the layer each; defined here, any module can raise
# them without importing that code. Import them from here (or from ``fdbqueue``).


class QueueNotFoundError(QueueError, KeyError):
    """No queue of that name exists."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "queue not found"


class NotJournaledError(QueueError):
    """The queue keeps no journal (and never kept one): ``journal`` of it would read nothing."""


class NotAnErrorQueueError(QueueError):
    """The queue is no error queue: no queue dead-letters to it and it holds no dead letter,
    so ``redrive`` of it would find nothing to send back."""


class UnsupportedLayerFormatError(QueueError):
    """The database holds queues of another, incompatible fdbqueue layer format."""


class LeaseError(QueueError):
    """The lease is unknown, was already settled, or has expired."""


class LeaseExpiredError(LeaseError):
    """The lease expired: the message was (or will be, at the next sweep) released."""


class InvalidPayloadError(QueueError, TypeError):
    """The payload is not bytes, str (that UTF-8 can encode), or JSON-serialisable."""


class PayloadTooLargeError(QueueError, ValueError):
    """The payload is larger than the queue's maximum."""


class HeadersTooLargeError(QueueError, ValueError):
    """The headers are larger than MAX_HEADERS_BYTES as stored (compact JSON)."""


class DedupKeyTooLargeError(QueueError, ValueError):
    """The dedup key is longer than MAX_DEDUP_KEY_BYTES in UTF-8."""


class ReasonTooLargeError(QueueError, ValueError):
    """The nack or dead-letter reason is longer than MAX_REASON_BYTES as stored (JSON)."""


class BudgetExceededError(QueueError, ValueError):
    """The operation must be atomic but does not fit one transaction's byte budget."""


class HandlerSignatureError(QueueError, TypeError):
    """The handler cannot be called the way the worker's mode calls it."""


class Retry(Exception):
    """Raised by a Worker's or Dispatcher's handler: deliver the message again after
    ``delay`` seconds (None: the queue's retry delay). It counts as a delivery: at
    max_deliveries the message goes to the error queue. Not logged as a failure."""

    def __init__(self, delay: float | None = None, reason: str | None = None) -> None:
        # Checked here, where the handler raises it: a bad delay found only by the worker's
        # nack would leave the message leased, out of sight, until its lease ended.
        if delay is not None and (
            isinstance(delay, bool) or not isinstance(delay, (int, float)) or not 0 <= delay < math.inf
        ):
            raise QueueError(f"Retry's delay must be a finite number of seconds >= 0 or None, got {delay!r}")
        if reason is not None and not isinstance(reason, str):
            raise QueueError(f"Retry's reason must be a str or None, got {type(reason).__name__}")
        super().__init__(reason or ("retry" if delay is None else f"retry after {delay} s"))
        self.delay = delay
        self.reason = reason or "retry requested by the handler"


class StopNow(BaseException):
    """A second SIGTERM/SIGINT, or a graceful stop past ``shutdown_timeout``: stop at once;
    the messages in hand go back. A BaseException, so that no handler's ``except Exception``
    swallows it."""


class Discard(Exception):
    """Raised by a Worker's or Dispatcher's handler: give up on the message now, whatever
    its deliveries, to the error queue with ``reason``."""

    def __init__(self, reason: str | None = None) -> None:
        if reason is not None and not isinstance(reason, str):
            raise QueueError(f"Discard's reason must be a str or None, got {type(reason).__name__}")
        reason = reason or "discarded by the handler"
        super().__init__(reason)
        self.reason = reason


class RemoteTraceback(Exception):
    """The traceback of a handler's exception in another process, as text (the ``__cause__``
    of a :class:`RemoteFailure`, so that a logged failure shows where the handler failed;
    ``concurrent.futures.process`` does the same)."""

    def __str__(self) -> str:
        return f'\n"""\n{self.args[0]}"""'


class RemoteFailure(Exception):
    """A handler's exception raised in a worker's child process: its type's name, text and
    traceback (``Worker(processes=N)``). ``engine``: the handler's own use of a failing store
    (``fdbqueue.runtime.handling.engine_failure``), not the message's fault."""

    def __init__(self, type_name: str, text: str, remote_traceback: str, *, engine: bool = False) -> None:
        super().__init__(text)
        self.type_name = type_name
        self.engine = engine
        self.__cause__ = RemoteTraceback(remote_traceback)


class ChildDied(Exception):
    """The child process running the handler died before it answered (killed, crashed, out
    of memory): the message's delivery failed."""


class AfterAckRefused(Exception):
    """The writes a handler asked to commit with its ack (``fdbqueue.ops.settling.AfterAck``)
    were refused for a reason no retry changes (the next task's queue is not the worker's
    principal's to enqueue on, is paused, full...): the attempt is abandoned, and the message
    is dead-lettered with ``reason`` instead of acked, so that it does not come back to fail
    the same way (a worker never stops on it)."""

    def __init__(self, message_id: str, reason: str) -> None:
        super().__init__(reason)
        self.message_id, self.reason = message_id, reason


class PoolStartError(QueueError):
    """A worker's child process (``processes=N``) could not start or could not load the
    handler: raised by ``Worker.run`` before it leases anything."""


class FaultScriptError(QueueError, TypeError):
    """A testing hook was given something other than a sim:// database, or a bad outcome."""


class RefusedActionError(QueueError):
    """An action the web dashboard does not take: it runs read-only, or the request did not
    come from its own page."""


class AccessDeniedError(QueueError):
    """A principal lacks a right on a queue; raised before the operation writes anything."""

    def __init__(self, principal: str, queue: str, right: str, why: str = "") -> None:
        self.principal = principal
        self.queue = queue
        self.right = right
        said = f"principal {principal!r} lacks right {right!r} on queue {queue!r}"
        super().__init__(f"{said} ({why})" if why else said)


class ForeignQueueError(QueueError):
    """Messages of a queue would go to a queue of another owner (its error queue, a route of
    a partitioned queue): refused, so that neither a stranger reads them nor a queue's owner
    gets messages no one with its rights sent. Nothing is written."""

    def __init__(
        self, queue: str, owner: str | None, target: str, target_owner: str | None, what: str
    ) -> None:
        self.queue, self.owner, self.target, self.target_owner = queue, owner, target, target_owner

        def whose(who: str | None) -> str:
            return "open to every principal" if who is None else f"owned by {who!r}"

        super().__init__(
            f"{what} of queue {queue!r} ({whose(owner)}) cannot go to {target!r} ({whose(target_owner)}): "
            f"they go only to a queue of the same owner; name a queue of {queue!r}'s owner instead"
        )


class MissingExtraError(QueueError, ImportError):
    """An optional integration's dependency is not installed: the message names the extra that
    installs it (``pip install '.[web]'`` in a checkout). An ImportError too, as the import it
    stands for."""

    def __init__(self, feature: str, extra: str, missing: str | None) -> None:
        self.feature, self.extra = feature, extra
        missing = missing.partition(".")[0] if missing else None  # the package, not its module
        lacking = f" ({missing} is not installed)" if missing else ""
        hint = f"pip install '.[{extra}]' in a checkout of fdbqueue"
        super().__init__(f"{feature} needs the {extra!r} extra: {hint}{lacking}")
        self.name = missing


# -- tasks -------------------------------------------------------------------------------------


class TaskArgumentsError(QueueError, TypeError):
    """A task was deferred (or a signature made) with arguments that do not bind to the
    function's signature, or that JSON cannot carry: refused before anything is written."""


class UnknownTaskError(QueueError, LookupError):
    """A task name no registry knows: refused by ``Tasks.defer_by_name``; a worker that meets
    one dead-letters the message with this error's text as the reason."""


class TaskFailedError(QueueError):
    """``Tasks.result``: the task failed for good (its message was dead-lettered: out of
    deliveries, discarded, past its time limit, or an unknown task). ``type`` and ``text`` are
    the exception's (``type`` is ``"time_limit"`` for a task that ran past its time limit),
    ``message_id`` the task's id."""

    def __init__(self, message_id: str, type_name: str, text: str) -> None:
        self.message_id = message_id
        self.type = type_name
        self.text = text
        super().__init__(
            f"task {message_id} failed: {type_name}: {text}"
            if text
            else f"task {message_id} failed: {type_name}"
        )


class TaskTimeLimitExceeded(Exception):
    """A task returned after its own ``time_limit`` (shorter than its worker's): a failed
    delivery, as if the worker had given up on it (raised by the task's runner)."""


class TaskTimeoutError(QueueError, TimeoutError):
    """``Tasks.result``: no result within the timeout (the task has not finished yet). A
    TimeoutError too."""


class NoResultError(QueueError, LookupError):
    """``Tasks.result``: nothing is kept for that id: not a task with ``store_result=True``,
    never deferred, or its result outlived its TTL."""
