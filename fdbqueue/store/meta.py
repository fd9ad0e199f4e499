"""What one operation reads of its queue's metadata: :class:`Meta` (settings, state, priority
markers, owner and grants, the hot counters), read by :func:`read_meta` and, for a dequeue or a
lease, :func:`read_meta_for`; the per-process cache of settings those reads keep, valid while the
queue's metadata version is unchanged (``config.bump_metadata_version``); and the embedded
engine's short steps' reads, which serve an enqueue, a dequeue or a lease from that cache alone
(:func:`read_plain`, :func:`read_take`, :func:`take_plan`). Every read here is a snapshot read
in the caller's transaction and writes nothing but a volatile prefix's declaration; the settings
records, their codecs and their writes are ``store/config.py``'s.
"""

from __future__ import annotations

import struct
import threading
import weakref
from collections.abc import Callable, Mapping
from operator import itemgetter
from typing import Any, NamedTuple

from fdbqueue.engines.contract import Transaction
from fdbqueue.store.budget import MAX_PAYLOAD_BYTES
from fdbqueue.store.clock import note_time
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.config import _OPEN, QueueConfig, _decode_config, _decode_state
from fdbqueue.store.guard import NO_ACL, acting_for, allowed, decode_guard
from fdbqueue.store.layout import HOT_COUNTERS, TIME_KEY, QueueKeys
from fdbqueue.types import QueueState


class Meta(NamedTuple):
    """A queue's small keys: settings, state and priority markers (cached), hot counters (read).

    A named tuple made by tuple's own constructor (:func:`read_meta`): one is made by every
    operation. The counters are decoded when asked for (:meth:`count`): an enqueue into a
    queue without a max_size needs only ``made_ready``."""

    config: QueueConfig | None
    state: QueueState
    priorities: frozenset[int]
    owner: str | None  # None: open to every principal
    acl: Mapping[str, int]  # principal -> rights mask (privileges.py)
    made_ready: int  # the wake counter: also the index high-water mark
    work: bytes | None  # the queue's work-index entry, read at snapshot isolation (workindex.py)
    cluster: bool  # the engine may conflict (engine_traits' first): read conflicts matter
    raw: list[bytes | None]  # what read_meta read, in the order of QueueKeys.meta_read

    @property
    def counters(self) -> dict[str, int]:
        """The hot counters by name (``layout.HOT_COUNTERS``; ready less taken, plus wake less
        counted where counted is present: ``layout.ready_count``)."""
        found = {name: self._counter(name) for name in HOT_COUNTERS}
        found["ready"] = self.count("ready")
        return found

    def count(self, name: str) -> int:
        # Asked of every dequeue and lease (inflight, delayed): an absent counter or an
        # 8-byte zero (most of them) answers without decoding; the rest as _counter.
        at = _RAW_AT.get(name)
        raw = self.raw
        if at is None or at >= len(raw):
            return 0
        value = raw[at]
        if value is None or value == _ZERO:
            if at != 1 or len(raw) < 8 or raw[7] is None:
                return 0
            n = 0
        else:
            n = int(_COUNT(value)[0]) if len(value) == 8 else unpack_count(value)
        if at == 1:  # the ready count: ready - taken + (wake - counted) (layout.ready_count)
            if len(raw) > 6 and (taken := raw[6]) is not None and taken != _ZERO:
                n -= _count(taken)
            if len(raw) > 7 and (counted := raw[7]) is not None:
                n += _count(raw[2]) - _count(counted)
        return n if n > 0 else 0

    def _counter(self, name: str) -> int:
        at, raw = _RAW_AT[name], self.raw  # inflight and delayed: maybe left out (read_meta)
        return _count(raw[at]) if at < len(raw) else 0

    def waiting(self) -> bool:
        """``count("delayed") or count("inflight")`` in one call: whether delayed or leased
        messages may exist, that a take first makes ready when they came due. Asked by every
        dequeue and lease: an absent counter (or one read_meta left out) or an 8-byte zero, most
        of them, answers without decoding."""
        raw = self.raw
        n = len(raw)
        d, f = _DUE_AT
        if n > d and (v := raw[d]) is not None and v != _ZERO and _count(v) > 0:
            return True
        return n > f and (v := raw[f]) is not None and v != _ZERO and _count(v) > 0


