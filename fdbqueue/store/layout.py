"""Every key fdbqueue writes, in one place.

All keys are tuple-encoded (``fdb.tuple``) under a root subspace, ``("fdbqueue",)`` by
default. ``Q`` below is ``root + ("q", queue_name)``::

    root + ("format",)                          layer format version, "MAJOR.MINOR"
    root + ("queues", name)                     b"" for every queue that exists (listing)
    root + ("wk", name)                         the work index: queue ``name`` may have work;
                                                b"" now, or 8 bytes: not before that version
    root + ("ws", token)                        an idle many-queue consumer asleep: what it serves
                                                (JSON); it watches this key, and whoever gives
                                                a matching queue work clears it (one wakes)
    root + ("wc", name)                         a consumer serving queue ``name`` (8-byte version
                                                until which, then its 8-byte token): others
                                                visit the queue last in their turns
    root + ("wkf",)                             the work index was filled from the listing
    root + ("tres", message_id)                 a task's result (store_result=True), JSON
    root + ("texp", expires, message_id)        task results by expiry (a version): swept
    root + ("rt", name, value)                  partitioned queue ``name``: where ``value`` goes
    root + ("pq", name)                         partitioned queue ``name``: {"partitions": N}
    root + ("eq", error_queue, origin)          owned queue ``origin``'s error queue is reserved
                                                to its owner and admins (privileges.py)
    root + ("rl", name, shard)                  a named rate limit's token bucket, one key a
                                                shard: tokens left, version counted at
    root + ("wr", worker_id)                    a running worker's record (JSON), rewritten by
                                                its heartbeat; expired ones cleared later
    ("fdbqueue", "time")                        the database's time correction: versions that
                                                were not time (a recovery's jump), store/clock.py;
                                                one per database, at the default root
    Q + ("m", "cfg")                            queue settings, JSON
    Q + ("m", "st")                             queue state flags, JSON (paused directions)
    Q + ("m", "n", counter)                     8-byte little-endian counters, atomic adds only
    Q + ("m", "pri", -priority)                 priorities in use (browse looks back over them)
    Q + ("m", "mv")                             the queue's metadata version: a fresh random value
                                                written with every change of settings, state or
                                                priority markers (see ``meta.read_meta``)
    Q + ("r", -priority, index, rand)           ready messages: higher priority first, FIFO within
    Q + ("id", msg_id)                          id index -> the message's current key, for messages
                                                delayed, or ready away from the home key
                                                their id names (below)
    Q + ("b", msg_id, chunk)                    payload chunks of a large message
    Q + ("eh", msg_id, stamp)                   the journal's history pointer of a consuming
                                                operation on the embedded engine, before issue
                                                30's ninth pass (since then "mh"); read, kept
    Q + ("ej", stamp)                           the queue's journal entries on the embedded engine
                                                (issue 30's ninth pass; JournalKeys: before it,
                                                and on FoundationDB, under ("j", ...)); a destroy
                                                keeps them
    Q + ("f", msg_id)                           in-flight (leased) message record: found by its id,
                                                so a leased message has no id entry
    Q + ("l", deadline, msg_id)                 lease deadlines (sweep order)
    Q + ("lj",)                                 the queue's journal bell on the embedded engine
                                                (JournalKeys.queue_bell)
    Q + ("d", due, msg_id)                      delayed messages by due time
    Q + ("x", expires, msg_id)                  TTL index by expiry time
    Q + ("k", dedup_key)                        dedup key -> b"<message id>|<first-seen version>"
    Q + ("kt", version, dedup_key)              dedup entries by time (the sweep forgets old ones)
    Q + ("pop", version, rand)                  staged dequeue requests (high contention)
    Q + ("res", rand)                           fulfilled staged requests -> version, message record
    Q + ("mh", msg_id, stamp)                   the journal's history pointer of a consuming
                                                operation on the embedded engine: the entry's
                                                shard (JournalKeys; a destroy keeps them)
    Q + ("m", "n", "wake")                      grows by one for every message made ready (and when
                                                dequeue is re-enabled): the index high-water mark,
                                                and the key blocking dequeues watch
    Q + ("m", "n", "taken")                     ready messages taken by the embedded engine's
                                                common dequeue (head.take_short), counted in this
                                                one key instead of ready and done: the queue's
                                                ready is ready - taken, its done done + taken
                                                (absent, as in every store made before it and on
                                                FoundationDB: 0); a purge folds it into done
    Q + ("m", "n", "counted")                   what of wake the ready counter holds: the embedded
                                                engine's common enqueue (enqueuing._plain_step)
                                                counts itself in wake alone, every other writer of
                                                wake adds here too where it is present, so the
                                                queue's ready is ready - taken + (wake - counted)
                                                (absent, as in every store made before it and on
                                                FoundationDB: ready - taken); a purge clears it
    Q + ("rc", version, rand)                   enqueue/dequeue receipts: settle a commit_unknown_result
    Q + ("rl", shard)                           the queue's rate limit's token bucket (rates.py)

Times are database time (layer format 2): read versions, about 1e6 a second
(``fdbqueue.store.clock``), never a client's wall clock. A deadline, due or expiry time is the
read version of the transaction that set it plus its seconds in versions; a receipt,
request, result or dedup entry carries the read version of the transaction that made it;
each is compared with the read version of the transaction that looks. The record fields
and ``extra`` entries holding times are versions too (``expires_us``, ``deadline``,
``not_before``), except ``enqueued_us`` and a lease's ``until``: wall-clock microseconds,
for people to read (``Message.enqueued_at``, ``Message.lease_deadline``).

Index = the queue's wake counter, read at snapshot isolation, plus one; the random
suffix breaks ties, so concurrent enqueues never conflict (FoundationDB queue recipe).
That counter (rather than the last ready key) keeps indexes increasing after the queue
drains, so a released message goes back ahead of every newer one; and being the key
that wakes blocked dequeuers too, it costs an enqueue no extra write.

A message enqueued ready gets the id "r" + hex(-priority, index, rand): its id names its home
key, so enqueue and dequeue write no id-index entry; a leased message is found at
``("f", id)``, so lease and ack write none either. Delayed messages, and ready ones away
from home (dead-lettered, or given ids before their place was known), have one.

The small per-queue keys live together under ``Q + ("m",)``: one range read fetches a
queue's settings, state, counters and mark, and their writes dirty one page, not five.
"""

from __future__ import annotations

import zlib
from typing import Any

import fdb.tuple
from fdb.subspace_impl import Subspace

from fdbqueue.errors import QueueError
from fdbqueue.store.codec import (
    dec_int,
    enc_int,
    enc_str,
    incomplete_stamp,
    pack_one,
    unpack_count,
    utf8,
    version_of,
    versionstamp,
)

# 2.0: every stored time is database time (versions), where 1.x stored wall-clock µs.
LAYER_FORMAT = "2.0"
DEFAULT_ROOT: tuple[Any, ...] = ("fdbqueue",)
# The database's time correction (store/clock.py): versions are the database's, not a root's.
TIME_KEY: bytes = bytes(fdb.tuple.pack((*DEFAULT_ROOT, "time")))

