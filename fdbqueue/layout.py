"""Every key fdbqueue writes, in one place.

All keys are tuple-encoded (``fdb.tuple``) under a root subspace, ``("fdbqueue",)`` by
default. ``Q`` below is ``root + ("q", queue_name)``::

    root + ("format",)                          layer format version, "MAJOR.MINOR"
    root + ("queues", name)                     b"" for every queue that exists (listing)
    Q + ("cfg",)                                queue settings, JSON
    Q + ("st",)                                 queue state flags, JSON (paused directions)
    Q + ("r", -priority, index, rand)           ready messages: higher priority first, FIFO within
    Q + ("id", msg_id)                          id index -> the message's current key
    Q + ("b", msg_id, chunk)                    payload chunks of a large message
    Q + ("f", msg_id)                           in-flight (leased) message record
    Q + ("l", deadline_us, msg_id)              lease deadlines (sweep order)
    Q + ("d", due_us, msg_id)                   delayed messages by due time
    Q + ("x", expires_us, msg_id)               TTL index by expiry time
    Q + ("k", dedup_key)                        dedup key -> b"<message id>|<first-seen us>"
    Q + ("kt", time_us, dedup_key)              dedup entries by time (the sweep forgets old ones)
    Q + ("pop", index, rand)                    staged dequeue requests (high contention)
    Q + ("res", rand)                           fulfilled staged requests -> message record
    Q + ("pri", -priority)                      priorities in use (browse looks back over them)
    Q + ("n", counter)                          8-byte little-endian counters, atomic adds only
    Q + ("hwm",)                                highest index handed out, atomic max only
    Q + ("n", "wake")                           grows whenever messages become ready (or dequeue
                                                is re-enabled); blocking dequeues watch it
    Q + ("rc", time_us, rand)                   enqueue/dequeue receipts: settle a commit_unknown_result
    root + ("j", versionstamp)                  journal: one entry per operation, commit order

Index = the queue's high-water mark, read at snapshot isolation, plus one; the random
suffix breaks ties, so concurrent enqueues never conflict (FoundationDB queue recipe).
A high-water mark (rather than the last ready key) keeps indexes increasing after the
queue drains, so a released message goes back ahead of every newer one.
"""

from __future__ import annotations

import importlib
import json
import os
import struct
import types
from dataclasses import dataclass
from typing import Any

import fdb.tuple
from fdb.subspace_impl import Subspace

from fdbqueue.errors import QueueError

LAYER_FORMAT = "1.0"
DEFAULT_ROOT: tuple[Any, ...] = ("fdbqueue",)

# ready/inflight/delayed: messages in each state now; enqueued/done/dead/expired: totals
# ever (rates come from two samples); wake: bumped whenever messages become ready.
COUNTERS = ("ready", "inflight", "delayed", "enqueued", "done", "dead", "expired", "wake")

_ONE = struct.pack("<q", 1)
_MINUS_ONE = struct.pack("<q", -1)


def _allow_versionstamps_without_native_client() -> None:
    """Let ``fdb.tuple`` pack Versionstamps when libfdb_c is absent.

    ``Versionstamp.to_bytes`` checks ``isinstance(x, fdb.impl.Value)``; importing
    ``fdb.impl`` loads the native library. Where it cannot load, a stand-in module
    whose ``Value`` nothing is an instance of gives the same result.
    """
    if hasattr(fdb, "impl"):
        return
    try:
        importlib.import_module("fdb.impl")  # loads libfdb_c when it is installed
    except Exception:
        stub = types.ModuleType("fdb.impl")

        class Value(bytes):
            """Never instantiated: no packed value is an fdb future here."""

        setattr(stub, "Value", Value)  # noqa: B010 - a module attribute mypy cannot see
        # The attribute only, not sys.modules: fdb.api_version() must still find the real module.
        setattr(fdb, "impl", stub)  # noqa: B010


_allow_versionstamps_without_native_client()

# ---------------------------------------------------------------------------------------------


def _pack(sub: Subspace, parts: tuple[Any, ...]) -> bytes:
    key: bytes = sub.pack(parts)  # fdb.tuple is untyped: name the type once, here
    return key


def pack_count(n: int) -> bytes:
    return struct.pack("<q", n)


def unpack_count(raw: bytes | None) -> int:
    if not raw:
        return 0
    return int(struct.unpack("<q", raw.ljust(8, b"\x00")[:8])[0])


def new_rand() -> bytes:
    return os.urandom(8)


def validate_queue_name(name: object) -> str:
    if not isinstance(name, str):
        raise QueueError(f"queue name must be a str, not {type(name).__name__}")
    if not name or len(name) > 200:
        raise QueueError(f"queue name must be 1 to 200 characters, got {len(name)}")
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        raise QueueError(f"queue name {name!r} contains control characters")
    return name


