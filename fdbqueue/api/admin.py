"""The queue manager: create, destroy, list queues; settings; stop and start each direction."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

from fdbqueue.engines.contract import Database, Transaction, adopt, is_transaction
from fdbqueue.errors import CorruptMessageError, QueueError, QueueNotFoundError
from fdbqueue.ops import journaling
from fdbqueue.ops.moves.manager import destroy, purge, purge_some
from fdbqueue.ops.moves.places import wake
from fdbqueue.ops.privileges import (
    ALL_RIGHTS,
    check,
    check_create,
    checked,
    mask,
    may,
    principal_of,
    reserve_error_queue,
    rights_of,
    set_owner,
    write_guard,
)
from fdbqueue.ops.txn import run_once
from fdbqueue.ops.views import counts, pending
from fdbqueue.store.clock import db_now, now_us
from fdbqueue.store.codec import unpack_count
from fdbqueue.store.config import QueueConfig, bump_metadata_version, read_config, read_state, write_config
from fdbqueue.store.guard import allowed, decode_guard
from fdbqueue.store.layout import DEFAULT_ROOT, QueueKeys, done_count, queues_range, root_subspace
from fdbqueue.store.meta import Meta, read_meta
from fdbqueue.store.record import decode_record
from fdbqueue.types import QueueState, QueueStats, check_principal


class Unchanged:
    """The default of ``create_queue``'s ``owner``: leave it as it is."""

    def __repr__(self) -> str:
        return "UNCHANGED"


UNCHANGED = Unchanged()


def meta_owner(owner: str | Unchanged | None, was: str | None) -> str | None:
    return was if isinstance(owner, Unchanged) else owner


def _settings(cfg: QueueConfig) -> dict[str, Any]:
    return {k: v for k, v in dataclasses.asdict(cfg).items() if k != "extra"}


def create_queue(
    tr: Transaction | Database,
    name: str,
    *,
    root: tuple[Any, ...] = DEFAULT_ROOT,
    exist_ok: bool = True,
    owner: str | Unchanged | None = UNCHANGED,
    **settings: Any,
) -> QueueConfig:
    """Create queue ``name`` with ``settings`` (see :class:`QueueConfig`), or update its settings.

    ``owner``: a principal (every right on the queue; others only what they are granted), or
    None (open to every principal); left out, a new queue has none and an existing one keeps
    its own. Changing an owned queue needs ``admin``. Atomic; composes inside the caller's
    transaction. Unknown setting names are an error.
    """
    if owner is not UNCHANGED and owner is not None:
        check_principal(owner)
    keys = QueueKeys.make(name, root)
    unknown = set(settings) - set(QueueConfig.__dataclass_fields__)
    if unknown:
        raise TypeError(f"unknown queue setting(s): {', '.join(sorted(unknown))}")

    def body(t: Transaction, _: bool) -> QueueConfig:
        current = read_config(t, keys)
        meta = checked(t, keys, "admin") if current is not None else read_meta(t, keys)
        if current is not None and not exist_ok:
            raise QueueError(f"queue {name!r} already exists")
        cfg = (current or QueueConfig()).replace(**settings)
        if current is None or cfg.error_queue != current.error_queue:
            check_error_chain(t, keys, cfg)
        if cfg.volatile and t.db.engine == "fdb":
            raise QueueError(
                f"queue {name!r}: volatile=True is for the embedded engine; FoundationDB makes every "
                "commit durable (logged on its transaction logs before the commit returns), so there "
                "is no cheaper kind of queue there. Keep it durable, or keep scratch queues in an "
                "embedded store (sqlite://...?sync=normal) or memory://"
            )
        if current is None:
            check_create(t, keys)  # not the reserved error queue of someone else's queue
        write_config(t, keys, cfg)
        was = meta.owner
        before = False if owner is UNCHANGED else set_owner(t, keys, owner)  # type: ignore[arg-type]
        owned = before is not False
        if current is None or owned or cfg.error_queue_for(name) != current.error_queue_for(name):
            reserve_error_queue(t, keys, meta_owner(owner, was), cfg, current)
        if cfg.journal and (current is None or not current.journal):
            journaling.register(t, keys)
        if cfg.journal or (current is not None and current.journal):
            # Only a change is journaled: the retry of an attempt that landed (1021) finds
            # the settings already as asked and writes no second entry.
            if current is None:
                journaling.record(
                    t, keys, "create", details={**_settings(cfg), "owner": meta_owner(owner, was)}
                )
            elif current != cfg or owned:
                old, new = _settings(current), _settings(cfg)
                changed = {k: [old.get(k), v] for k, v in new.items() if old.get(k) != v}
                if owned:
                    changed["owner"] = [was, owner]
                journaling.record(t, keys, "config", details={"changed": changed})
        return cfg

    return run_once(tr, body)


