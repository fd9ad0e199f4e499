"""Owners and privileges: who a transaction acts for, and what it may do on a queue.

A queue with an owner admits only its owner (every right) and the principals granted rights;
one without an owner is open to every principal, so stores made before owners existed keep
working. The owner and the ACL live among the queue's metadata, which every operation reads
anyway and caches against the queue's metadata version (``meta.read_meta``): a check costs
no extra read while nothing changed, and a grant or revoke, which writes a new metadata
version, takes effect in the next transaction of every process.

What this protects, plainly: the layer enforces rights for clients that use it. FoundationDB
has no per-key permissions; isolation between teams is a tenant each, with authorization
tokens and TLS (FoundationDB's documentation: "Tenants", "Authorization", "TLS").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fdbqueue.engines.contract import Transaction
from fdbqueue.errors import AccessDeniedError, ForeignQueueError, QueueError
from fdbqueue.store.clock import note_time
from fdbqueue.store.config import QueueConfig, bump_metadata_version, decode_config, read_config, write_config
from fdbqueue.store.guard import RIGHT_BITS, acting_for, allowed, decode_guard, encode_guard
from fdbqueue.store.layout import TIME_KEY, QueueKeys
from fdbqueue.store.meta import Meta, read_meta
from fdbqueue.types import RIGHTS, check_principal

__all__ = ["check", "mask", "principal_of", "rights_of", "set_owner"]

_BIT = RIGHT_BITS
ALL_RIGHTS = sum(_BIT.values())


def principal_of(tr: Transaction) -> str:
    """The principal ``tr`` acts for: its database's (``open(url, principal=...)``)."""
    return acting_for(tr.db)


def mask(rights: Iterable[str]) -> int:
    if isinstance(rights, str):
        rights = [rights]
    mask = 0
    for r in rights:
        bit = _BIT.get(r) if isinstance(r, str) else None
        if bit is None:
            raise QueueError(f"unknown right {r!r}: the rights are {', '.join(RIGHTS)}")
        mask |= bit
    return mask


def rights_of(mask: int) -> frozenset[str]:
    return frozenset(r for r, bit in _BIT.items() if mask & bit)


def check(
    tr: Transaction,
    keys: QueueKeys,
    right: str,
    meta: Meta | None = None,
    also: Sequence[bytes] = (),
    *,
    peek: Sequence[bytes] = (),
) -> list[bytes | None]:
    """Raise AccessDeniedError unless ``tr``'s principal holds ``right`` on the queue; call it
    before anything is written. Uses ``meta`` when the caller read it (no read); else reads
    the guard key with ``also``, the keys the caller reads next, in one round trip (snapshot
    reads, with the read conflicts a serializable read of ``also`` takes), and returns their
    values. ``peek``: keys read in the same round trip at snapshot isolation and without a
    read conflict (counters the caller adds to), their values after those of ``also``."""
    conflicted = also
    if peek:
        also = [*also, *peek]
    if meta is not None:
        owner, acl = meta.owner, meta.acl
        values: list[bytes | None] = []
    elif getattr(tr.db, "may_conflict", True) and tr.journal_order().time is None:  # engine_traits' first
        # Where versions may jump, the database's time correction too (clock.note_time).
        found = tr.snapshot.get_many([keys.guard, *also, TIME_KEY])
        note_time(tr, found.pop())
        for key in conflicted:
            tr.add_read_conflict_key(key)
        owner, acl = decode_guard(found[0])
        values = found[1:]
    else:
        found = tr.snapshot.get_many([keys.guard, *also])
        for key in conflicted:
            tr.add_read_conflict_key(key)
        owner, acl = decode_guard(found[0])
        values = found[1:]
    if owner is not None:
        who = principal_of(tr)
        if not allowed(owner, acl, who, right):
            raise AccessDeniedError(who, keys.name, right)
    return values