# Where each hot counter is in Meta.raw (QueueKeys.meta_read's order).
_RAW_AT = {"ready": 1, "inflight": 4, "delayed": 5, "wake": 2, "taken": 6, "counted": 7}
_DUE_AT = (_RAW_AT["delayed"], _RAW_AT["inflight"])  # Meta.waiting's
assert set(_RAW_AT) == {*HOT_COUNTERS, "taken", "counted"}
_new_meta = tuple.__new__


class _Settings(NamedTuple):
    version: bytes  # the metadata version they were read at
    config: QueueConfig | None
    state: QueueState
    priorities: frozenset[int]
    owner: str | None
    acl: Mapping[str, int]


assert Meta._fields[:5] == _Settings._fields[1:]  # read_meta makes a Meta from a _Settings' fields

# Settings per database and queue, each valid while the queue's metadata version is unchanged.
# Keyed by the database object, so that two stores never share an entry.
_settings: weakref.WeakKeyDictionary[Any, dict[bytes, _Settings]] = weakref.WeakKeyDictionary()
_settings_lock = threading.Lock()


# The settings each queue's last read_meta found, with the database they were read from: one
# dict lookup for the common case of one database, before the per-database cache above.
# (the database, its settings, whether they set a max_size, the longest payload a plain
# enqueue may take read_plain's way with them: -1 when none may, _plain_limit; the keys a
# plain take reads read_take's way with them: None when none may, _take_keys; the keys a plain
# enqueue reads read_plain's way, QueueKeys.meta_read_short's and the counted counter; the
# principal the two decisions were made for, None when the queue has no owner: anyone's)
_Hot = tuple[weakref.ref[Any], _Settings, bool, int, "list[bytes] | None", list[bytes], "str | None"]
_hot: dict[bytes, _Hot] = {}


def read_meta(tr: Transaction, keys: QueueKeys, *, enqueue: bool = False) -> Meta:
    """Settings, state, priority markers and the hot counters, in one round trip when cached.

    One ``get_many`` reads the queue's metadata version with the counters an operation
    needs; the settings come from a process-wide cache while that version is unchanged
    (every change of settings, state or markers writes a new one in the same transaction:
    :func:`bump_metadata_version`), else from a range read of the metadata, which refills the
    cache. The model is FoundationDB's metadata version key (``\\xff/metadataVersion``,
    ``fdbclient/NativeAPI.actor.cpp`` ``Transaction::get``): a change made by any process is
    seen by the next transaction that starts after it commits.

    Every read is a snapshot read; settings and state get read conflicts of their own (as
    serializable reads would), so a concurrent pause or reconfiguration conflicts and the
    cached values are as good as read; the hot counters get none.

    ``enqueue``: an enqueue's read, which needs the inflight and delayed counters only to
    check a max_size: they are left out (their ``counters`` read 0) unless the queue's
    settings set one - those last seen in this process say so before the read, or a second
    read fetches them when the settings found with it say so.
    """
    hot = _hot.get(keys.packed)
    short = enqueue and (hot is None or not hot[2])
    full = keys.meta_read()
    cluster = getattr(tr.db, "may_conflict", True)  # engine_traits' first
    if cluster:
        # No counted counter where transactions may conflict: only the embedded engine's
        # short enqueue makes one (enqueuing._plain_step), so it is never there to read.
        values, _ = _read_keys(tr, keys, full[:4] if short else full[:7])
    else:  # _read_keys' case of an engine where nothing conflicts, without its call
        # short: the first four and the counted counter (count_new keeps it in step), the
        # inflight, delayed and taken counters left out (None: read 0)
        values = tr.snapshot.get_many([*full[:4], full[7]] if short else full)
        if short:
            values = [*values[:4], None, None, None, values[4]]
    cached = _settings_at(tr, keys, values[0], hot)
    cfg = cached.config
    if cfg is not None:
        if cfg.volatile:  # (the engine may skip the fsync for its keys)
            tr.options.set_volatile_prefix(keys.q.key())
        if short and cfg.max_size is not None:  # a bound since the last look: its counters too
            if len(values) == 4:
                values = values + tr.snapshot.get_many(full[4:7])
            else:
                values[4:7] = tr.snapshot.get_many(full[4:7])
    wake = values[2]
    made_ready = 0 if wake is None else _COUNT(wake)[0] if len(wake) == 8 else unpack_count(wake)
    # (config, state, priorities, owner, acl) from the settings, then what was read
    return _new_meta(Meta, (*cached[1:], made_ready, values[3], cluster, values))