MAX_ERROR_HOPS = 32  # error queues followed at most by check_error_chain


def check_error_chain(t: Transaction, keys: QueueKeys, cfg: QueueConfig) -> None:
    """Refuse settings under which the queue's dead letters would come back to it: its own
    name as ``error_queue``, or a chain of error queues that leads back (a -> b -> a), down
    which a poison message would go round for ever, its deliveries reset at each hop, and
    never rest where someone looks. The chain is followed through the stored settings of
    the queues on it (serializable reads: a concurrent change that closes a loop
    conflicts), a queue not yet made as the defaults it would get (``<name>.error``); past
    two missing queues in a row only defaults follow, which only lengthen the name."""
    if cfg.error_queue == keys.name:
        raise QueueError(f"queue {keys.name!r} cannot be its own error queue")
    path = [keys.name]
    nxt = cfg.error_queue_for(keys.name)
    missing = 0
    while len(path) <= MAX_ERROR_HOPS and missing < 2:
        path.append(nxt)
        if nxt == keys.name:
            loop = " -> ".join(repr(n) for n in path)
            raise QueueError(
                f"queue {keys.name!r} cannot dead-letter to {path[1]!r}: its dead letters would loop {loop}"
            )
        if nxt in path[:-1]:
            return  # a loop further on, not through this queue: not this change's to refuse
        found = read_config(t, keys.sibling(nxt))
        missing = missing + 1 if found is None else 0
        nxt = (found or QueueConfig()).error_queue_for(nxt)


def queue_config(
    tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT
) -> QueueConfig:
    """The settings of queue ``name``; QueueNotFoundError when it does not exist. Needs no
    right: a producer needs ``max_payload``, a consumer ``lease_seconds`` (the messages and
    the figures need ``browse``)."""
    keys = QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> QueueConfig:
        cfg = read_config(t, keys)
        if cfg is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        return cfg

    return run_once(tr, body)


