"""Queue settings and state, stored in the database under each queue's subspace: their records,
codecs, reads and writes, and the metadata version every change of them writes (what an operation
reads of them, and the per-process cache of settings: ``store/meta.py``)."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from fdbqueue.engines.contract import ReadView, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.store.budget import DEFAULT_MAX_PAYLOAD, MAX_PAYLOAD_BYTES
from fdbqueue.store.layerformat import check_format, check_layer_format
from fdbqueue.store.layout import (
    LAYER_FORMAT,
    MAX_NAME_LENGTH,
    QueueKeys,
    validate_queue_name,
)
from fdbqueue.store.rates import parse_rate
from fdbqueue.types import MAX_DURATION_SECONDS, QueueState, check_duration


def error_queue_name(name: str) -> str:
    """The default error queue of queue ``name``: ``"<name>.error"``, always a valid name.

    A name too long for the suffix (more than ``MAX_NAME_LENGTH - 6`` characters) keeps a
    prefix and gains a digest of the whole name, so that the error queue of every valid
    name - an error queue's own error queue included - is valid and distinct: a derived
    name that could not be opened would make the first dead letter fail, and with it every
    sweep, dequeue and lease of the queue after it.
    """
    derived = f"{name}.error"
    if len(derived) <= MAX_NAME_LENGTH:
        return derived
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:12]
    return f"{name[: MAX_NAME_LENGTH - len(digest) - 7]}~{digest}.error"


def _valid_name(name: object) -> bool:
    try:
        validate_queue_name(name)
    except QueueError:
        return False
    return True


_DURATIONS = ("retry_delay", "max_retry_delay", "lease_seconds", "ttl", "dedup_window", "journal_retention")
MAX_RETRY_BACKOFF = 1000.0  # the growth factor per delivery; max_retry_delay caps the wait


OVERFLOW_POLICIES = ("reject", "block")
EXPIRY_ACTIONS = ("error", "discard")


@dataclass(frozen=True)
class QueueConfig:
    """A queue's settings. Stored as JSON; every field has a default."""

    max_size: int | None = None
    overflow: str = "reject"  # full queue: "reject" (QueueFull) or "block" (wait up to a timeout)
    max_deliveries: int = 5
    error_queue: str | None = None  # None: "<name>.error"
    retry_delay: float = 0.0
    retry_backoff: float = 1.0  # retry n waits retry_delay * retry_backoff ** (n - 1)
    max_retry_delay: float = 3600.0
    retry_jitter: float = 0.1  # a computed retry waits up to this fraction less, at random
    lease_seconds: float = 30.0
    ttl: float | None = None
    expiry_action: str = "error"  # expired messages: "error" (error queue, tag expired) or "discard"
    strict_order: bool = False
    max_payload: int = DEFAULT_MAX_PAYLOAD  # 1 MiB; at most MAX_PAYLOAD_BYTES (budget.py)
    dedup_window: float = 3600.0
    # The journal (Bernstein & Newcomer's queue manager keeps one for audit and for finding
    # lost messages): off by default, entries older than journal_retention are trimmed.
    journal: bool = False
    journal_retention: float = 7 * 86400.0
    # A volatile queue's commits skip fsync on the embedded engine: its messages survive a
    # process crash, not a power loss (the queue manager's volatile queues).
    volatile: bool = False
    # At most this many messages leased a period by all its consumers together ("50/s",
    # "1000/m", "10/h"; None: no limit): a token bucket in the database (ops/ratelimit.py).
    rate_limit: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # owner, privileges, description ...

    def __post_init__(self) -> None:
        if self.max_size is not None and (
            isinstance(self.max_size, bool) or not isinstance(self.max_size, int) or self.max_size < 1
        ):
            raise QueueError(f"max_size must be a positive int or None, got {self.max_size!r}")
        if self.overflow not in OVERFLOW_POLICIES:
            raise QueueError(f"overflow must be one of {OVERFLOW_POLICIES}, got {self.overflow!r}")
        if (
            isinstance(self.max_deliveries, bool)
            or not isinstance(self.max_deliveries, int)
            or self.max_deliveries < 1
        ):
            raise QueueError(f"max_deliveries must be an int >= 1, got {self.max_deliveries!r}")
        check_duration("retry_delay", self.retry_delay)
        check_duration("max_retry_delay", self.max_retry_delay)
        check_duration("lease_seconds", self.lease_seconds, positive=True)
        if self.ttl is not None:
            check_duration("ttl", self.ttl, positive=True)
        check_duration("dedup_window", self.dedup_window)
        check_duration("journal_retention", self.journal_retention, positive=True)
        for flag in ("journal", "volatile"):
            if not isinstance(getattr(self, flag), bool):
                raise QueueError(f"{flag} must be True or False, got {getattr(self, flag)!r}")
        jitter = self.retry_jitter
        if isinstance(jitter, bool) or not isinstance(jitter, (int, float)) or not 0 <= jitter <= 1:
            raise QueueError(f"retry_jitter must be a number from 0 to 1, got {jitter!r}")
        backoff = self.retry_backoff
        if (
            isinstance(backoff, bool)
            or not isinstance(backoff, (int, float))
            or not 0 < backoff <= MAX_RETRY_BACKOFF  # NaN fails both
        ):
            raise QueueError(
                f"retry_backoff must be a number > 0 and <= {MAX_RETRY_BACKOFF}, got {backoff!r}"
            )
        if self.expiry_action not in EXPIRY_ACTIONS:
            raise QueueError(f"expiry_action must be one of {EXPIRY_ACTIONS}, got {self.expiry_action!r}")
        if (
            isinstance(self.max_payload, bool)
            or not isinstance(self.max_payload, int)
            or not 1 <= self.max_payload <= MAX_PAYLOAD_BYTES
        ):
            raise QueueError(
                f"max_payload must be an int from 1 to {MAX_PAYLOAD_BYTES} (what one transaction "
                f"can move within FoundationDB's transaction limit), got {self.max_payload!r}"
            )
        if self.rate_limit is not None:
            parse_rate(self.rate_limit)
        if self.error_queue is not None:
            if not isinstance(self.error_queue, str):
                raise QueueError(f"error_queue must be a str or None, got {self.error_queue!r}")
            try:
                validate_queue_name(self.error_queue)
            except QueueError as exc:
                raise QueueError(f"error_queue must be a valid queue name: {exc}") from None

    def encode(self) -> bytes:
        # The layer format travels with the settings every operation reads, so a queue of
        # another format is refused on first use at no extra read.
        data = {**dataclasses.asdict(self), "format": LAYER_FORMAT}
        return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def decode(cls, raw: bytes) -> QueueConfig:
        data = json.loads(raw)
        check_format(str(data.get("format", "1.0")))  # 1.x stored none
        known = {f.name for f in dataclasses.fields(cls)}
        if isinstance(data.get("max_payload"), int) and data["max_payload"] > MAX_PAYLOAD_BYTES:
            data["max_payload"] = MAX_PAYLOAD_BYTES  # stored before the limit: the limit applies
        for name in _DURATIONS:  # stored before durations were bounded: the bound applies
            value = data.get(name)
            if isinstance(value, float) and value > MAX_DURATION_SECONDS:  # inf included
                data[name] = MAX_DURATION_SECONDS
        if data.get("error_queue") is not None and not _valid_name(data["error_queue"]):
            # Stored before names were checked: refusing to read it would wedge the queue
            # (every operation reads its settings); its dead letters take the default name.
            data["error_queue"] = None
        return cls(**{k: v for k, v in data.items() if k in known})

    def error_queue_for(self, name: str) -> str:
        """The queue ``name``'s dead letters go to: ``error_queue``, else :func:`error_queue_name`
        (also when ``error_queue`` is ``name`` itself, as an older version let it be stored:
        a dead letter must leave its queue)."""
        return self.error_queue if self.error_queue and self.error_queue != name else error_queue_name(name)

    def retry_wait(self, deliveries: int) -> float:
        """How long a message waits before its next delivery after ``deliveries`` deliveries:
        ``retry_delay * retry_backoff ** (deliveries - 1)``, at most ``max_retry_delay``, less
        a random part of up to ``retry_jitter`` of it. The jitter spreads the retries of
        messages that failed together (a dependency down) instead of sending them back in one
        wave ("Exponential Backoff And Jitter", AWS Architecture Blog, 2015); taken off, never
        added, so no retry waits longer than its settings say."""
        if self.retry_delay <= 0:
            return 0.0
        try:
            wait = min(self.max_retry_delay, self.retry_delay * self.retry_backoff ** max(0, deliveries - 1))
        except OverflowError:  # a backoff over 1 raised to many deliveries: past any maximum
            wait = self.max_retry_delay
        if self.retry_jitter:
            wait *= 1.0 - self.retry_jitter * random.random()
        return float(wait)

    def replace(self, **changes: Any) -> QueueConfig:
        return dataclasses.replace(self, **changes)


