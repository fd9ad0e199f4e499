"""Owners and privileges: who a transaction acts for, and what it may do on a queue.

A queue with an owner admits only its owner (every right) and the principals granted rights;
one without an owner is open to every principal, so stores made before owners existed keep
working. The owner and the ACL live among the queue's metadata, which every operation reads
anyway and caches against the queue's metadata version (``config.read_meta``): a check costs
no extra read while nothing changed, and a grant or revoke, which writes a new metadata
version, takes effect in the next transaction of every process.

What this protects, plainly: the layer enforces rights for clients that use it. FoundationDB
has no per-key permissions; isolation between teams is a tenant each, with authorization
tokens and TLS (FoundationDB's documentation: "Tenants", "Authorization", "TLS").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from fdbqueue.config import Meta, bump_metadata_version, decode_guard, encode_guard, read_config, read_meta
from fdbqueue.engines.base import Transaction
from fdbqueue.errors import AccessDeniedError, QueueError
from fdbqueue.layout import QueueKeys
from fdbqueue.types import ANONYMOUS, RIGHTS, check_principal

__all__ = ["ANONYMOUS", "RIGHTS", "allowed", "check", "mask", "principal_of", "rights_of", "set_owner"]

_BIT = {name: 1 << i for i, name in enumerate(RIGHTS)}
ALL_RIGHTS = sum(_BIT.values())


def principal_of(tr: Transaction) -> str:
    """The principal ``tr`` acts for: its database's (``open(url, principal=...)``)."""
    found = getattr(tr.db, "principal", None)
    return found if isinstance(found, str) and found else ANONYMOUS


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


def allowed(owner: str | None, acl: Mapping[str, int], principal: str, right: str) -> bool:
    """Whether ``principal`` holds ``right`` on a queue of ``owner`` and ``acl``."""
    if owner is None or principal == owner:
        return True
    return bool(acl.get(principal, 0) & _BIT[right])


def check(
    tr: Transaction, keys: QueueKeys, right: str, meta: Meta | None = None, also: Sequence[bytes] = ()
) -> list[bytes | None]:
    """Raise AccessDeniedError unless ``tr``'s principal holds ``right`` on the queue; call it
    before anything is written. Uses ``meta`` when the caller read it (no read); else reads
    the guard key with ``also``, the keys the caller reads next, in one round trip (snapshot
    reads, with the read conflicts a serializable read of ``also`` takes), and returns their
    values."""
    if meta is not None:
        owner, acl = meta.owner, meta.acl
        values: list[bytes | None] = []
    else:
        found = tr.snapshot.get_many([keys.guard, *also])
        for key in also:
            tr.add_read_conflict_key(key)
        owner, acl = decode_guard(found[0])
        values = found[1:]
    if owner is not None:
        who = principal_of(tr)
        if not allowed(owner, acl, who, right):
            raise AccessDeniedError(who, keys.name, right)
    return values


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
    (a new metadata version: ``config.read_meta``)."""
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
