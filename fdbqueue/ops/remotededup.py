"""The dedup key a RemoteQueue's local copy carries to the remote, and when the forwarder may
skip a message for it.

A ``RemoteQueue`` keeps a message locally (its remote enqueue ended without an answer, the
remote was down, or the call was inside a local transaction) under the id and dedup key of its
remote attempt, with the key in the header ``fdbqueue-remote-dedup`` (DEDUP_HEADER). A header
proves nothing by itself: a caller's is refused at enqueue (items.unreserved), but one may
reach a store otherwise (an older version, a raw write). So the forwarder acts on it only as
far as the two stores confirm it, and a header alone never makes a message vanish:

* **This very message is there**: the destination holds the message's id, or its dedup entry
  for the key names the message's id (a remote commit that landed unanswered: the attempt and
  the local copy share the id). Skipped: installing it would make a second copy.
* **The key is the layer's**: the source's dedup entry for the key names the message (the
  RemoteQueue wrote it with the message, in one transaction). Then the key is the producer's
  too: the message is skipped when the destination has seen the key within its dedup window
  (as an enqueue with that key would write nothing), and installing it writes the key there,
  so that a direct enqueue with the key finds it, and the unanswered commit, were it to land
  late, conflicts (it read the key) instead of adding a copy.

Otherwise the header is dropped on install and the message forwarded as any other.
"""

from __future__ import annotations

from collections.abc import Mapping

from fdbqueue.engines.contract import Database, Transaction
from fdbqueue.errors import QueueError
from fdbqueue.ops.enqueuing import first_of
from fdbqueue.ops.txn import run_once
from fdbqueue.store.config import QueueConfig
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.meta import read_meta
from fdbqueue.store.record import check_dedup_key
from fdbqueue.types import Message

DEDUP_HEADER = "fdbqueue-remote-dedup"


def header_key(m: Message) -> str | None:
    """The dedup key ``m``'s header names, when it is one an enqueue would take; else None."""
    key = m.headers.get(DEDUP_HEADER)
    if not isinstance(key, str) or not key:
        return None
    try:
        check_dedup_key(key)
    except QueueError:
        return None
    return key


def _named(entry: bytes) -> str:
    """The message id a dedup entry (``b"<id>|<version>"``) names."""
    return entry.decode().split("|", 1)[0]


def layer_keys(src_db: Database, skeys: QueueKeys, batch: list[Message]) -> dict[str, str]:
    """The dedup keys of ``batch``'s headers that the source's own entries confirm, by message
    id: one read-only transaction of the source, none when no message names a key."""
    named = {m.id: k for m in batch if m.headers and (k := header_key(m)) is not None}
    if not named:
        return {}

    def body(t: Transaction, _: bool) -> dict[str, str]:
        entries = t.get_many([skeys.dedup_key(k) for k in named.values()])
        return {
            mid: k
            for (mid, k), e in zip(named.items(), entries, strict=True)
            if e is not None and _named(e) == mid
        }

    return run_once(src_db, body)


def already_there(
    t: Transaction, dkeys: QueueKeys, batch: list[Message], layer: Mapping[str, str], now: int
) -> set[str]:
    """The ids of ``batch`` the destination has already (the module docstring says when), read
    in the install's transaction ``t``; ``layer``: :func:`layer_keys`' answer."""
    return there_named(t, dkeys, [(m.id, k) for m in batch if (k := header_key(m)) is not None], layer, now)


def there_named(
    t: Transaction, dkeys: QueueKeys, named: list[tuple[str, str]], layer: Mapping[str, str], now: int
) -> set[str]:
    """:func:`already_there` for (message id, header key) pairs: a leased forwarder's pending
    copies keep the key aside (``transit.install``) and are published after the source let go."""
    if not named:
        return set()
    entries = t.get_many([dkeys.dedup_key(k) for _, k in named])
    held = t.get_many([dkeys.id_key(mid) for mid, _ in named])
    cfg: QueueConfig | None = None
    out: set[str] = set()
    for (mid, _), entry, at in zip(named, entries, held, strict=True):
        if at is not None or (entry is not None and _named(entry) == mid):
            out.add(mid)  # this very message
        elif entry is not None and mid in layer:
            if cfg is None:
                cfg = read_meta(t, dkeys).config or QueueConfig()
            if first_of(entry, cfg, now) is not None:
                out.add(mid)  # the producer's key, seen within the window
    return out


def carry(t: Transaction, dkeys: QueueKeys, key: str, msg_id: str, now: int) -> None:
    """The layer's ``key`` written at the destination for ``msg_id``, installed in ``t``."""
    t.set(dkeys.dedup_key(key), f"{msg_id}|{now}".encode())
    t.set(dkeys.dedup_time_key(now, key), b"")