def destroy_queue(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> None:
    """Remove queue ``name`` and every key it has (messages, indexes, counters, settings)."""
    keys = QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> None:
        check(t, keys, "admin")
        cfg = read_config(t, keys)
        if cfg is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        destroy(t, keys, journaled=cfg.journal)
        t.clear(keys.sibling(cfg.error_queue_for(name)).reserved_by(name))

    run_once(tr, body)


PATTERN_CHARS = "*?["


def is_pattern(name: object) -> bool:
    """Whether ``name`` is a pattern of queue names (it has ``*``, ``?`` or ``[``)."""
    return isinstance(name, str) and any(c in name for c in PATTERN_CHARS)


def list_queues(tr: Transaction | Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> list[str]:
    """Names of every queue under ``root``, sorted."""
    sub = root_subspace(root)

    def body(t: Transaction, _: bool) -> list[str]:
        return [str(sub.unpack(kv.key)[1]) for kv in t.get_range(*queues_range(root))]

    return run_once(tr, body)


def set_state(
    tr: Transaction | Database,
    name: str,
    *,
    enqueue: bool | None = None,
    dequeue: bool | None = None,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> QueueState:
    """Enable or disable enqueue and dequeue independently (None leaves a direction as it is)."""
    keys = QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> QueueState:
        check(t, keys, "admin")
        cfg = read_config(t, keys)
        if cfg is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        st = read_state(t, keys)
        new = QueueState(
            enqueue=st.enqueue if enqueue is None else bool(enqueue),
            dequeue=st.dequeue if dequeue is None else bool(dequeue),
        )
        t.set(keys.state, new.encode())
        bump_metadata_version(t, keys)
        if new.dequeue and not st.dequeue:
            wake(t, keys)  # blocked dequeuers may proceed now
        if cfg.journal and new != st:  # a change only: see create_queue
            journaling.record(t, keys, "state", details={"enqueue": new.enqueue, "dequeue": new.dequeue})
        return new

    return run_once(tr, body)


def stop_queue(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueState:
    """Disable both directions."""
    return set_state(tr, name, enqueue=False, dequeue=False, root=root)


def start_queue(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueState:
    """Enable both directions."""
    return set_state(tr, name, enqueue=True, dequeue=True, root=root)


def queue_stats(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> QueueStats:
    """Depth, in flight, delayed, error-queue depth, totals and the oldest message's age."""
    keys = QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> QueueStats:
        check(t, keys, "browse")
        cfg = read_config(t, keys)
        if cfg is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        return _stats(t, keys, cfg)

    return run_once(tr, body)


STATS_BATCH = 100  # queues one transaction of all_queue_stats reads at most


def all_queue_stats(
    db: Database, names: Iterable[str] | None = None, *, root: tuple[Any, ...] = DEFAULT_ROOT
) -> list[QueueStats]:
    """:func:`queue_stats` of ``names`` (default: every queue), read STATS_BATCH queues a
    transaction rather than one each; queues gone or not browsable by the principal are left
    out. Each batch is consistent in itself, not with the others."""
    todo = list_queues(db, root=root) if names is None else list(names)
    out: list[QueueStats] = []
    for i in range(0, len(todo), STATS_BATCH):
        part = todo[i : i + STATS_BATCH]

        def body(t: Transaction, _: bool, part: list[str] = part) -> list[QueueStats]:
            got = []
            for name in part:
                keys = QueueKeys.make(name, root)
                meta = read_meta(t, keys)
                if meta.config is None or not may(t, meta, "browse"):
                    continue
                got.append(_stats(t, keys, meta.config, meta))
            return got

        out += run_once(db, body)
    return out


def _stats(t: Transaction, keys: QueueKeys, cfg: QueueConfig, meta: Meta | None = None) -> QueueStats:
    snap = t.snapshot

    def count(tag: str, k: QueueKeys = keys) -> int:
        return max(0, unpack_count(snap.get(k.counter(tag))))

    now = db_now(t)
    meta = read_meta(t, keys) if meta is None else meta
    p = pending(t, keys, meta, now)
    c = counts(meta, p, count("expired"))
    ekeys = keys.sibling(cfg.error_queue_for(keys.name))
    emeta = read_meta(t, ekeys)
    # The error queue's depth is its own: shown to those who may browse it (one set by the
    # queue's admin may be another principal's, whose figures are not theirs to see).
    errors = counts(emeta, pending(t, ekeys, emeta, now, leases=False))
    errors_ready = errors.ready if allowed(emeta.owner, emeta.acl, principal_of(t), "browse") else 0
    oldest: int | None = None
    for marker in snap.get_range(*keys.priority_marker_range()):
        prio = keys.parse_marker(marker.key)
        # Its first live message: those past their TTL are not ready (views.py).
        heads = snap.get_range(*keys.priority_range(prio), limit=1 + min(len(p.expired_ready), 63))
        head = [kv for kv in heads if kv.key not in p.expired_ready][:1]
        if head:
            try:
                at = decode_record(head[0].value, keys, head[0].key).enqueued_us
            except CorruptMessageError:
                continue  # a damaged head has no age to trust; a dequeue moves it aside
            oldest = at if oldest is None else min(oldest, at)
    # A due delayed message is ready (views.py) though no sweep has moved it yet: its age
    # counts from its enqueue time, as it will once a sweep or dequeue places it.
    for _, rec in p.due:
        oldest = rec.enqueued_us if oldest is None else min(oldest, rec.enqueued_us)
    st = read_state(t, keys)
    return QueueStats(
        name=keys.name,
        ready=c.ready,
        inflight=c.inflight,
        delayed=c.delayed,
        errors=errors_ready,
        made_ready=meta.made_ready,
        done=done_count(snap.get(keys.counter("done")), snap.get(keys.counter("taken"))),
        dead=count("dead"),
        expired=c.expired,
        corrupt=count("corrupt"),
        oldest_age=None if oldest is None else max(0.0, (now_us() - oldest) / 1e6),
        enqueue_enabled=st.enqueue,
        dequeue_enabled=st.dequeue,
        lease_ended=c.lease_ended,
        exact=c.exact and errors.exact,
    )


def queue_rates(
    db: Database, name: str, *, interval: float = 1.0, root: tuple[Any, ...] = DEFAULT_ROOT
) -> QueueStats:
    """:func:`queue_stats` with enqueue and completion rates measured over ``interval`` seconds."""
    first = queue_stats(db, name, root=root)
    start = time.monotonic()
    time.sleep(interval)
    second = queue_stats(db, name, root=root)
    dt = time.monotonic() - start
    return dataclasses.replace(
        second,
        ready_rate=(second.made_ready - first.made_ready) / dt,
        done_rate=(second.done - first.done) / dt,
    )


PURGE_BATCH = 1000  # a journaled purge's messages per transaction: an entry each (about 0.5 MB)


def purge_queue(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> int:
    """Remove every message (ready, leased, delayed) and its indexes; keep the settings.

    Atomic: one transaction of range clears whatever the queue holds (:func:`moves.purge`),
    so it never needs splitting. Returns how many messages it removed, as the counters said
    at its read version. Composes inside the caller's transaction.

    A journaled queue journals each message it purges, PURGE_BATCH per transaction: given a
    Database, in as many transactions as it takes (each atomic); in a caller's transaction,
    QueueError when more than PURGE_BATCH messages are there (nothing is written).
    """
    keys = QueueKeys.make(name, root)
    tr = adopt(tr)
    in_caller = is_transaction(tr)

    def body(t: Transaction, _: bool) -> tuple[int, bool]:
        check(t, keys, "admin")
        cfg = read_config(t, keys)
        if cfg is None:
            raise QueueNotFoundError(f"no queue named {name!r}")
        if not cfg.journal:
            return purge(t, keys), False
        n, more = purge_some(t, keys, PURGE_BATCH)
        if more and in_caller:
            raise QueueError(
                f"queue {name!r} is journaled and holds more than {PURGE_BATCH} messages: a purge "
                "journals each one, more than one transaction should hold; purge it given the "
                "database (it then runs in batches, each its own transaction)"
            )
        return (n, True) if more else (n + purge(t, keys), False)

    total = 0
    while True:
        n, more = run_once(tr, body)
        total += n
        if not more:
            return total


# -- owners and privileges (the checks themselves: privileges.py) -----------------------------


def _existing(t: Transaction, keys: QueueKeys) -> Meta:
    meta = checked(t, keys, "admin")
    if meta.config is None:
        raise QueueNotFoundError(f"no queue named {keys.name!r}")
    return meta


def _change(
    tr: Transaction | Database,
    queue: str,
    principal: str,
    rights: Iterable[str],
    root: tuple[object, ...],
    add: bool,
) -> frozenset[str]:
    keys = QueueKeys.make(queue, root)
    who = check_principal(principal)
    wanted = mask(rights)

    def body(t: Transaction, _: bool) -> frozenset[str]:
        meta = _existing(t, keys)
        owner, acl = decode_guard(t.get(keys.guard))
        had = acl.get(who, 0)
        now = (had | wanted) if add else (had & ~wanted)
        if now != had:  # a change only: the retry of an attempt that landed writes nothing
            rights = {**acl, who: now}
            if not now:
                del rights[who]
            write_guard(t, keys, owner, rights)
            cfg = meta.config
            if cfg is not None and cfg.journal:
                op = "grant" if add else "revoke"
                details = {"principal": who, "rights": sorted(rights_of(wanted))}
                journaling.record(t, keys, op, details=details)
        return rights_of(now)

    return run_once(tr, body)


def grant(
    tr: Transaction | Database,
    queue: str,
    principal: str,
    rights: Iterable[str],
    *,
    root: tuple[object, ...] = DEFAULT_ROOT,
) -> frozenset[str]:
    """Give ``principal`` ``rights`` on ``queue`` (needs admin); returns what it now holds.
    Atomic; composes inside the caller's transaction; journaled where the queue is."""
    return _change(tr, queue, principal, rights, root, True)


def revoke(
    tr: Transaction | Database,
    queue: str,
    principal: str,
    rights: Iterable[str],
    *,
    root: tuple[object, ...] = DEFAULT_ROOT,
) -> frozenset[str]:
    """Take ``rights`` on ``queue`` from ``principal`` (needs admin); effective from the next
    transaction of every process. Atomic; composes inside the caller's transaction."""
    return _change(tr, queue, principal, rights, root, False)


def acl(
    tr: Transaction | Database, queue: str, *, root: tuple[object, ...] = DEFAULT_ROOT
) -> dict[str, frozenset[str]]:
    """Who holds which rights on ``queue`` (needs admin): the owner every right; {} when the
    queue has no owner (open to all)."""
    keys = QueueKeys.make(queue, root)

    def body(t: Transaction, _: bool) -> dict[str, frozenset[str]]:
        meta = _existing(t, keys)
        out = {p: rights_of(m) for p, m in meta.acl.items()}
        if meta.owner is not None:
            out[meta.owner] = rights_of(ALL_RIGHTS)
        return out

    return run_once(tr, body)