def dequeuer(db: object, keys: QueueKeys, guard: bytes) -> bool:
    """Whether ``db``'s principal holds ``dequeue`` on the queue whose guard key holds ``guard``
    (read in the caller's transaction, as :func:`check` reads it): the common ack's check
    (``delivery.ack_short``), decided once per queue, guard value and principal - the value is
    the owner and the ACL, so a grant, revoke or owner change is a new one - and compared after
    as bytes, not decoded or hashed again (an ACL of a hundred principals is a few KB)."""
    who = acting_for(db)
    last = _dequeuers.get(keys.packed)
    if last is not None and last[1] == who and last[0] == guard:
        return last[2]
    owner, acl = decode_guard(guard)
    held = allowed(owner, acl, who, "dequeue")
    if len(_dequeuers) > 4096:  # a process settling in very many queues: start again
        _dequeuers.clear()
    _dequeuers[keys.packed] = (guard, who, held)
    return held


_dequeuers: dict[bytes, tuple[bytes, str, bool]] = {}


def check_any(tr: Transaction, keys: QueueKeys, rights: Sequence[str]) -> None:
    """AccessDeniedError (naming the first of ``rights``) unless ``tr``'s principal holds one
    of ``rights`` on the queue: for what several kinds of caller need alike."""
    owner, acl = decode_guard(tr.snapshot.get(keys.guard))
    who = principal_of(tr)
    if not any(allowed(owner, acl, who, r) for r in rights):
        raise AccessDeniedError(who, keys.name, rights[0])


def may(tr: Transaction, meta: Meta, right: str) -> bool:
    """Whether ``tr``'s principal holds ``right`` on the queue whose metadata is ``meta``."""
    return meta.owner is None or allowed(meta.owner, meta.acl, principal_of(tr), right)


def checked(tr: Transaction, keys: QueueKeys, right: str) -> Meta:
    """:func:`check`, for a caller that needs the queue's metadata too: returns it."""
    meta = read_meta(tr, keys)
    check(tr, keys, right, meta)
    return meta


def set_owner(t: Transaction, keys: QueueKeys, owner: str | None) -> str | bool | None:
    """Make ``owner`` the queue's owner (None: open to all, keeping the grants) in ``t``;
    returns the owner before, or False when nothing changed. The caller checked the right to
    (admin on an owned queue; anyone on an unowned one)."""
    was, acl = decode_guard(t.get(keys.guard))
    if owner == was:
        return False
    write_guard(t, keys, None if owner is None else check_principal(owner), acl)
    return was


def write_guard(t: Transaction, keys: QueueKeys, owner: str | None, acl: Mapping[str, int]) -> None:
    """Store the queue's owner and ACL; every process sees them from its next transaction
    (a new metadata version: ``meta.read_meta``)."""
    raw = encode_guard(owner, acl)
    if raw is None:
        t.clear(keys.guard)
    else:
        t.set(keys.guard, raw)
    bump_metadata_version(t, keys)


def readable(tr: Transaction, keys: QueueKeys) -> bool:
    """Whether ``tr``'s principal may browse the queue (journal(None) skips those it may not)."""
    if read_config(tr, keys) is None:
        return True  # destroyed: its journal is there until trimmed, open as its keys are
    owner, acl = decode_guard(tr.snapshot.get(keys.guard))
    return allowed(owner, acl, principal_of(tr), "browse")


# -- what follows a queue's owner: its error queue (docs/security.md) -------------------------
#
# An owned queue's messages leave it, without a principal asking, by two doors: a dead letter to
# its error queue, and (for a partitioned queue's partitions) a route. Both lead only to a queue
# of the same owner, or the messages would be handed to whoever made or owns the other queue;
# and a queue's name that an owned queue names its error queue is reserved to that queue's
# owner and admins, so that no stranger makes it first.


