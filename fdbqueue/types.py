"""The types that the layer's modules share: a leaf module, importing nothing of the package
but errors.py, so that any module can name them without importing the code that makes them.
Import them from here (or, the public ones, from ``fdbqueue``).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, NamedTuple, Protocol

from fdbqueue.errors import QueueError

# The longest duration any setting or argument may give: ten years. Every duration becomes
# a number of database versions (``fdbqueue.store.clock.versions``, 1e6 per second) added to a read
# version; an unbounded one (``inf``) cannot, and a huge one would be accepted here only to
# make every later sweep, dequeue and lease of the queue fail.
MAX_DURATION_SECONDS = 10 * 365.25 * 86400.0


def check_where(where: object) -> dict[str, Any] | None:
    """A header filter (``where``) as a dict, or a clear error: it maps header names (str)
    to the values to match."""
    if where is None:
        return None
    if not isinstance(where, Mapping) or not all(isinstance(k, str) for k in where):
        raise QueueError(f"where must map header names (str) to values, got {where!r}")
    return dict(where)


_MISSING = object()


def headers_match(headers: Mapping[str, Any], where: Mapping[str, Any]) -> bool:
    """Whether a message's ``headers`` hold every value ``where`` asks for (a filter)."""
    return all(headers.get(k, _MISSING) == v for k, v in where.items())


def check_duration(name: str, value: object, *, positive: bool = False) -> float:
    """``value`` as seconds when it is a finite number from 0 (above 0 with ``positive``) to
    :data:`MAX_DURATION_SECONDS`, else a clear :class:`QueueError` naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise QueueError(f"{name} must be a number of seconds, not {value!r}")
    if value < 0 or (positive and value == 0):
        raise QueueError(f"{name} must be {'> 0' if positive else '>= 0'} seconds, got {value!r}")
    if value > MAX_DURATION_SECONDS:
        raise QueueError(
            f"{name} must be at most {MAX_DURATION_SECONDS:.0f} seconds (ten years of database "
            f"time), got {value!r}"
        )
    return float(value)


def check_flag(name: str, value: object) -> bool:
    """``value`` when it is True or False, else a clear :class:`QueueError` naming ``name``
    (``bool("no")`` is True: a string would turn an option on that its writer meant off)."""
    if not isinstance(value, bool):
        raise QueueError(f"{name} must be True or False, got {value!r}")
    return value


class ContentType(str, Enum):
    BYTES = "b"
    TEXT = "t"
    JSON = "j"


@dataclass(frozen=True)
class QueueState:
    """Whether each direction is open: a queue is started and stopped, and its enqueue and
    dequeue enabled, independently (Bernstein & Newcomer, "Principles of Transaction
    Processing", 4.5 The Queue Manager)."""

    enqueue: bool = True
    dequeue: bool = True

    def encode(self) -> bytes:
        return json.dumps({"enqueue": self.enqueue, "dequeue": self.dequeue}).encode()

    @classmethod
    def decode(cls, raw: bytes | None) -> QueueState:
        if not raw:
            return cls()
        data = json.loads(raw)
        return cls(enqueue=bool(data.get("enqueue", True)), dequeue=bool(data.get("dequeue", True)))


@dataclass(frozen=True, slots=True)
class NewMessage:
    """One message of an ``enqueue_many`` batch with options of its own (a bulk load's row);
    a field left None takes the value the call gives for the whole batch."""

    payload: object
    priority: int | None = None
    headers: Mapping[str, Any] | None = None
    delay: float | None = None
    ttl: float | None = None
    dedup_key: str | None = None


class Item(NamedTuple):
    """A message on its way in: checked and encoded, its place not yet made."""

    id: str  # "" for a ready message: its id is made from its key when written
    rand: bytes
    payload: bytes
    content_type: ContentType
    priority: int
    headers: dict[str, Any]
    delay: float
    ttl: float | None
    dedup_key: str | None
    fixed_id: bool = False  # the id must be known before the write (an autonomous enqueue)
    admitted: bool = False  # checked for room and a running queue already (an autonomous enqueue)
    origin: str | None = None  # forwarded from this queue of another database (journaled so)
    enqueued_us: int | None = None  # a forwarded message's enqueue time, kept (None: now)


class AutonomousId(str):
    """What an autonomous enqueue returns: the message id (a ``str``), and its ``outcome``.

    ``outcome`` is a :class:`concurrent.futures.Future`: its result is the id of the message
    stored (the first message's id on a dedup match), or the exception that kept it from
    being written. It is done at once where the enqueue committed at once (sim, memory,
    FoundationDB); on the embedded engine, once the caller's transaction has ended and the
    deferred write ran (see the module docstring).
    """

    outcome: Future[str]

    def __new__(cls, msg_id: str) -> AutonomousId:
        self = super().__new__(cls, msg_id)
        self.outcome = Future()
        return self

    @classmethod
    def written(cls, msg_id: str) -> AutonomousId:
        """An id whose message is stored already."""
        done = cls(msg_id)
        done.outcome.set_result(msg_id)
        return done


@dataclass
class SweepStats:
    """What one sweep moved."""

    leases: int = 0
    delayed: int = 0
    expired: int = 0
    dead: int = 0
    dedup: int = 0
    results: int = 0

    def total(self) -> int:
        return self.leases + self.delayed + self.expired + self.dedup + self.results

    def add(self, other: SweepStats) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))