def _read_keys(tr: Transaction, keys: QueueKeys, wanted: list[bytes]) -> tuple[list[bytes | None], bool]:
    """``wanted`` read at snapshot isolation in one round trip, and whether the engine may
    conflict. Where transactions may conflict (FoundationDB, sim: the engines whose versions
    may jump), the database's time correction (clock.note_time) is read in the same round
    trip, and settings and state get read conflicts of their own; where nothing conflicts
    (the embedded engine) read conflicts are pointless."""
    cluster = getattr(tr.db, "may_conflict", True)  # engine_traits' first
    if cluster:
        values = tr.snapshot.get_many([*wanted, TIME_KEY])
        note_time(tr, values.pop())
        tr.add_read_conflict_key(keys.config)
        tr.add_read_conflict_key(keys.state)
    else:
        values = tr.snapshot.get_many(wanted)
    return values, cluster


def _settings_at(tr: Transaction, keys: QueueKeys, version: bytes | None, hot: _Hot | None) -> _Settings:
    """The queue's settings at metadata ``version``: this process's last look (``hot``, one
    lookup, no lock), else the per-database cache, else a range read, which refills both."""
    db = tr.db
    if (
        hot is not None
        and version is not None
        and hot[1].version == version
        and hot[0]() is db
        and ((who := hot[6]) is None or who == acting_for(db))
    ):
        return hot[1]  # the common case
    found = None if version is None else _cached(db, keys)
    if found is not None and found.version == version:
        cached = found
    else:
        cached = _read_settings(tr, keys, version or b"")
        if version is not None:
            _remember(db, keys, cached)
    if version is not None:
        try:
            ref = weakref.ref(db)
        except TypeError:  # a database that cannot be weakly referenced: no cache
            return cached
        if len(_hot) > 4096:  # a process touching very many queues: start again
            _hot.clear()
        bounded = cached.config is not None and cached.config.max_size is not None
        who = None if cached.owner is None else acting_for(db)  # (an open queue: anyone's)
        limit = _plain_limit(cached, who)
        plain = [*keys.meta_read_short(), keys.counter("counted")]
        _hot[keys.packed] = (ref, cached, bounded, limit, _take_keys(keys, cached, who), plain, who)
    return cached


def _plain_limit(settings: _Settings, who: str | None) -> int:
    """The longest payload an enqueue of one plain message by principal ``who`` (None: an open
    queue's, anyone's) may take :func:`read_plain`'s way under ``settings``, or -1 when none
    may: each condition is one the enqueue's long way (ops/enqueuing.py ``_attempt``) would act
    on - a queue to create, an owner who did not grant ``who`` the right (the long way's
    AccessDeniedError), enqueues disabled, a max_size to count against, a TTL to stamp, a
    volatile prefix to declare."""
    cfg = settings.config
    if (
        cfg is None
        or _denied(settings, who, "enqueue")
        or not settings.state.enqueue
        or cfg.max_size is not None
        or cfg.ttl is not None
        or cfg.volatile
    ):
        return -1
    return min(cfg.max_payload, MAX_PAYLOAD_BYTES)


def _denied(settings: _Settings, who: str | None, right: str) -> bool:
    """Whether the queue has an owner who did not grant ``who`` ``right`` (privileges.check's
    rule, ``guard.allowed``: the long way would raise AccessDeniedError)."""
    return settings.owner is not None and not allowed(settings.owner, settings.acl, who or "", right)