def check_create(tr: Transaction, keys: QueueKeys) -> None:
    """Before ``keys``' queue is made (``create_queue``, or first use by an enqueue, a move or
    a forward): AccessDeniedError when its name is the error queue of an owned queue on which
    ``tr``'s principal lacks ``admin``. The reserving queues are those that recorded it
    (``create_queue`` of an owned queue records its error queue) and, for a name ending in
    ``.error``, the queue it is the default error queue of (owned before reservations were
    recorded). A queue is made once: these reads are paid once per queue."""
    origins = {keys.reserving(kv.key) for kv in tr.get_range(*keys.reserved_range())}
    if keys.name.endswith(".error") and len(keys.name) > len(".error"):
        origins.add(keys.name[: -len(".error")])
    origins.discard(keys.name)
    if not origins:
        return
    ordered = [keys.sibling(o) for o in sorted(origins)]
    found = tr.get_many([k for o in ordered for k in (o.config, o.guard)])
    who = principal_of(tr)
    for i, okeys in enumerate(ordered):
        raw, guard = found[2 * i], found[2 * i + 1]
        owner, acl = decode_guard(guard)
        if raw is None or owner is None or decode_config(raw).error_queue_for(okeys.name) != keys.name:
            continue  # a reservation left by a queue since destroyed, opened or set otherwise
        if not allowed(owner, acl, who, "admin"):
            why = f"{keys.name!r} is its error queue, reserved to its owner and admins"
            raise AccessDeniedError(who, okeys.name, "admin", why)


def reserve_error_queue(
    tr: Transaction, keys: QueueKeys, owner: str | None, cfg: QueueConfig, was: QueueConfig | None
) -> None:
    """``create_queue`` of ``keys``' queue, now of ``owner`` with settings ``cfg`` (before:
    ``was``): ForeignQueueError when its error queue exists with another owner (its dead
    letters would be refused: :func:`error_queue`); else record the reservation of that name
    (an owned queue's) for :func:`check_create`, and drop that of a name it no longer uses."""
    ekeys = keys.sibling(cfg.error_queue_for(keys.name))
    if was is not None:
        old = was.error_queue_for(keys.name)
        if old != ekeys.name:
            tr.clear(keys.sibling(old).reserved_by(keys.name))
    raw, guard = tr.get_many([ekeys.config, ekeys.guard])
    found, _ = decode_guard(guard)
    if raw is not None and found is not None and found != owner:
        raise ForeignQueueError(keys.name, owner, ekeys.name, found, "dead letters")
    if owner is None:
        tr.clear(ekeys.reserved_by(keys.name))
    else:
        tr.set(ekeys.reserved_by(keys.name), b"")


def error_queue(tr: Transaction, keys: QueueKeys, cfg: QueueConfig) -> tuple[QueueKeys, QueueConfig]:
    """The error queue a dead letter of ``keys``' queue (settings ``cfg``) goes to in ``tr``,
    with its settings; in one round trip (a dead letter's path is bounded in them: budgets.md).

    Made on first use with the queue's owner and grants: dead letters are as private as the
    messages they were. One that exists open to all (made before its queue was owned, by
    anyone) is made the queue's owner's, with its grants, in the same commit that hands it the
    letter; one of another owner gets nothing: ForeignQueueError, the message stays where it
    was (an owned queue's owner is refused that name by ``create_queue``, and strangers are
    refused making it: :func:`check_create`)."""
    ekeys = keys.sibling(cfg.error_queue_for(keys.name))
    raw, eguard, guard = tr.get_many([ekeys.config, ekeys.guard, keys.guard])
    owner, acl = decode_guard(guard)
    if raw is None:
        ecfg = QueueConfig()
        write_config(tr, ekeys, ecfg)  # a new metadata version: the guard below is seen with it
        if guard is not None:
            tr.set(ekeys.guard, guard)
        return ekeys, ecfg
    ecfg = decode_config(raw)
    if ecfg.volatile:
        tr.options.set_volatile_prefix(ekeys.q.key())
    found, _ = decode_guard(eguard)
    if found != owner:
        if found is not None:
            raise ForeignQueueError(keys.name, owner, ekeys.name, found, "dead letters")
        write_guard(tr, ekeys, owner, acl)  # open to all until now: anyone could have owned it
    return ekeys, ecfg