# ready/inflight/delayed: messages in each state now; done/dead/expired: totals ever (rates
# come from two samples); wake: messages ever made ready (enqueues, retries, promotions);
# corrupt: damaged records moved to the error queue (delivery.move_corrupt); taken: ready
# messages dequeued that the ready and done counters do not show yet (ready_count, done_count);
# counted: what of wake the ready counter holds (absent: all of it; ready_count).
COUNTERS = ("ready", "inflight", "delayed", "done", "dead", "expired", "wake", "corrupt", "taken", "counted")
HOT_COUNTERS = ("ready", "inflight", "delayed", "wake")  # what an enqueue or dequeue needs to know


#: The counters :func:`ready_count` takes, in its order.
READY_PARTS = ("ready", "taken", "wake", "counted")


def ready_count(
    ready: bytes | None, taken: bytes | None, wake: bytes | None = None, counted: bytes | None = None
) -> int:
    """A queue's ready messages from its ready, taken, wake and counted counters as stored
    (never below 0): ready - taken, plus wake - counted where counted is present (what short
    enqueues counted in wake alone)."""
    n = unpack_count(ready) - unpack_count(taken)
    if counted is not None:
        n += unpack_count(wake) - unpack_count(counted)
    return max(0, n)


def done_count(done: bytes | None, taken: bytes | None) -> int:
    """A queue's done total from its done and taken counters as stored (never below 0)."""
    return max(0, unpack_count(done) + unpack_count(taken))


# ---------------------------------------------------------------------------------------------


def _pack(sub: Subspace, parts: tuple[Any, ...]) -> bytes:
    key: bytes = sub.pack(parts)  # fdb.tuple is untyped: name the type once, here
    return key


MAX_NAME_LENGTH = 200  # characters of a queue name (an error queue's derived name included)


def validate_queue_name(name: object) -> str:
    """``name`` when it is a valid queue name, else a clear :class:`QueueError`."""
    if not isinstance(name, str):
        raise QueueError(f"queue name must be a str, not {type(name).__name__}")
    if not name or len(name) > MAX_NAME_LENGTH:
        raise QueueError(f"queue name must be 1 to {MAX_NAME_LENGTH} characters, got {len(name)}")
    if any(ord(c) < 32 or c == "\x7f" for c in name):
        raise QueueError(f"queue name {name!r} contains control characters")
    utf8(name, f"queue name {name!r}")
    return name


_PRI = b"\x02pri\x00"  # enc_str("pri")
_BIG = (1 << 64) - 1  # enc_int's bound of the short codes
_INT_CODES = [bytes((0x14 + size,)) for size in range(9)]  # a positive int of size bytes


# The tags under a queue's subspace that hold messages or their indexes (a purge clears them):
# ready, id entries, chunks, leased, lease entries, delayed, TTL entries, dedup entries and
# their times, dequeue receipts, staged results and requests' receipts.
_MESSAGE_TAGS = ("r", "id", "b", "f", "l", "d", "x", "k", "kt", "pop", "res", "rc")
# A message's state -> the tag of the records that hold messages in it (the dashboard's and the
# export's states; a dead message is a ready one of an error queue).
STATE_TAGS = {"ready": "r", "leased": "f", "delayed": "d"}
_TAG_STATES = {tag: state for state, tag in STATE_TAGS.items()}