T = TypeVar("T")
_config_cache: dict[bytes, QueueConfig] = {}


def read_config(tr: ReadView, keys: QueueKeys) -> QueueConfig | None:
    """The queue's settings, or None when it does not exist (a serializable point read)."""
    raw = tr.get(keys.config)
    return None if raw is None else _decode_config(raw)


def decode_config(raw: bytes) -> QueueConfig:
    """Stored settings as a :class:`QueueConfig` (decoded once per distinct value)."""
    return _decode_config(raw)


def decode_state(raw: bytes | None) -> QueueState:
    """A stored state (None: both directions open), decoded once per distinct value."""
    return _OPEN if not raw else _decode_state(raw)


def _decode_config(raw: bytes) -> QueueConfig:
    global _last_config
    last = _last_config
    if last is not None and raw == last[0]:  # a compare, not a hash of a fresh 300-byte value
        return last[1]
    cfg = _decoded(_config_cache, raw, QueueConfig.decode, 1024)
    _last_config = (raw, cfg)
    return cfg


def _decoded(cache: dict[bytes, T], raw: bytes, decode: Callable[[bytes], T], bound: int) -> T:
    """``decode(raw)``, remembered: settings and state are read by every operation and
    change rarely. The cache is emptied past ``bound`` entries (someone writing junk)."""
    value = cache.get(raw)
    if value is None:
        value = decode(raw)
        if len(cache) > bound:
            cache.clear()
        cache[raw] = value
    return value