def _take_keys(keys: QueueKeys, settings: _Settings, who: str | None) -> list[bytes] | None:
    """What a dequeue (or lease) of the head by principal ``who`` (None: an open queue's)
    reads :func:`read_take`'s way under ``settings``, or None when it may not: each condition
    is one the dequeue's long way (api/queue.py ``Queue._take``) would act on - no queue
    (nothing to hand out), an owner who did not grant ``who`` the dequeue right, dequeues
    disabled, strict order (one delivery in flight at a time), a volatile prefix to declare.
    The keys: the metadata version and the ready, wake, inflight, delayed and taken counters
    (the take counts itself in taken alone: head.take_short)."""
    cfg = settings.config
    if (
        cfg is None
        or _denied(settings, who, "dequeue")
        or not settings.state.dequeue
        or cfg.strict_order
        or cfg.volatile
    ):
        return None
    c = keys.counter
    return [keys.metadata_version, c("ready"), c("wake"), c("inflight"), c("delayed"), c("taken")]


def read_take(tr: Transaction, keys: QueueKeys) -> tuple[list[bytes | None], _Settings, list[bytes]] | None:
    """:func:`read_meta_for` of a dequeue of the head (``TAKE_KEPT``'s counters), in a
    transaction where nothing conflicts (the caller asks ``engine_traits``' first), when the
    settings this process last found for the queue are those at the metadata version read and
    need none of the dequeue's checks (:func:`_take_keys`). Then what it read - the metadata
    version, the ready, wake, inflight, delayed and taken counters, in that order, snapshot
    reads as ``read_meta_for``'s -, those settings and the keys read (not to be changed by
    the caller); else None, read or not, and the caller
    takes ``read_meta_for``'s way, which refreshes them. As safe as :func:`read_plain`: every
    change of settings, state or markers writes a new random metadata version in its
    transaction (:func:`bump_metadata_version`), so settings found at the version read are
    the settings now."""
    hot = _hot.get(keys.packed)
    if hot is None or (wanted := hot[4]) is None:
        return None
    db = tr.db
    if hot[0]() is not db or ((who := hot[6]) is not None and who != acting_for(db)):
        # Another database or principal than the plan was made for (another handle of this
        # process found the settings last): known before the read, which the caller's long
        # way would only make again (its own keys: one statement more, ops/contended.py).
        return None
    values = tr.snapshot.get_many(wanted)
    settings = hot[1]
    if values[0] != settings.version:
        return None  # (another version than the plan was made for)
    return values, settings, wanted


def take_plan(db: Any, keys: QueueKeys, version: bytes | None) -> tuple[list[bytes], bool, str | None] | None:
    """What a dequeue of the head in ``db`` reads :func:`read_take`'s way (the keys, in its
    order), whether the queue journals, and the principal the plan holds for (None: an open
    queue's, anyone's), when the settings this process last found for the queue are those at
    metadata ``version`` and need none of the dequeue's checks for ``db``'s principal
    (:func:`_take_keys`); else None. Valid for as long as the queue's metadata version is
    ``version`` (every change of settings, state, markers, owner or grants writes a new random
    one: :func:`bump_metadata_version`) and ``db`` acts for that principal: the caller compares
    both at every take (``ops/head.py`` ``take_short``)."""
    hot = _hot.get(keys.packed)
    if hot is None or version is None or (wanted := hot[4]) is None:
        return None
    settings = hot[1]
    if (
        settings.version != version
        or hot[0]() is not db
        or ((who := hot[6]) is not None and who != acting_for(db))
    ):
        return None
    return wanted, settings.config.journal, who  # type: ignore[union-attr]  # (_take_keys: a config)