@dataclass(frozen=True)
class QueueStats:
    """A queue's figures, as every view counts them (``fdbqueue/ops/views.py``): the atomic
    counters read at snapshot isolation, corrected by database time for what is due and not
    yet swept (a ready message past its TTL is expired, a due delayed one ready, an ended
    lease not in flight). ``expired`` includes those expired and not yet moved; ``errors``
    is the error queue's ready count as its own views say."""

    name: str
    ready: int
    inflight: int
    delayed: int
    errors: int  # messages waiting in the queue's error queue
    made_ready: int  # totals since creation: enqueued, retried or promoted messages...
    done: int  # ...and messages consumed (dequeued or acked)
    dead: int
    expired: int
    oldest_age: float | None  # seconds the oldest ready message has waited
    enqueue_enabled: bool
    dequeue_enabled: bool
    ready_rate: float | None = None  # messages/s made ready, over the sampled interval
    done_rate: float | None = None  # messages/s consumed
    corrupt: int = 0  # damaged records moved to the error queue (reason "corrupt"), total
    lease_ended: int = 0  # leased messages whose lease has ended, not yet released (not in flight)
    exact: bool = True  # False: more was due and unswept than a view reads (views.VIEW_SCAN_LIMIT)


@dataclass(frozen=True)
class Outlook:
    """What a dequeue would find beyond the counters, now: read-only, at snapshot isolation.

    ``expired_ready``: ready messages whose TTL has passed (counted as ready until moved);
    ``due_ready``: delayed messages that are due (a dequeue makes them ready first);
    ``due_expired``: due delayed messages whose TTL has passed too. ``complete`` is False
    when more than :data:`DUE_LIMIT` entries were due: the figures are then lower bounds.
    """

    expired_ready: int = 0
    due_ready: int = 0
    due_expired: int = 0
    complete: bool = True


class StoredFields(Protocol):
    """What :meth:`Message.from_record` reads of a stored record (``store/record.py``'s
    ``Record``): named by its fields, so that this leaf module imports no record code."""

    @property
    def id(self) -> str: ...
    @property
    def enqueued_us(self) -> int: ...
    @property
    def content_type(self) -> str: ...
    @property
    def headers(self) -> dict[str, Any]: ...
    @property
    def deliveries(self) -> int: ...
    @property
    def expires_us(self) -> int | None: ...
    @property
    def extra(self) -> dict[str, Any]: ...