_last_config: tuple[bytes, QueueConfig] | None = None


def write_config(tr: Transaction, keys: QueueKeys, cfg: QueueConfig) -> None:
    check_layer_format(tr, keys)
    tr.set(keys.config, cfg.encode())
    bump_metadata_version(tr, keys)
    tr.set(keys.listing, b"")


def config_or_create(
    tr: Transaction, keys: QueueKeys, *, guarded_like: QueueKeys | None = None
) -> QueueConfig:
    """Settings of the queue, creating it with defaults on first use; a queue made here takes
    the owner and grants of ``guarded_like`` (an error queue its origin's: dead letters are
    as private as the messages they were)."""
    if guarded_like is None:
        raw, guard = tr.get(keys.config), None
    else:  # both in one round trip (a dead letter's path is bounded in them: budgets.md)
        raw, guard = tr.get_many([keys.config, guarded_like.guard])
    cfg = None if raw is None else _decode_config(raw)
    if cfg is None:
        cfg = QueueConfig()
        write_config(tr, keys, cfg)  # a new metadata version: the guard below is seen with it
        if guard is not None:
            tr.set(keys.guard, guard)
    elif cfg.volatile:
        tr.options.set_volatile_prefix(keys.q.key())
    return cfg


def read_state(tr: ReadView, keys: QueueKeys) -> QueueState:
    return QueueState.decode(tr.get(keys.state))


def bump_metadata_version(tr: Transaction, keys: QueueKeys) -> None:
    """Record that the queue's settings, state or priority markers change in ``tr``.

    A fresh random value rather than a counter: a version written by an attempt that then
    aborted can never be written again, so no cache entry made from it can ever match (the
    property FoundationDB gets from writing ``\\xff/metadataVersion`` with a versionstamp,
    ``fdbclient/ReadYourWrites.cpp`` ``atomicOp``). A blind write: it conflicts with nothing.
    """
    tr.set(keys.metadata_version, os.urandom(16))


_OPEN = QueueState()
_state_cache: dict[bytes, QueueState] = {}


def _decode_state(raw: bytes) -> QueueState:
    return _decoded(_state_cache, raw, QueueState.decode, 64)  # a handful of distinct values