def read_plain(
    tr: Transaction, keys: QueueKeys, size: int
) -> tuple[list[bytes | None], _Settings, list[bytes]] | None:
    """:func:`read_meta` of an enqueue of one plain message of ``size`` bytes, in a
    transaction where nothing conflicts (the caller asks ``engine_traits``' first), when the
    settings this process last found for the queue are those at the metadata version read and
    need none of the enqueue's checks (:func:`_plain_limit`). Then what it read
    (``QueueKeys.meta_read_short``'s keys and the counted counter, snapshot reads as
    ``read_meta``'s) and those
    settings; else None, read or not, and the caller takes ``read_meta``'s way, which
    refreshes them; and the keys read (not to be changed by the caller).

    As safe as ``read_meta``'s cache: every change of settings, state or markers writes a new
    metadata version in its transaction (:func:`bump_metadata_version`, random: never one
    written before), so settings found at the version read are the settings now."""
    hot = _hot.get(keys.packed)
    if hot is None or size > hot[3]:
        return None
    read = hot[5]
    values = tr.snapshot.get_many(read)
    settings = hot[1]
    db = tr.db
    if (
        values[0] != settings.version
        or hot[0]() is not db
        or ((who := hot[6]) is not None and who != acting_for(db))
    ):
        return None  # (another version, database, or principal than the plan was made for)
    return values, settings, read


# What read_meta_for reads, per queue and counters: the keys, and the getter that puts what
# was read (with a None after it) in Meta.raw's order.
_for_plans: dict[tuple[bytes, tuple[str, ...]], tuple[list[bytes], Callable[[list[bytes | None]], Any]]] = {}

#: What a dequeue reads with the metadata version: the counters its due check looks at
#: (inflight, delayed), those it adds to (ready, done) and taken (the ready count is ready -
#: taken, and a kept run is out of date when another take counted there: ops/head.py).
#: The wake and counted counters too: the ready count is ready - taken + (wake - counted)
#: where counted is present (a short enqueue counts itself in wake alone: layout.ready_count).
TAKE_COUNTERS = ("ready", "inflight", "delayed", "taken", "done", "wake", "counted")
#: What a lease reads: the same but ``done``, which it does not add to.
LEASE_COUNTERS = ("ready", "inflight", "delayed", "taken", "wake", "counted")
# Where transactions may conflict (FoundationDB, sim): neither the counted counter (never
# written there: read_meta) nor the wake counter (no kept head there: ops/head.py keeps_head).
_CLUSTER_COUNTERS: dict[tuple[str, ...], tuple[str, ...]] = {
    c: tuple(n for n in c if n not in ("wake", "counted")) for c in (TAKE_COUNTERS, LEASE_COUNTERS)
}

# Meta.raw's slots (QueueKeys.meta_read's order, taken and counted its last, then the done
# counter): a counter's name, or None for what read_meta_for never reads (the work-index entry).
_RAW_SLOTS = (None, "ready", "wake", None, "inflight", "delayed", "taken", "counted", "done")


def read_meta_for(tr: Transaction, keys: QueueKeys, counters: tuple[str, ...]) -> Meta:
    """:func:`read_meta` for an operation that needs only the counters ``counters`` (a dequeue:
    :data:`TAKE_COUNTERS`; a lease: :data:`LEASE_COUNTERS`), read with the metadata version
    in one round trip and cached settings as there, but not the work-index entry, which only
    an enqueue uses: ``Meta.made_ready`` is then 0 and ``Meta.work`` None. Every key a read
    costs (on the embedded engine a B-tree seek each, about as much as a statement of its
    own), and a counter an operation adds to is read here so that an engine resolving the add
    when it is made asks for it no more.

    ``Meta.raw`` is in ``QueueKeys.meta_read``'s order: no work-index entry; the wake counter
    when asked for (the ready count, a kept head: ops/head.py), and still no made_ready; the
    taken and counted counters, meta_read's last; then the done counter, past meta_read's (a
    take writes it as read: head.take_counted). Counters not asked for are None there; where
    transactions may conflict neither the wake nor the counted counter of TAKE_COUNTERS and
    LEASE_COUNTERS is read (``_CLUSTER_COUNTERS``)."""
    db = tr.db
    cluster = getattr(db, "may_conflict", True)  # engine_traits' first
    if cluster:  # no counted counter there (read_meta's), nor a kept head's wake to read
        counters = _CLUSTER_COUNTERS.get(counters, counters)
    plan = _for_plans.get((keys.packed, counters))
    if plan is None:
        plan = _plan_for(keys, counters)
    wanted, order = plan
    if cluster:
        values, cluster = _read_keys(tr, keys, wanted)
    else:  # _read_keys' case of an engine where nothing conflicts, without its call
        values, cluster = tr.snapshot.get_many(wanted), False
    version = values[0]
    hot = _hot.get(keys.packed)
    if (
        hot is not None
        and version is not None
        and hot[1].version == version
        and hot[0]() is db
        and hot[6] is None
    ):
        cached = hot[1]  # (_settings_at's common case for an open queue, without its call)
    else:
        cached = _settings_at(tr, keys, version, hot)
    cfg = cached.config
    if cfg is not None and cfg.volatile:  # (the engine may skip the fsync for its keys)
        tr.options.set_volatile_prefix(keys.q.key())
    values.append(None)  # (what order takes for a slot not read)
    # (config, state, priorities, owner, acl) from the settings, as read_meta makes them
    return _new_meta(Meta, (*cached[1:], 0, None, cluster, [*order(values)]))