@dataclass(frozen=True)
class QueueKeys:
    """The subspaces of one queue (pure computation, no I/O)."""

    name: str
    root: Subspace
    q: Subspace

    @classmethod
    def make(cls, name: str, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueKeys:
        r = Subspace(tuple(root))
        return cls(validate_queue_name(name), r, r[("q")][name])

    # -- single keys ---------------------------------------------------------------------------
    @property
    def config(self) -> bytes:
        return _pack(self.q, ("cfg",))

    @property
    def state(self) -> bytes:
        return _pack(self.q, ("st",))

    @property
    def hwm(self) -> bytes:
        return _pack(self.q, ("hwm",))

    @property
    def wake(self) -> bytes:
        """Grows with every message made ready; blocking dequeues watch it (no spurious wake-ups)."""
        return _pack(self.q, ("n", "wake"))

    @property
    def listing(self) -> bytes:
        return _pack(self.root, ("queues", self.name))

    @property
    def format(self) -> bytes:
        return _pack(self.root, ("format",))

    def counter(self, name: str) -> bytes:
        return _pack(self.q, ("n", name))

    # -- ready items ---------------------------------------------------------------------------
    def ready_key(self, priority: int, index: int, rand: bytes) -> bytes:
        return _pack(self.q, ("r", -priority, index, rand))

    def ready_range(self) -> tuple[bytes, bytes]:
        r = self.q.range(("r",))
        return r.start, r.stop

    def priority_range(self, priority: int, from_index: int | None = None) -> tuple[bytes, bytes]:
        r = self.q.range(("r", -priority))
        start = r.start if from_index is None else self.q.pack(("r", -priority, from_index))
        return start, r.stop

    def parse_ready(self, key: bytes) -> tuple[int, int, bytes]:
        """(priority, index, rand) of a ready key."""
        _, negp, index, rand = self.q.unpack(key)
        return -negp, index, rand

    # -- other states --------------------------------------------------------------------------
    def id_key(self, msg_id: str) -> bytes:
        return _pack(self.q, ("id", msg_id))

    def chunk_key(self, msg_id: str, n: int) -> bytes:
        return _pack(self.q, ("b", msg_id, n))

    def chunk_range(self, msg_id: str) -> tuple[bytes, bytes]:
        r = self.q.range(("b", msg_id))
        return r.start, r.stop

    def inflight_key(self, msg_id: str) -> bytes:
        return _pack(self.q, ("f", msg_id))

    def lease_key(self, deadline_us: int, msg_id: str) -> bytes:
        return _pack(self.q, ("l", deadline_us, msg_id))

    def delayed_key(self, due_us: int, msg_id: str) -> bytes:
        return _pack(self.q, ("d", due_us, msg_id))

    def expiry_key(self, expires_us: int, msg_id: str) -> bytes:
        return _pack(self.q, ("x", expires_us, msg_id))

    def dedup_key(self, key: str) -> bytes:
        return _pack(self.q, ("k", key))

    def dedup_time_key(self, time_us: int, key: str) -> bytes:
        return _pack(self.q, ("kt", time_us, key))

    def index_range(self, tag: str, upto_us: int | None = None) -> tuple[bytes, bytes]:
        """The deadline-ordered index ``tag`` ('l', 'd', 'x'), up to (excluding) ``upto_us``."""
        r = self.q.range((tag,))
        return r.start, (r.stop if upto_us is None else self.q.pack((tag, upto_us)))

    def receipt_key(self, time_us: int, rand: bytes) -> bytes:
        return _pack(self.q, ("rc", time_us, rand))

    def pop_key(self, index: int, rand: bytes) -> bytes:
        return _pack(self.q, ("pop", index, rand))

    def pop_range(self) -> tuple[bytes, bytes]:
        r = self.q.range(("pop",))
        return r.start, r.stop

    def result_key(self, rand: bytes) -> bytes:
        return _pack(self.q, ("res", rand))

    def priority_marker(self, priority: int) -> bytes:
        return _pack(self.q, ("pri", -priority))

    def priority_marker_range(self) -> tuple[bytes, bytes]:
        r = self.q.range(("pri",))
        return r.start, r.stop

    def all_range(self) -> tuple[bytes, bytes]:
        r = self.q.range()
        return r.start, r.stop

    def unpack_tail(self, key: bytes) -> tuple[Any, ...]:
        return tuple(self.q.unpack(key))


def root_subspace(root: tuple[Any, ...] = DEFAULT_ROOT) -> Subspace:
    return Subspace(tuple(root))


def queues_range(root: tuple[Any, ...] = DEFAULT_ROOT) -> tuple[bytes, bytes]:
    r = root_subspace(root).range(("queues",))
    return r.start, r.stop


def journal_key_template(root: tuple[Any, ...], user_version: int = 0) -> bytes:
    """A journal key for ``set_versionstamped_key`` (stamp filled in at commit)."""
    key: bytes = root_subspace(root).pack_with_versionstamp(
        ("j", fdb.tuple.Versionstamp(user_version=user_version))
    )
    return key

    return key


def journal_range(root: tuple[Any, ...] = DEFAULT_ROOT) -> tuple[bytes, bytes]:
    r = root_subspace(root).range(("j",))
    return r.start, r.stop


def encode_json(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), sort_keys=True).encode()


def decode_json(raw: bytes) -> Any:
    return json.loads(raw)


ONE = _ONE
MINUS_ONE = _MINUS_ONE