_FROM_RECORD = object()  # Message.from_record's expires_at: not given
_NOTHING: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Message:
    """A message handed out by a queue. ``payload`` is always bytes."""

    id: str
    payload: bytes
    queue: str
    priority: int
    enqueued_at: float
    deliveries: int
    headers: Mapping[str, Any]
    content_type: ContentType
    expires_at: float | None = None
    key: bytes = b""  # its place in the ready order: where a release puts it back
    receipt: str | None = None  # the lease it was handed out under (worker mode)
    lease_deadline: float | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)

    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)

    @property
    def reason(self) -> str | None:
        """Why a message is in an error queue (``max_deliveries``, ``expired``, a nack reason)."""
        r = self.extra.get("reason")
        return None if r is None else str(r)

    @property
    def origin(self) -> str | None:
        """The queue a dead-lettered message came from."""
        o = self.extra.get("origin")
        return None if o is None else str(o)

    @classmethod
    def from_record(
        cls,
        rec: StoredFields,
        queue: str,
        priority: int,
        key: bytes,
        payload: bytes,
        *,
        delivered: bool = False,
        receipt: str | None = None,
        lease_deadline: float | None = None,
        expires_at: float | object | None = _FROM_RECORD,
    ) -> Message:
        """The Message for ``rec``; ``delivered`` counts the delivery it is handed out in.
        ``expires_at`` (a wall-clock estimate) when the caller made one; else the record's
        TTL in seconds, as stored."""
        expires = rec.expires_us
        if expires_at is _FROM_RECORD:
            expires_at = None if expires is None else expires / 1e6
        headers = rec.headers
        extra = rec.extra
        # Every field is given, so the frozen dataclass's __init__ (13 checked setattr calls,
        # on the path of every message handed out) is skipped: the instance is the same. An
        # empty mapping is the one read-only empty view, not a copy each time (read-only:
        # nothing can change it; equal to any empty mapping).
        m = object.__new__(cls)
        m.__dict__.update(
            {
                "id": rec.id,
                "payload": payload,
                "queue": queue,
                "priority": priority,
                "enqueued_at": rec.enqueued_us / 1e6,
                "deliveries": rec.deliveries + delivered,
                "headers": MappingProxyType(dict(headers)) if headers else _NOTHING,
                "content_type": _CONTENT_TYPES[rec.content_type],
                "expires_at": expires_at,
                "key": key,
                "receipt": receipt,
                "lease_deadline": lease_deadline,
                "extra": MappingProxyType(dict(extra)) if extra else _NOTHING,
            }
        )
        return m

    @classmethod
    def handed_out(
        cls,
        queue: str,
        priority: int,
        key: bytes,
        msg_id: str,
        enqueued_us: int,
        content_type: str,
        headers: Mapping[str, Any],
        deliveries: int,
        payload: bytes,
    ) -> Message:
        """``from_record(rec, queue, priority, key, payload, delivered=True)`` of a record with
        no TTL and nothing extra (a dequeue of the head: ``ops/head.py`` ``take_short``), given
        its fields as decoded, without a record: the same Message."""
        m = object.__new__(cls)
        m.__dict__.update(
            {
                "id": msg_id,
                "payload": payload,
                "queue": queue,
                "priority": priority,
                "enqueued_at": enqueued_us / 1e6,
                "deliveries": deliveries + True,
                "headers": MappingProxyType(dict(headers)) if headers else _NOTHING,
                "content_type": _CONTENT_TYPES[content_type],
                "expires_at": None,
                "key": key,
                "receipt": None,
                "lease_deadline": None,
                "extra": _NOTHING,
            }
        )
        return m


_CONTENT_TYPES = {ct.value: ct for ct in ContentType}


# The rights a principal may hold on a queue, in the order of their bits in the stored mask.
RIGHTS = ("enqueue", "dequeue", "browse", "admin")
ANONYMOUS = "anonymous"  # the principal of a database opened without one
MAX_PRINCIPAL = 256  # characters


def check_principal(value: object) -> str:
    """A principal's name: a non-empty str of at most MAX_PRINCIPAL printable characters."""
    if not isinstance(value, str) or not value:
        raise QueueError(f"a principal is a non-empty str, got {value!r}")
    if len(value) > MAX_PRINCIPAL or not value.isprintable():
        raise QueueError(f"a principal is at most {MAX_PRINCIPAL} printable characters, got {value!r}")
    return value


@dataclass(frozen=True)
class JournalEntry:
    """One entry of a queue's journal: an operation on a message, or on the queue.

    ``version``: the 12-byte versionstamp of the transaction that made it (commit order);
    ``at``: the wall clock then, seconds (for people, not for ordering); ``message_id`` is
    None for queue-level entries (purge, destroy, config, grant ...).
    """

    version: bytes
    at: float
    op: str
    queue: str
    message_id: str | None
    principal: str
    deliveries: int = 0
    reason: str | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        """The entry as JSON values: ``version`` in hex, ``at`` in seconds since the epoch."""
        return {
            "version": self.version.hex(),
            "at": self.at,
            "op": self.op,
            "queue": self.queue,
            "message_id": self.message_id,
            "principal": self.principal,
            "deliveries": self.deliveries,
            "reason": self.reason,
            "details": self.details,
        }


@dataclass
class ForwardStats:
    """What a forward did: messages forwarded, found installed already (an earlier attempt's),
    attempts retried after a failure of either side, and the lag: seconds from a message's
    enqueue to its arrival, for the last one forwarded."""

    forwarded: int = 0
    skipped: int = 0
    retried: int = 0
    lag: float | None = None