def _plan_for(
    keys: QueueKeys, counters: tuple[str, ...]
) -> tuple[list[bytes], Callable[[list[bytes | None]], Any]]:
    """read_meta_for's keys for ``counters`` and the getter of Meta.raw from what was read."""
    wanted = [keys.metadata_version, *(keys.counter(c) for c in counters)]
    absent = len(wanted)  # the None appended after what was read
    at = [0] + [counters.index(slot) + 1 if slot in counters else absent for slot in _RAW_SLOTS[1:]]
    plan = (wanted, itemgetter(*at))
    if len(_for_plans) > 4096:  # a process touching very many queues: start again
        _for_plans.clear()
    _for_plans[keys.packed, counters] = plan
    return plan


def due_entries(tr: Transaction, keys: QueueKeys, meta: Meta, now: int) -> bool:
    """Whether a lease has expired or a delayed message is due by ``now`` (snapshot reads).

    Only the indexes whose counters say they hold entries are read: a queue with leases
    in flight but nothing delayed costs one read here, an idle one none.
    """
    if not meta.waiting():  # (nothing in flight, nothing delayed: no index to read)
        return False
    for tag, counter in (("l", "inflight"), ("d", "delayed")):
        if meta.count(counter) and tr.snapshot.get_range(*keys.index_range(tag, now + 1), 1):
            return True
    return False


def _read_settings(tr: Transaction, keys: QueueKeys, version: bytes) -> _Settings:
    """Settings, state, priority markers, owner and ACL from one snapshot range read of the
    metadata."""
    cfg: QueueConfig | None = None
    state = _OPEN
    priorities: set[int] = set()
    owner: str | None = None
    acl: Mapping[str, int] = NO_ACL
    names = keys.meta_names()
    for key, value in tr.snapshot.get_range(*keys.meta_range()):
        name = names.get(key)
        if name is None:
            p = keys.marker_priority(key)
            if p is not None:
                priorities.add(p)
        elif name == "cfg":
            cfg = _decode_config(value)
        elif name == "st":
            state = _decode_state(value)
        elif name == "own":
            owner, acl = decode_guard(value)
    return _Settings(version, cfg, state, frozenset(priorities), owner, acl)


def _cached(db: Any, keys: QueueKeys) -> _Settings | None:
    try:
        with _settings_lock:
            per_db = _settings.get(db)
            return None if per_db is None else per_db.get(keys.packed)
    except TypeError:  # a database that cannot be weakly referenced: no cache
        return None


def _remember(db: Any, keys: QueueKeys, settings: _Settings) -> None:
    try:
        with _settings_lock:
            per_db = _settings.get(db)
            if per_db is None:
                per_db = _settings[db] = {}
            if len(per_db) > 4096:  # a process touching very many queues: start again
                per_db.clear()
            per_db[keys.packed] = settings
    except TypeError:  # a database that cannot be weakly referenced: no cache
        pass


def _count(raw: bytes | None) -> int:
    if raw is not None and len(raw) == 8:  # the hot path: every counter is 8 bytes
        return int(_COUNT(raw)[0])
    return unpack_count(raw)


_COUNT = struct.Struct("<q").unpack
_ZERO = bytes(8)
