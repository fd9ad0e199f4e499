"""fdbqueue: durable, transactional queues in an ordered transactional key-value store.

``fdbqueue.open(url)`` gives a Database (embedded sqlite by default, FoundationDB,
memory or the fault-injecting simulation); ``Queue(name)`` is a handle whose methods
take a Database (own retried transaction) or a Transaction (joins the caller's).
"""

from __future__ import annotations

from typing import Any

from fdbqueue.api.admin import (
    QueueStats,
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
from fdbqueue.api.queue import Queue, QueueFullError, QueueStoppedError
from fdbqueue.api.redrive import redrive
from fdbqueue.api.routing import PartitionedQueue, partitioned_queues, routes, set_route
from fdbqueue.api.schedules import Schedule, Scheduler, run_schedules, schedule, schedules, unschedule
from fdbqueue.api.transfer import move
from fdbqueue.engines import open_database as open
from fdbqueue.engines.contract import (
    Database,
    KeySelector,
    KeyValue,
    Transaction,
    Watch,
    transactional,
)
from fdbqueue.errors import (
    AccessDeniedError,
    ClusterUnavailableError,
    CommitUnknownError,
    CorruptMessageError,
    Discard,
    EngineError,
    ForeignQueueError,
    InvalidTextError,
    InvalidURLError,
    NestedTransactionError,
    NotAnErrorQueueError,
    NotJournaledError,
    QueueError,
    RefusedActionError,
    Retry,
    StoreError,
    StoreFullError,
    StoreLockedError,
    UnsupportedFormatError,
)
from fdbqueue.ops.autonomous import AutonomousId
from fdbqueue.ops.delivery import LeaseError, LeaseExpiredError
from fdbqueue.ops.journaling import history, journal, trim_journal
from fdbqueue.ops.sweep import SweepStats
from fdbqueue.runtime.dispatcher import Consumer, Dispatcher, DispatcherStats
from fdbqueue.runtime.forwarding import Forwarder, ForwardStats, forward
from fdbqueue.runtime.remote import RemoteQueue, RemoteStats
from fdbqueue.runtime.worker import HandlerSignatureError, Worker, WorkerStats
from fdbqueue.store.budget import BudgetExceededError
from fdbqueue.store.config import QueueConfig, QueueNotFoundError, QueueState, UnsupportedLayerFormatError
from fdbqueue.store.record import (
    ContentType,
    DedupKeyTooLargeError,
    HeadersTooLargeError,
    InvalidPayloadError,
    Message,
    PayloadTooLargeError,
    ReasonTooLargeError,
)
from fdbqueue.types import JournalEntry, NewMessage

__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    """``fdbqueue.spark``, imported only when used: it needs pyspark (the ``spark`` extra)."""
    if name == "spark":
        import importlib

        return importlib.import_module("fdbqueue.spark")
    raise AttributeError(f"module 'fdbqueue' has no attribute {name!r}")


__all__ = [
    "AccessDeniedError",
    "AutonomousId",
    "BudgetExceededError",
    "ClusterUnavailableError",
    "CommitUnknownError",
    "Consumer",
    "ContentType",
    "CorruptMessageError",
    "Database",
    "DedupKeyTooLargeError",
    "Discard",
    "Dispatcher",
    "DispatcherStats",
    "EngineError",
    "ForeignQueueError",
    "ForwardStats",
    "Forwarder",
    "HandlerSignatureError",
    "HeadersTooLargeError",
    "InvalidPayloadError",
    "InvalidTextError",
    "InvalidURLError",
    "JournalEntry",
    "KeySelector",
    "KeyValue",
    "LeaseError",
    "LeaseExpiredError",
    "Message",
    "NestedTransactionError",
    "NewMessage",
    "NotAnErrorQueueError",
    "NotJournaledError",
    "PartitionedQueue",
    "PayloadTooLargeError",
    "Queue",
    "QueueConfig",
    "QueueError",
    "QueueFullError",
    "QueueNotFoundError",
    "QueueState",
    "QueueStats",
    "QueueStoppedError",
    "ReasonTooLargeError",
    "RefusedActionError",
    "RemoteQueue",
    "RemoteStats",
    "Retry",
    "Schedule",
    "Scheduler",
    "StoreError",
    "StoreFullError",
    "StoreLockedError",
    "SweepStats",
    "Transaction",
    "UnsupportedFormatError",
    "UnsupportedLayerFormatError",
    "Watch",
    "Worker",
    "WorkerStats",
    "acl",
    "all_queue_stats",
    "create_queue",
    "destroy_queue",
    "forward",
    "grant",
    "history",
    "journal",
    "list_queues",
    "move",
    "open",
    "partitioned_queues",
    "purge_queue",
    "queue_config",
    "queue_rates",
    "queue_stats",
    "redrive",
    "revoke",
    "routes",
    "run_schedules",
    "schedule",
    "schedules",
    "set_route",
    "set_state",
    "start_queue",
    "stop_queue",
    "transactional",
    "trim_journal",
    "unschedule",
]