class QueueKeys:
    """The keys of one queue (pure computation, no I/O).

    Prefixes are packed once; keys are built by concatenating tuple-encoded elements,
    which is what ``fdb.tuple.pack`` produces for a flat tuple.
    """

    __slots__ = (
        "_cache",
        "_d",
        "_f",
        "_heads",
        "_homes",
        "_id",
        "_jk",
        "_l",
        "_m",
        "_markers",
        "_meta_read",
        "_meta_short",
        "_names",
        "_r",
        "_x",
        "name",
        "packed",
        "q",
        "root",
    )

    def __init__(self, name: str, root: Subspace, q: Subspace) -> None:
        self.name = name
        self.root = root
        self.q = q
        #: ``q.key()``, packed once: the queue's identity (equality, hashing, caches keyed by it).
        self.packed: bytes = q.key()
        self._r = _pack(q, ("r",))
        self._id = _pack(q, ("id",))
        self._f = _pack(q, ("f",))
        self._l = _pack(q, ("l",))
        self._d = _pack(q, ("d",))
        self._x = _pack(q, ("x",))
        self._m = _pack(q, ("m",))
        self._cache: dict[str, bytes] = {}
        self._names: dict[bytes, str] | None = None
        self._markers: dict[bytes, int] = {}
        self._heads: dict[int, bytes] = {}  # priority -> the ready keys' prefix
        # priority -> (the ready keys' prefix, the hex of its part past _r after "r"): home's
        self._homes: dict[int, tuple[bytes, str]] = {}
        self._meta_read: list[bytes] | None = None
        self._meta_short: list[bytes] | None = None
        self._jk: JournalKeys | None = None

    def journal_keys(self) -> JournalKeys:
        """The journal's keys under this queue's root (:class:`JournalKeys`), looked up once."""
        found = self._jk
        if found is None:
            found = self._jk = JournalKeys.of(self.root)
        return found

    @classmethod
    def make(cls, name: str, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueKeys:
        r = Subspace(tuple(root))
        return cls(validate_queue_name(name), r, r["q"][name])

    def sibling(self, name: str) -> QueueKeys:
        """The keys of queue ``name`` under the same root (an error queue's, a move's target)."""
        return QueueKeys(validate_queue_name(name), self.root, self.root["q"][name])

    def __eq__(self, other: object) -> bool:
        return isinstance(other, QueueKeys) and other.packed == self.packed

    def __hash__(self) -> int:
        # Every operation looks its queue's keys up (meta.read_meta); a bytes object keeps its
        # hash, and none is stored here, so that a pickled QueueKeys hashes right in another process.
        return hash(self.packed)

    # -- the queue's metadata: one contiguous range, read in one go ---------------------------
    def meta_range(self) -> tuple[bytes, bytes]:
        """Settings, state, counters, index mark and priority markers: a few small keys."""
        return self._m, self._m + b"\xff"

    def _meta(self, name: str) -> bytes:
        key = self._cache.get(name)
        if key is None:
            key = self._cache[name] = self._m + enc_str(name)
        return key

    @property
    def config(self) -> bytes:
        return self._meta("cfg")

    @property
    def state(self) -> bytes:
        return self._meta("st")

    @property
    def wake(self) -> bytes:
        """Grows whenever messages become ready; blocking dequeues watch it (no spurious wake-ups)."""
        return self.counter("wake")

    @property
    def metadata_version(self) -> bytes:
        """Changes (to a fresh random value) whenever the settings, state or priority markers do."""
        return self._meta("mv")

    @property
    def work_entry(self) -> bytes:
        """This queue's entry in the work index, ``root + ("wk", name)`` (workindex.py)."""
        key = self._cache.get("wk")
        if key is None:
            key = self._cache["wk"] = bytes(self.root.pack(("wk", self.name)))
        return key

    def meta_read(self) -> list[bytes]:
        """What ``meta.read_meta`` reads, built once (a dozen calls otherwise), in this order:
        the metadata version, the ready and wake counters, the work-index entry (an enqueue
        marks it: ``workindex.mark``), then the inflight and delayed counters (which an
        enqueue into a queue without a max_size leaves out: :meth:`meta_read_short`), the
        taken and counted counters (the ready count is ready - taken + wake - counted:
        :func:`ready_count`). Not to be changed by the caller."""
        found = self._meta_read
        if found is None:
            c = self.counter
            found = [
                self.metadata_version,
                c("ready"),
                c("wake"),
                self.work_entry,
                c("inflight"),
                c("delayed"),
                c("taken"),
                c("counted"),
            ]
            self._meta_read = found
        return found

    def meta_read_short(self) -> list[bytes]:
        """The first four of :meth:`meta_read`: all but the inflight, delayed, taken and counted
        counters."""
        found = self._meta_short
        if found is None:
            found = self._meta_short = self.meta_read()[:4]
        return found

    def counter(self, name: str) -> bytes:
        key = self._cache.get("n/" + name)
        if key is None:
            key = self._cache["n/" + name] = self._m + enc_str("n") + enc_str(name)
        return key

    def meta_names(self) -> dict[bytes, str]:
        """Metadata key -> "cfg", "st" or the counter's name (priority markers aside)."""
        names = self._names
        if names is None:
            names = {self.config: "cfg", self.state: "st", self.guard: "own"}
            names.update({self.counter(c): c for c in COUNTERS})
            self._names = names
        return names

    def priority_marker(self, priority: int) -> bytes:
        return self._m + _PRI + enc_int(-priority)

    def priority_marker_range(self) -> tuple[bytes, bytes]:
        prefix = self._m + _PRI
        return prefix, prefix + b"\xff"

    @property
    def guard(self) -> bytes:
        """The queue's owner and ACL, one small JSON value (``privileges.py``); absent: the
        queue is open to every principal. One key, so a check is one point read."""
        return self._meta("own")

    def marker_priority(self, key: bytes) -> int | None:
        """The priority of ``key`` if it is a priority marker, else None (memoised: every
        operation reads the markers with the queue's metadata)."""
        markers = self._markers
        p = markers.get(key)
        if p is None and key.startswith(self._m + _PRI):
            if len(markers) > 4096:
                markers.clear()
            p = markers[key] = self.parse_marker(key)
        return p

    def parse_marker(self, key: bytes) -> int:
        """The priority of a priority marker key."""
        return -dec_int(key, len(self._m) + len(_PRI))[0]

    @property
    def listing(self) -> bytes:
        return _pack(self.root, ("queues", self.name))

    def reserved_by(self, origin: str) -> bytes:
        """Owned queue ``origin`` names this queue its error queue: only those who hold
        ``admin`` on ``origin`` may make it (``privileges.check_create``)."""
        return _pack(self.root, ("eq", self.name, origin))

    def reserved_range(self) -> tuple[bytes, bytes]:
        """Every ``reserved_by`` key of this queue (the names of the queues that reserve it)."""
        r = self.root.range(("eq", self.name))
        return bytes(r.start), bytes(r.stop)

    def reserving(self, key: bytes) -> str:
        """The queue a ``reserved_by`` key names."""
        return str(self.root.unpack(key)[2])

    @property
    def format(self) -> bytes:
        return _pack(self.root, ("format",))

    # -- ready items ---------------------------------------------------------------------------
    def home(self, priority: int, index: int, rand: bytes) -> tuple[bytes, str]:
        """A new ready message's key and the id that names it (:meth:`id_of_home`), together."""
        head = self._homes.get(priority)
        if head is None or not 0 < index < _BIG:
            key = self.ready_key(priority, index, rand)
            if len(self._homes) < 64 and priority in self._heads:  # (ready_key's: a few priorities)
                prefix = self._heads[priority]
                self._homes[priority] = prefix, "r" + prefix[len(self._r) :].hex()
            return key, "r" + key[len(self._r) :].hex()
        # ready_key's common case, inline (one made per message): the key's tail past the
        # priority's prefix, and the id as the prefix's hex (made once) and the tail's
        size = (index.bit_length() + 7) >> 3
        tail = (
            _INT_CODES[size]
            + index.to_bytes(size, "big")
            + b"\x01"
            + rand.replace(b"\x00", b"\x00\xff")
            + b"\x00"
        )
        return head[0] + tail, head[1] + tail.hex()

    def ready_key(self, priority: int, index: int, rand: bytes) -> bytes:
        head = self._heads.get(priority)
        if head is None:
            head = self._r + enc_int(-priority)
            if len(self._heads) < 64:  # a few priorities in use: each prefix packed once
                self._heads[priority] = head
        if 0 < index < _BIG:  # enc_int's case for an index, inline (one made per message)
            size = (index.bit_length() + 7) >> 3
            tail = _INT_CODES[size] + index.to_bytes(size, "big")
        else:
            tail = enc_int(index)
        return head + tail + b"\x01" + rand.replace(b"\x00", b"\x00\xff") + b"\x00"  # enc_bytes, inline

    def ready_range(self) -> tuple[bytes, bytes]:
        return self._r + b"\x00", self._r + b"\xff"

    def priority_range(self, priority: int, from_index: int | None = None) -> tuple[bytes, bytes]:
        prefix = self._r + enc_int(-priority)
        return (prefix + b"\x00" if from_index is None else prefix + enc_int(from_index)), prefix + b"\xff"

    def parse_ready(self, key: bytes) -> tuple[int, int, bytes]:
        """(priority, index, rand) of a ready key."""
        negp, pos = dec_int(key, len(self._r))
        index, pos = dec_int(key, pos)
        return -negp, index, fdb.tuple.unpack(key[pos:])[0]

    def priority_of(self, key: bytes) -> int:
        return -dec_int(key, len(self._r))[0]

    def priority_prefix(self, key: bytes) -> tuple[bytes, int]:
        """(the start of the ready key ``key`` that encodes its priority, the priority): every
        ready key that starts with that prefix has that priority (a tuple-encoded int is
        prefix-free: its first byte says its length)."""
        value, end = dec_int(key, len(self._r))
        return key[:end], -value

    def priorities_of(self, keys: list[bytes]) -> list[int]:
        """:meth:`priority_of` of each ready key, decoded once a run of one priority: keys
        that start with the same encoded priority have it (the tuple encoding of an int is
        prefix-free: its first byte says its length)."""
        start = len(self._r)
        out = []
        prefix: bytes | None = None
        priority = 0
        for key in keys:
            if prefix is None or not key.startswith(prefix):
                value, end = dec_int(key, start)
                priority, prefix = -value, key[:end]
            out.append(priority)
        return out

    # -- message ids -------------------------------------------------------------------------------
    def home_id(self, priority: int, index: int, rand: bytes) -> str:
        """The id of a message enqueued ready: "r" + its ready key's tail, in hex.

        Such an id names the message's home key, so the common path (enqueue, dequeue) needs
        no id-index entry: only a message away from home (delayed, leased, dead-lettered, or
        given its id before its place was known) has one.
        """
        return self.id_of_home(self.ready_key(priority, index, rand))

    def id_of_home(self, ready_key: bytes) -> str:
        """The id of the message enqueued at ``ready_key`` (see ``home_id``)."""
        return "r" + ready_key[len(self._r) :].hex()

    def home_key(self, msg_id: str) -> bytes | None:
        """The ready key ``msg_id`` names in this queue, or None for other ids."""
        if not msg_id.startswith("r"):
            return None
        try:
            return self._r + bytes.fromhex(msg_id[1:])
        except ValueError:
            return None

    # -- other states --------------------------------------------------------------------------
    def id_key(self, msg_id: str) -> bytes:
        return self._id + enc_str(msg_id)

    def chunk_key(self, msg_id: str, n: int) -> bytes:
        return _pack(self.q, ("b", msg_id, n))

    def chunk_range(self, msg_id: str) -> tuple[bytes, bytes]:
        r = self.q.range(("b", msg_id))
        return r.start, r.stop

    def inflight_key(self, msg_id: str) -> bytes:
        return self._f + enc_str(msg_id)

    def lease_key(self, deadline: int, msg_id: str) -> bytes:
        return self._l + enc_int(deadline) + enc_str(msg_id)

    def leased_at(self, deadline: int, msg_ids: list[str]) -> list[tuple[bytes, bytes]]:
        """``(inflight_key(id), lease_key(deadline, id))`` of each id: a batch leased until one
        ``deadline`` encodes it and each id once."""
        f, lease = self._f, self._l + enc_int(deadline)
        out = []
        for msg_id in msg_ids:
            tail = enc_str(msg_id)
            out.append((f + tail, lease + tail))
        return out

    def lease_keys(self, deadline: int, msg_id: str, ready_key: bytes) -> tuple[bytes, bytes, bytes | None]:
        """A lease of one message until ``deadline``: its ``inflight_key`` and ``lease_key`` (the
        id encoded once, as :meth:`leased_at`), and its ``id_key`` when ``ready_key``, the
        place it leaves, is not its :meth:`home_key` (an id entry points at it), else None."""
        tail = b"\x02" + msg_id.encode("utf-8").replace(b"\x00", b"\x00\xff") + b"\x00"  # (enc_str, inline)
        try:  # (home_key's)
            home = self._r + bytes.fromhex(msg_id[1:]) if msg_id[:1] == "r" else None
        except ValueError:
            home = None
        return (
            self._f + tail,
            self._l + enc_int(deadline) + tail,
            None if ready_key == home else self._id + tail,
        )

    def delayed_key(self, due: int, msg_id: str) -> bytes:
        return self._d + enc_int(due) + enc_str(msg_id)

    def expiry_key(self, expires: int, msg_id: str) -> bytes:
        return self._x + enc_int(expires) + enc_str(msg_id)

    def dedup_key(self, key: str) -> bytes:
        return self._meta_prefix("k") + enc_str(key)  # a bulk load builds one a message

    def dedup_time_key(self, version: int, key: str) -> bytes:
        return self._meta_prefix("kt") + enc_int(version) + enc_str(key)

    def _meta_prefix(self, tag: str) -> bytes:
        key = self._cache.get("\x00" + tag)
        if key is None:
            key = self._cache["\x00" + tag] = _pack(self.q, (tag,))
        return key

    def leases_due(self, now: int) -> tuple[bytes, bytes]:
        """``index_range("l", now + 1)``: the lease entries whose deadline version has come at
        ``now``, made from the packed prefix (``lease_key``'s) with no tuple packing - a lease
        among other consumers reads it at every lease, inside the store lock."""
        return self._l + b"\x00", self._l + enc_int(now + 1)

    def index_range(self, tag: str, upto: int | None = None) -> tuple[bytes, bytes]:
        """The time-ordered index ``tag`` ('l', 'd', 'x', ...), up to (excluding) version ``upto``."""
        r = self.q.range((tag,))
        return r.start, (r.stop if upto is None else _pack(self.q, (tag, upto)))

    def receipt_key(self, version: int, rand: bytes) -> bytes:
        return _pack(self.q, ("rc", version, rand))

    def pop_key(self, version: int, rand: bytes) -> bytes:
        return _pack(self.q, ("pop", version, rand))

    def pop_range(self) -> tuple[bytes, bytes]:
        r = self.q.range(("pop",))
        return r.start, r.stop

    def result_key(self, rand: bytes) -> bytes:
        return _pack(self.q, ("res", rand))

    def message_ranges(self) -> list[tuple[bytes, bytes]]:
        """Every range that holds messages or their indexes (not settings nor counters)."""
        out = []
        for tag in _MESSAGE_TAGS:
            r = self.q.range((tag,))
            out.append((r.start, r.stop))
        return out

    def all_range(self) -> tuple[bytes, bytes]:
        r = self.q.range()
        return r.start, r.stop

    def state_range(self, state: str) -> tuple[bytes, bytes]:
        """The records of this queue's messages in ``state`` (a key of :data:`STATE_TAGS`)."""
        r = self.q.range((STATE_TAGS[state],))
        return r.start, r.stop

    def state_of(self, key: bytes) -> str | None:
        """The state (a key of :data:`STATE_TAGS`) whose records ``key`` is one of, or None."""
        return _TAG_STATES.get(self.unpack_tail(key)[0])

    def unpack_tail(self, key: bytes) -> tuple[Any, ...]:
        return tuple(self.q.unpack(key))

    def id_at(self, key: bytes) -> str | None:
        """The message id ``key`` names, without reading its record (which may be damaged):
        the id in an in-flight, delayed or lease key; for a ready key, the home id it names
        (a message away from home has another, found through the id index). None if unknown."""
        try:
            if key.startswith(self._r):
                return self.id_of_home(key)
            tail = self.unpack_tail(key)
            if tail[0] in ("f", "id"):
                return str(tail[1])
            if tail[0] in ("d", "l", "x"):
                return str(tail[2])
        except (ValueError, IndexError, KeyError, TypeError):
            pass
        return None


def root_subspace(root: tuple[Any, ...] = DEFAULT_ROOT) -> Subspace:
    return Subspace(tuple(root))


def queues_range(root: tuple[Any, ...] = DEFAULT_ROOT) -> tuple[bytes, bytes]:
    r = root_subspace(root).range(("queues",))
    return r.start, r.stop


def queues_prefix_range(root: tuple[Any, ...], prefix: str) -> tuple[bytes, bytes]:
    """The listing keys of the queues whose names start with ``prefix`` (a partitioned
    queue's partitions): a string's tuple encoding without its terminator is a prefix of the
    encoding of every string it begins, and no UTF-8 byte is 0xff."""
    start = _pack(root_subspace(root), ("queues", prefix))[:-1]
    return start, start + b"\xff"


# -- the journal (journaling.py) -------------------------------------------------------------

# fdb.tuple's code of a Versionstamp: its 12 bytes (the commit's 10, the order's 2) follow it
_VS_CODE = b"\x33"
# the tag of a queue's own history pointers (JournalKeys.queue_prefixes; "eh" before issue 30's ninth pass)
_MH = enc_str("mh")
# An id's bytes, each inverted (JournalKeys.arrival_prefixes): newer ids sort first.
_INVERT = bytes(range(255, -1, -1))
_RA = enc_str("ra")  # the tag of a queue's arrivals' history pointers, right after its ready range
JOURNAL_SHARDS = 8  # ranges a queue's journal is spread over, by message id
# On an engine of one writer at a time (the embedded one), since issue 30's ninth pass: a
# queue's entries in its own keys, Q + ("ej", stamp), its bell at Q + ("lj",) (JournalKeys):
# the "shard" a pointer names for them, and read besides the JOURNAL_SHARDS ranges (which hold
# what earlier versions wrote: JournalKeys.shards).
QUEUE_SHARD = 0xFF
_EJ = enc_str("ej")  # the tag of a queue's own journal entries (JournalKeys.queue_entry_prefix)
_LJ = enc_str("lj")  # the tag of a queue's own bell, right before its counters ("m")
HISTORY_SHARDS = 16  # ranges the per-message history pointers are spread over


class JournalKeys:
    """The journal's keys under a root: entries ``("j", queue, shard, stamp)``, history
    pointers ``("h", hshard, message_id, stamp)`` (on the embedded engine a consuming
    operation's in its queue instead, ``Q + ("mh", message_id, stamp)``, and an arrival's
    after its ready range, ``Q + ("ra", inverted id, stamp)``), the registry of journaled queues
    ``("jq", queue)`` and the bells a follower watches: ``("jn", queue)`` per queue, ``("jn",)``
    when a queue starts journaling. On the embedded engine, since issue 30's ninth pass, a
    queue's entries and bell are in its own keys instead, ``Q + ("ej", stamp)`` and
    ``Q + ("lj",)`` (:meth:`queue_entry_prefix`, :meth:`queue_bell`): readers read both places
    (:meth:`shards`: the queue's entries are the "shard" :data:`QUEUE_SHARD`).

    A new entry's keys are ``fdb.tuple``-encoded up to the versionstamp's code (0x33), from
    cached prefixes: the engine writes the commit's stamp and the entry's order after them
    (``Transaction.set_journal_entry``), one call an entry; ``fdb.tuple.pack`` would cost more
    than the rest. :meth:`entry_to_stamp` and :meth:`history_to_stamp` give the same keys as
    ``set_versionstamped_key``'s templates (the incomplete versionstamp, then its offset)."""

    __slots__ = ("_bells", "_entries", "_hs", "_local", "_prefixes", "_rows", "root")
    _made: dict[bytes, JournalKeys] = {}

    def __init__(self, root: Subspace) -> None:
        self.root = root
        self._prefixes: dict[tuple[str, object], bytes] = {}
        self._bells: dict[str | None, bytes] = {}
        # A new entry's template by (queue, shard, order), for a queue's own entries.
        self._entries: dict[tuple[str, int, int], bytes] = {}
        # By queue, for each shard: a message's entry's key prefix and its pointer's value.
        self._rows: dict[str, tuple[tuple[bytes, bytes], ...]] = {}
        # By queue: its entry's key prefix in shard 0 and its own pointers' up to the id.
        self._local: dict[str, tuple[bytes, bytes]] = {}
        h = root.key() + enc_str("h")
        self._hs = tuple(h + enc_int(hs) for hs in range(HISTORY_SHARDS))  # ("h", hshard)

    @classmethod
    def make(cls, root: tuple[Any, ...] = DEFAULT_ROOT) -> JournalKeys:
        return cls.of(Subspace(tuple(root)))

    @classmethod
    def of(cls, root: Subspace) -> JournalKeys:
        """The (cached) journal keys under ``root``."""
        found = cls._made.get(root.key())
        if found is None:
            if len(cls._made) > 64:
                cls._made.clear()
            found = cls._made[root.key()] = cls(root)
        return found

    @staticmethod
    def shard(message_id: str | None) -> int:
        return zlib.crc32((message_id or "").encode()) % JOURNAL_SHARDS

    @staticmethod
    def shards(local: bool) -> tuple[int, ...]:
        """The shards a reader reads a queue's entries in: the JOURNAL_SHARDS ranges, and
        where ``local`` (an engine of one writer at a time: ``not may_conflict``) the queue's
        own range too, :data:`QUEUE_SHARD`, where its entries go since issue 30's ninth pass
        (the ranges keep what earlier versions wrote)."""
        return _LOCAL_SHARDS if local else _SPREAD_SHARDS

    def queue_entry_prefix(self, keys: QueueKeys) -> bytes:
        """A new entry's key in ``keys``' own journal range up to its versionstamp (where one
        writer at a time appends): ``Q + ("ej", stamp)``. ``"ej"`` sorts before the leased
        records, the lease deadlines, the bell (``"lj"``) and the counters (``"m"``): the
        newest entry is at the range's end, beside what every operation writes anyway (the
        counters, the bell), usually in the same leaf page, where the entries under
        ``("j", queue, shard)`` took a page of their own each commit."""
        return keys.packed + _EJ + _VS_CODE

    @staticmethod
    def queue_bell(keys: QueueKeys) -> bytes:
        """The bell of ``keys``' queue where its entries are in its own keys (the embedded
        engine): ``Q + ("lj",)``, right before its counters."""
        return keys.packed + _LJ

    def queue_bell_of(self, queue: str) -> bytes:
        """:meth:`queue_bell` of the queue named ``queue`` (a reader's)."""
        return bytes(self.root.pack(("q", queue, "lj")))

    def _prefix(self, kind: str, a: str, b: object) -> bytes:
        found = self._prefixes.get((a, b)) if kind == "j" else None
        if found is None:
            if kind == "j":
                found = self.root.key() + enc_str("j") + enc_str(a) + enc_int(int(b))  # type: ignore[call-overload]
                if len(self._prefixes) > 4096:
                    self._prefixes.clear()
                self._prefixes[(a, b)] = found
            else:
                found = self._hs[int(b)] + enc_str(a)  # type: ignore[call-overload]
        return found

    def entry_to_stamp(self, queue: str, shard: int, order: int) -> bytes:
        """The key of a new entry in ``shard``, for ``set_versionstamped_key``."""
        found = self._entries.get((queue, shard, order))
        if found is None:
            if len(self._entries) > 4096:
                self._entries.clear()
            found = incomplete_stamp(self._prefix("j", queue, shard), order)
            self._entries[(queue, shard, order)] = found
        return found

    def entry_key(self, queue: str, shard: int, version: bytes) -> bytes:
        if shard == QUEUE_SHARD:
            return bytes(self.root.pack(("q", queue, "ej", versionstamp(version))))
        return bytes(self.root.pack(("j", queue, shard, versionstamp(version))))

    def entry_range(self, queue: str, shard: int, since: bytes | None) -> tuple[bytes, bytes]:
        r = self.root.range(("q", queue, "ej") if shard == QUEUE_SHARD else ("j", queue, shard))
        begin = r.start if since is None else self.entry_key(queue, shard, since) + b"\x00"
        return begin, bytes(r.stop)

    def entry_version(self, key: bytes) -> bytes:
        return version_of(self.root.unpack(key)[-1])

    def history_to_stamp(self, message_id: str, order: int) -> bytes:
        """The key of a new history pointer, for ``set_versionstamped_key`` (the shard's
        prefix kept; the message's id is new every time)."""
        hs = zlib.crc32(message_id.encode()) % HISTORY_SHARDS
        return incomplete_stamp(self._hs[hs] + enc_str(message_id), order)

    def entry_prefix(self, queue: str, shard: int) -> bytes:
        """A new entry's key in ``shard`` up to its versionstamp (``set_journal_entry``'s
        ``entry``): :meth:`entry_to_stamp`'s key without the stamp, the order and the offset."""
        return self._prefix("j", queue, shard) + _VS_CODE

    def prefixes(self, queue: str, message_id: str, spread: bool) -> tuple[bytes, bytes, bytes]:
        """A message's new entry in ``queue``, for ``set_journal_entry``: the entry's key prefix
        (:meth:`entry_prefix`), its history pointer's (:meth:`history_to_stamp`'s key up to
        the stamp) and the pointer's value (the queue's name, NUL, the entry's shard).
        ``spread``: over :data:`JOURNAL_SHARDS` by message id (:meth:`shard`), else shard 0.
        One CRC of the id serves the entry's shard and the pointer's."""
        idb = message_id.encode()
        crc = zlib.crc32(idb)
        entry, pointer_value = self._rows_of(queue)[crc % JOURNAL_SHARDS if spread else 0]
        # enc_str(message_id), inline, then the versionstamp's code
        pointer = self._hs[crc % HISTORY_SHARDS] + b"\x02" + idb.replace(b"\x00", b"\x00\xff") + b"\x00\x33"
        return entry, pointer, pointer_value

    def _rows_of(self, queue: str) -> tuple[tuple[bytes, bytes], ...]:
        """For each shard of ``queue``: a message's entry's key prefix and its pointer's value."""
        rows = self._rows.get(queue)
        if rows is None:
            if len(self._rows) > 4096:
                self._rows.clear()
            name = queue.encode() + b"\x00"
            rows = self._rows[queue] = tuple(
                (self.entry_prefix(queue, shard), name + bytes((shard,))) for shard in range(JOURNAL_SHARDS)
            )
        return rows

    def queue_prefixes(self, keys: QueueKeys, message_id: str) -> tuple[bytes, bytes, bytes]:
        """:meth:`prefixes` with the entry in the queue's own range (:meth:`queue_entry_prefix`)
        and the pointer inside the queue's own keys, ``Q + ("mh", message_id, stamp)``, its
        value the entry's shard as one byte (:data:`QUEUE_SHARD`). Where one writer at a time
        appends (the embedded engine), a consuming operation's pointer goes here. ``"mh"``
        sorts right after the counters (``"m"``), before the staged requests and the ready
        range's head, what a dequeue, lease or ack writes anyway (the entry and the bell just
        before the counters); and a ready id is its ready key in hex, so the newest consumed
        message's pointers sit at the range's end, beside the ready head: usually a page the
        commit writes anyway. Before issue 30's ninth pass the pointer was at ``Q + ("eh",
        ...)`` (:meth:`earlier_history_range`), before the leased records, with the entry under
        ``("j", queue, 0)``: pages of their own once the entries moved beside the counters."""
        found = self._local.get(keys.name) or self._local_of(keys)
        entry, head = found
        # enc_str(message_id) after its tag, inline, then the versionstamp's code
        return entry, head + message_id.encode().replace(b"\x00", b"\x00\xff") + b"\x00\x33", _QUEUE_SHARD

    def arrival_prefixes(self, keys: QueueKeys, message_id: str) -> tuple[bytes, bytes, bytes]:
        """:meth:`queue_prefixes` for a message's arrival in the queue (an enqueue, a move or
        a forward into it, a redrive): the pointer at ``Q + ("ra", inverted id, stamp)``,
        each byte of the id's UTF-8 inverted (255 - b), its value the entry's shard as one
        byte (:data:`QUEUE_SHARD`). Where one writer at a time appends (the embedded engine),
        an arrival's pointer goes here: ``"ra"`` sorts right after the queue's ready range,
        whose end the enqueue writes (a ready key's index grows, and priority 0 sorts last),
        and ids grow with the ready index (home ids) and with time (``entropy.new_id``), so
        inverted the newest sorts first, beside the newest ready record: usually the leaf the
        enqueue dirties anyway, where a pointer under ``("h", hshard, ...)`` dirtied a leaf of
        its own (at one of HISTORY_SHARDS growing ends)."""
        entry = (self._local.get(keys.name) or self._local_of(keys))[0]
        # enc_bytes(inverted id), inline, then the versionstamp's code
        inverted = message_id.encode().translate(_INVERT).replace(b"\x00", b"\x00\xff")
        return entry, keys.packed + _RA + b"\x01" + inverted + b"\x00\x33", _QUEUE_SHARD

    def _local_of(self, keys: QueueKeys) -> tuple[bytes, bytes]:
        """``keys``' queue's entry prefix (:meth:`queue_entry_prefix`) and its own pointers'
        prefix up to the id (``Q + ("mh",)`` and the id's string code), cached."""
        if len(self._local) > 4096:
            self._local.clear()
        found = self._local[keys.name] = (self.queue_entry_prefix(keys), keys.packed + _MH + b"\x02")
        return found

    def queue_kept_ranges(self, queue: str) -> list[tuple[bytes, bytes]]:
        """The ranges of ``queue``'s own keys that belong to its journal (a destroy keeps them,
        with the journal they point into or are part of), in key order: its consuming
        operations' pointers as written before issue 30's ninth pass (``"eh"``), its entries
        (``"ej"``), its bell (``"lj"``), its consuming operations' pointers (``"mh"``) and its
        arrivals' (``"ra"``)."""
        bell = self.queue_bell_of(queue)
        return [
            self.earlier_history_range(queue),
            self.entry_range(queue, QUEUE_SHARD, None),
            (bell, bell + b"\x00"),
            self.queue_history_range(queue),
            self.arrival_range(queue),
        ]

    def arrival_key(self, queue: str, message_id: str, version: bytes) -> bytes:
        inverted = message_id.encode().translate(_INVERT)
        return bytes(self.root.pack(("q", queue, "ra", inverted, versionstamp(version))))

    def arrival_range(self, queue: str, message_id: str | None = None) -> tuple[bytes, bytes]:
        """A message's arrival pointers in ``queue`` (:meth:`arrival_prefixes`; None: every
        message's, what a queue's destroy keeps with the journal it points into)."""
        tail = (
            ("q", queue, "ra")
            if message_id is None
            else ("q", queue, "ra", message_id.encode().translate(_INVERT))
        )
        r = self.root.range(tail)
        return bytes(r.start), bytes(r.stop)

    def queue_history_key(self, queue: str, message_id: str, version: bytes, tag: str = "mh") -> bytes:
        """A consuming operation's pointer in ``queue`` (:meth:`queue_prefixes`; ``tag`` "eh":
        where it was before issue 30's ninth pass)."""
        return bytes(self.root.pack(("q", queue, tag, message_id, versionstamp(version))))

    def queue_history_range(
        self, queue: str, message_id: str | None = None, tag: str = "mh"
    ) -> tuple[bytes, bytes]:
        """A message's consuming operations' pointers inside ``queue`` (None: every message's:
        what a queue's destroy keeps, with the journal it points into)."""
        r = self.root.range(("q", queue, tag) if message_id is None else ("q", queue, tag, message_id))
        return bytes(r.start), bytes(r.stop)

    def earlier_history_range(self, queue: str, message_id: str | None = None) -> tuple[bytes, bytes]:
        """:meth:`queue_history_range` where stores written before issue 30's ninth pass (since
        its seventh) have them, ``Q + ("eh", message_id, stamp)``: read, trimmed and kept too."""
        return self.queue_history_range(queue, message_id, "eh")

    def history_key(self, message_id: str, version: bytes) -> bytes:
        hs = zlib.crc32(message_id.encode()) % HISTORY_SHARDS
        return bytes(self.root.pack(("h", hs, message_id, versionstamp(version))))

    def history_range(self, message_id: str) -> tuple[bytes, bytes]:
        r = self.root.range(("h", zlib.crc32(message_id.encode()) % HISTORY_SHARDS, message_id))
        return bytes(r.start), bytes(r.stop)

    def history_version(self, key: bytes) -> bytes:
        return version_of(self.root.unpack(key)[-1])

    def registry(self, queue: str) -> bytes:
        return bytes(self.root.pack(("jq", queue)))

    def registry_range(self) -> tuple[bytes, bytes]:
        r = self.root.range(("jq",))
        return bytes(r.start), bytes(r.stop)

    def registry_name(self, key: bytes) -> str:
        return str(self.root.unpack(key)[1])

    def bell(self, queue: str | None) -> bytes:
        """Changes with every commit that journals in ``queue`` (None: that makes a queue
        journaled): what a follower watches. One key a queue, as its wake counter is: no one
        key every journaled queue of a cluster writes."""
        found = self._bells.get(queue)
        if found is None:
            if len(self._bells) > 4096:
                self._bells.clear()
            found = self._bells[queue] = bytes(self.root.pack(("jn",) if queue is None else ("jn", queue)))
        return found


_SPREAD_SHARDS = tuple(range(JOURNAL_SHARDS))
_LOCAL_SHARDS = (*_SPREAD_SHARDS, QUEUE_SHARD)
_QUEUE_SHARD = bytes((QUEUE_SHARD,))


# -- routes (routing.py) ----------------------------------------------------------------------


def route_key(root: tuple[Any, ...], name: str, value: str) -> bytes:
    """Where partitioned queue ``name`` sends the messages of routing value ``value``."""
    return bytes(root_subspace(root).pack(("rt", name, value)))


def route_range(root: tuple[Any, ...], name: str) -> tuple[bytes, bytes]:
    r = root_subspace(root).range(("rt", name))
    return bytes(r.start), bytes(r.stop)


def route_value(root: tuple[Any, ...], key: bytes) -> str:
    return str(root_subspace(root).unpack(key)[2])


def partitioned_key(root: tuple[Any, ...], name: str) -> bytes:
    """Partitioned queue ``name`` exists: JSON ``{"partitions": N}`` (what the CLI lists)."""
    return bytes(root_subspace(root).pack(("pq", name)))


def partitioned_range(root: tuple[Any, ...]) -> tuple[bytes, bytes]:
    r = root_subspace(root).range(("pq",))
    return bytes(r.start), bytes(r.stop)


def partitioned_name(root: tuple[Any, ...], key: bytes) -> str:
    return str(root_subspace(root).unpack(key)[1])


# -- forwarding (forwarding.py) ---------------------------------------------------------------


def forward_marker(dst: QueueKeys, origin: str, msg_id: str) -> bytes:
    """In the destination queue: message ``msg_id`` of source ``origin`` is installed here
    (kept apart from the messages: a purge leaves the markers, which keep forwarding exact)."""
    prefix: bytes = dst.q.key()
    return prefix + _FW + enc_str(origin) + enc_str(msg_id)  # a forward packs thousands


_FW = b"\x02fw\x00"  # enc_str("fw")


def forward_marker_range(dst: QueueKeys, origin: str) -> tuple[bytes, bytes]:
    r = dst.q.range(("fw", origin))
    return bytes(r.start), bytes(r.stop)


# -- a leased forward's transit (ops/transit.py, ops/pending.py) --------------------------------
#
# Under each queue's subspace (docs/forwarding.md, ops/transit.py's docstring):
#   ("fk",)                                  the queue's forwarding token
#   ("fn", nonce)                            a forwarder's probe (the same store?)
#   ("fp", source, id, receipt)              a pending copy of one message (a Record) ...
#   ("fp", source, id, receipt, n)           ... and its payload's chunks
#   ("fp", source, None, lease, part)        a part of a leased batch's pending copies
#   ("ft", destination, lease or id)         a removed batch's tombstone (or one message's)
#   ("fh", destination, name, version, receipt)  a named forwarder's batch in hand
# Built from the queue's prefix and encoded elements, byte for byte fdb.tuple.pack's (a
# forward builds several a message, and the tuple layer's general packer is the slow part);
# tests/layer/test_layout.py pins the bytes.


def forward_token_key(keys: QueueKeys) -> bytes:
    """``("fk",)``: the queue's forwarding token (which store's queue a copy belongs to)."""
    prefix: bytes = keys.q.key()
    return prefix + _FK


def forward_probe_key(keys: QueueKeys, nonce: str) -> bytes:
    """``("fn", nonce)``: a forwarder's probe, looked for on the destination."""
    prefix: bytes = keys.q.key()
    return prefix + _FN + enc_str(nonce)


def pending_key(dst: QueueKeys, source: str, mid: str, receipt: str) -> bytes:
    """``("fp", source, id, receipt)``: one message's pending copy, under a key of its own."""
    return _fp_prefix(dst, source) + enc_str(mid) + enc_str(receipt)


def pending_keys(dst: QueueKeys, source: str, entries: list[tuple[str, str]]) -> list[bytes]:
    """:func:`pending_key` of each entry (id, receipt): one prefix for them all."""
    prefix = _fp_prefix(dst, source)
    return [prefix + enc_str(mid) + enc_str(receipt) for mid, receipt in entries]


def pending_chunk_key(dst: QueueKeys, source: str, mid: str, receipt: str, n: int) -> bytes:
    """``("fp", source, id, receipt, n)``: chunk ``n`` of a pending copy's payload."""
    return _fp_prefix(dst, source) + enc_str(mid) + enc_str(receipt) + enc_int(n)


def pending_range(dst: QueueKeys, *tail: str) -> tuple[bytes, bytes]:
    """``dst.q.range(("fp", *tail))``: the keys under that tuple (not its own); ``tail``:
    (source, id, receipt) or a prefix of it (nothing: every pending key of the queue)."""
    prefix: bytes = dst.q.key()
    prefix += _FP + b"".join(enc_str(x) for x in tail)
    return prefix + b"\x00", prefix + b"\xff"


def unpack_pending(dst: QueueKeys, key: bytes) -> tuple[Any, ...]:
    """A key under ``("fp",)`` as its tuple: ("fp", source, id, receipt[, n]) or
    ("fp", source, None, lease, part)."""
    return tuple(dst.q.unpack(key))


def part_key(dst: QueueKeys, source: str, lease: str, part: int) -> bytes:
    """``("fp", source, None, lease, part)``: part ``part`` of the batch ``lease``'s copies."""
    return _pack(dst.q, ("fp", source, None, lease, part))


def part_range(dst: QueueKeys, source: str, lease: str) -> tuple[bytes, bytes]:
    """The keys of the parts of the batch ``lease``'s copies."""
    r = dst.q.range(("fp", source, None, lease))
    return bytes(r.start), bytes(r.stop)


def part_number(dst: QueueKeys, key: bytes) -> int:
    """The part number a :func:`part_key` names."""
    return int(dst.q.unpack(key)[-1])


def tomb_key(src: QueueKeys, dest: str, name: str) -> bytes:
    """``("ft", dest, name)``: a batch's tombstone (``name``: the batch's lease), or a
    message's as an earlier version wrote them (``name``: its id)."""
    prefix: bytes = src.q.key()
    return prefix + _FT + enc_str(dest) + enc_str(name)


def tombs_range(src: QueueKeys, *tail: str) -> tuple[bytes, bytes]:
    """``src.q.range(("ft", *tail))``: the tombstones for destination ``tail[0]`` (nothing:
    for every destination)."""
    r = src.q.range(("ft", *tail))
    return bytes(r.start), bytes(r.stop)


def tomb_name(src: QueueKeys, key: bytes) -> str:
    """The name (lease, or an earlier version's message id) a :func:`tomb_key` ends with."""
    return str(src.q.unpack(key)[-1])


def hand_key(src: QueueKeys, dest: str, name: str, at: int, receipt: str) -> bytes:
    """``("fh", dest, name, at, receipt)``: a batch forwarder ``name`` has in hand (leased at
    version ``at``; ``receipt``: its first message's)."""
    return _pack(src.q, ("fh", dest, name, at, receipt))


def hands_range(src: QueueKeys, *tail: str) -> tuple[bytes, bytes]:
    """``src.q.range(("fh", *tail))``: the batches in hand for (destination, forwarder name)
    ``tail`` (or a prefix of it)."""
    r = src.q.range(("fh", *tail))
    return bytes(r.start), bytes(r.stop)


def _fp_prefix(dst: QueueKeys, source: str) -> bytes:
    """``dst.q.pack(("fp", source))``, kept by (queue prefix, source token): a forwarder
    builds keys under one prefix all its run."""
    at: bytes = dst.q.key()
    got = _FP_PREFIXES.get((at, source))
    if got is None:
        if len(_FP_PREFIXES) > 256:
            _FP_PREFIXES.clear()
        got = _FP_PREFIXES[(at, source)] = at + _FP + enc_str(source)
    return got


_FP_PREFIXES: dict[tuple[bytes, str], bytes] = {}
_FK, _FN, _FP, _FT = enc_str("fk"), enc_str("fn"), enc_str("fp"), enc_str("ft")


# -- the work index (workindex.py) -------------------------------------------------------------


class WorkKeys:
    """The index of queues that have work, under one root (pure computation, no I/O)."""

    __slots__ = ("_claims", "_prefix", "_sleepers", "_sub", "filled")

    def __init__(self, root: tuple[Any, ...] | Subspace = DEFAULT_ROOT) -> None:
        sub = root if isinstance(root, Subspace) else root_subspace(root)
        self._sub = sub
        self._prefix = bytes(sub.pack(("wk",)))
        self._sleepers = bytes(sub.pack(("ws",)))
        self._claims = bytes(sub.pack(("wc",)))
        self.filled = bytes(sub.pack(("wkf",)))

    def sleeper(self, token: bytes) -> bytes:
        """An idle consumer's registration, ``root + ("ws", token)``."""
        return self._sleepers + pack_one(token)

    def sleepers_range(self) -> tuple[bytes, bytes]:
        return self._sleepers, self._sleepers + b"\xff"

    def claim(self, queue: str) -> bytes:
        """Queue ``queue``'s claim by the consumer serving it, ``root + ("wc", queue)``."""
        return self._claims + pack_one(queue)

    def claims_range(self, prefix: str = "") -> tuple[bytes, bytes]:
        """The claims of the queues whose names start with ``prefix``."""
        begin = self._claims + pack_one(prefix)[:-1]
        return begin, begin + b"\xff"

    def claimed(self, key: bytes) -> str:
        return str(self._sub.unpack(key)[1])

    def entry(self, queue: str) -> bytes:
        return self._prefix + pack_one(queue)

    def name(self, key: bytes) -> str:
        return str(self._sub.unpack(key)[1])

    def range(self, prefix: str = "") -> tuple[bytes, bytes]:
        """The entries of the queues whose names start with ``prefix``."""
        if not prefix:
            r = self._sub.range(("wk",))
            return bytes(r.start), bytes(r.stop)
        begin = self._prefix + pack_one(prefix)[:-1]  # the string's code and bytes, unterminated
        return begin, begin + b"\xff"


# -- periodic jobs (schedules.py) --------------------------------------------------------------


class ScheduleKeys:
    """The schedules under one root: ``("sch", name)`` holds one schedule's record (JSON)."""

    __slots__ = ("_sub",)

    def __init__(self, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
        self._sub = root_subspace(root)

    def entry(self, name: str) -> bytes:
        return bytes(self._sub.pack(("sch", name)))

    def range(self) -> tuple[bytes, bytes]:
        r = self._sub.range(("sch",))
        return bytes(r.start), bytes(r.stop)

    def name(self, key: bytes) -> str:
        return str(self._sub.unpack(key)[1])


# -- task results (api/tasks.py) ---------------------------------------------------------------


class TaskResultKeys:
    """Task results under one root: ``("tres", message_id)`` holds one task's result record
    (JSON: pending, its value, or its failure) and ``("texp", expires, message_id)`` indexes
    the records by expiry (a version), so that a sweep clears the old ones in one range read."""

    __slots__ = ("_sub",)

    def __init__(self, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
        self._sub = root_subspace(root)

    def result(self, message_id: str) -> bytes:
        return bytes(self._sub.pack(("tres", message_id)))

    def expiry(self, expires: int, message_id: str) -> bytes:
        return bytes(self._sub.pack(("texp", expires, message_id)))

    def expired_range(self, upto: int) -> tuple[bytes, bytes]:
        """The expiry entries before version ``upto`` (excluded)."""
        r = self._sub.range(("texp",))
        return bytes(r.start), bytes(self._sub.pack(("texp", upto)))

    def parse_expiry(self, key: bytes) -> tuple[int, str]:
        _, expires, message_id = self._sub.unpack(key)
        return int(expires), str(message_id)


# -- rate limits (ratelimit.py) ----------------------------------------------------------------


class RateKeys:
    """The shards of one rate limit's token bucket (``store/rates.py``): a queue's own limit
    under ``Q + ("rl", shard)`` (destroyed with the queue), a named one - a Worker's
    ``rate_limit`` - under ``root + ("rl", name, shard)``. A shard's value: the tokens left
    and the database version they were counted at."""

    __slots__ = ("_prefix", "name")

    def __init__(self, prefix: bytes, name: str) -> None:
        self._prefix = prefix
        self.name = name

    @classmethod
    def of_queue(cls, keys: QueueKeys) -> RateKeys:
        found = keys._cache.get("\x00rl")
        if found is None:
            found = keys._cache["\x00rl"] = _pack(keys.q, ("rl",))
        return cls(found, keys.name)

    @classmethod
    def named(cls, name: str, root: tuple[Any, ...] | Subspace = DEFAULT_ROOT) -> RateKeys:
        sub = root if isinstance(root, Subspace) else root_subspace(root)
        utf8(name, f"rate limit key {name!r}")
        return cls(_pack(sub, ("rl", name)), name)

    def shard(self, i: int) -> bytes:
        return self._prefix + enc_int(i)

    def range(self) -> tuple[bytes, bytes]:
        return self._prefix + b"\x00", self._prefix + b"\xff"


# -- the registry of workers (api/workers.py, runtime/registry.py) -----------------------------


class WorkerKeys:
    """Running workers under one root: ``("wr", worker_id)`` holds one worker's record
    (JSON: host, pid, queues, counts, the messages in hand, its last heartbeat's version).
    One key a worker, written by that worker alone every few seconds: no key all of them
    write."""

    __slots__ = ("_sub",)

    def __init__(self, root: tuple[Any, ...] | Subspace = DEFAULT_ROOT) -> None:
        self._sub = root if isinstance(root, Subspace) else root_subspace(root)

    def entry(self, worker_id: str) -> bytes:
        return bytes(self._sub.pack(("wr", worker_id)))

    def range(self) -> tuple[bytes, bytes]:
        r = self._sub.range(("wr",))
        return bytes(r.start), bytes(r.stop)

    def worker_id(self, key: bytes) -> str:
        return str(self._sub.unpack(key)[1])
