"""fdbqueue: durable, transactional queues in an ordered transactional key-value store.

``fdbqueue.open(url)`` gives a Database (embedded sqlite by default, FoundationDB,
memory or the fault-injecting simulation); ``Queue(name)`` is a handle whose methods
take a Database (own retried transaction) or a Transaction (joins the caller's).
"""

from __future__ import annotations

from typing import Any

from fdbqueue.api.admin import (
    acl,
    all_queue_stats,
    create_queue,
    destroy_queue,
    grant,
    list_queues,
    purge_queue,
    queue_config,
    queue_rates,
    queue_stats,
    revoke,
    set_state,
    start_queue,
    stop_queue,
)
from fdbqueue.api.queue import Queue
from fdbqueue.api.redrive import redrive
from fdbqueue.api.routing import PartitionedQueue, partitioned_queues, routes, set_route
from fdbqueue.api.schedules import Schedule, Scheduler, run_schedules, schedule, schedules, unschedule
from fdbqueue.api.transfer import move
from fdbqueue.api.workers import CurrentMessage, WorkerInfo, prune_workers, workers
from fdbqueue.engines import open_database as open
from fdbqueue.engines.contract import Database, KeySelector, KeyValue, Transaction, Watch
from fdbqueue.engines.transactional import transactional
from fdbqueue.errors import (
    AccessDeniedError,
    BudgetExceededError,
    ClusterUnavailableError,
    CommitUnknownError,
    CorruptMessageError,
    DedupKeyTooLargeError,
    Discard,
    EngineError,
    ForeignQueueError,
    HandlerSignatureError,
    HeadersTooLargeError,
    InvalidPayloadError,
    InvalidTextError,
    InvalidURLError,
    LeaseError,
    LeaseExpiredError,
    NestedTransactionError,
    NoResultError,
    NotAnErrorQueueError,
    NotJournaledError,
    PayloadTooLargeError,
    PoolStartError,
    QueueError,
    QueueFullError,
    QueueNotFoundError,
    QueueStoppedError,
    ReasonTooLargeError,
    RefusedActionError,
    Retry,
    StoreError,
    StoreFullError,
    StoreLockedError,
    TaskArgumentsError,
    TaskFailedError,
    TaskTimeoutError,
    UnknownTaskError,
    UnsupportedFormatError,
    UnsupportedLayerFormatError,
)
from fdbqueue.ops.journal_trim import trim_journal
from fdbqueue.ops.journaling import history, journal
from fdbqueue.runtime.dispatcher import Consumer, Dispatcher, DispatcherStats
from fdbqueue.runtime.forwarding import Forwarder, forward
from fdbqueue.runtime.handling import WorkerStats
from fdbqueue.runtime.remote import RemoteQueue, RemoteStats
from fdbqueue.runtime.worker import Worker
from fdbqueue.store.config import QueueConfig
from fdbqueue.tasks import Tasks
from fdbqueue.types import (
    AutonomousId,
    ContentType,
    ForwardStats,
    JournalEntry,
    Message,
    NewMessage,
    QueueState,
    QueueStats,
    SweepStats,
)

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``fdbqueue.spark``, imported only when used: it needs pyspark (the ``spark`` extra)."""
    if name == "spark":
        import importlib

        return importlib.import_module("fdbqueue.spark")
    raise AttributeError(f"module 'fdbqueue' has no attribute {name!r}")


# The public names by role (docs/api.md describes each). Every other module is private but for
# fdbqueue.aio, fdbqueue.testing, fdbqueue.errors and the integrations (fdbqueue.cli, .web,
# .spark, .runtime.metrics), each behind the extra it names when missing.
__all__ = [  # noqa: RUF022 (grouped by role, not sorted)
    # -- opening a store and running transactions
    "open",
    "transactional",
    "Database",
    "Transaction",
    "KeySelector",
    "KeyValue",
    "Watch",
    # -- the queue
    "Queue",
    # -- the queue manager
    "create_queue",
    "destroy_queue",
    "list_queues",
    "queue_config",
    "set_state",
    "start_queue",
    "stop_queue",
    "purge_queue",
    "queue_stats",
    "all_queue_stats",
    "queue_rates",
    "QueueConfig",
    "QueueState",
    "QueueStats",
    # -- the journal
    "journal",
    "history",
    "trim_journal",
    "JournalEntry",
    # -- privileges
    "grant",
    "revoke",
    "acl",
    # -- moving, forwarding and routing
    "move",
    "forward",
    "Forwarder",
    "ForwardStats",
    "RemoteQueue",
    "RemoteStats",
    "PartitionedQueue",
    "partitioned_queues",
    "set_route",
    "routes",
    # -- workers and dispatch (a handler raises Retry or Discard)
    "Worker",
    "WorkerStats",
    "Dispatcher",
    "DispatcherStats",
    "Consumer",
    "Retry",
    "Discard",
    "Tasks",  # task functions deferred as messages, their results and chains (docs/tasks.md)
    "workers",
    "prune_workers",
    "WorkerInfo",
    "CurrentMessage",
    # -- schedules (periodic enqueues)
    "schedule",
    "schedules",
    "unschedule",
    "run_schedules",
    "Schedule",
    "Scheduler",
    # -- operations
    "redrive",
    "SweepStats",
    # -- errors: every one a QueueError
    "QueueError",
    "AccessDeniedError",
    "BudgetExceededError",
    "ClusterUnavailableError",
    "CommitUnknownError",
    "CorruptMessageError",
    "DedupKeyTooLargeError",
    "EngineError",
    "ForeignQueueError",
    "HandlerSignatureError",
    "HeadersTooLargeError",
    "InvalidPayloadError",
    "InvalidTextError",
    "InvalidURLError",
    "LeaseError",
    "LeaseExpiredError",
    "NestedTransactionError",
    "NotAnErrorQueueError",
    "NotJournaledError",
    "PayloadTooLargeError",
    "PoolStartError",
    "QueueFullError",
    "QueueNotFoundError",
    "QueueStoppedError",
    "ReasonTooLargeError",
    "RefusedActionError",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "TaskArgumentsError",
    "TaskFailedError",
    "TaskTimeoutError",
    "NoResultError",
    "UnknownTaskError",
    "UnsupportedFormatError",
    "UnsupportedLayerFormatError",
    # -- types: what the calls take and return
    "Message",
    "NewMessage",
    "ContentType",
    "AutonomousId",
]
