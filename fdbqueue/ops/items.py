"""An enqueue's arguments as Items: checked and encoded, nothing read or written, and what a
batch of them costs its transaction.

The functions under :meth:`fdbqueue.Queue.enqueue` and ``enqueue_many`` before anything is
read (``ops/enqueuing.py`` writes the Items), and under the layers that make new messages
too (schedules, remote queues).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from fdbqueue.engines.limits import TRANSACTION_SIZE_LIMIT
from fdbqueue.errors import BudgetExceededError, QueueError
from fdbqueue.ops.moves.arrivals import CHUNK_SIZE
from fdbqueue.ops.tracing import inject
from fdbqueue.store.budget import LAYER_MARGIN_BYTES, USER_TXN_LIMIT, set_cost
from fdbqueue.store.entropy import new_id, new_rand, random_bytes
from fdbqueue.store.layout import QueueKeys
from fdbqueue.store.record import (
    CRC_BYTES,
    Record,
    check_dedup_key,
    check_headers,
    coerce_payload,
    payload_list,
)
from fdbqueue.types import ContentType, Item, NewMessage, check_duration

_BYTES = ContentType.BYTES
# An Item made by tuple's own constructor: every field given (the named tuple's __new__ is
# Python code that fills in the defaults); delay, ttl, dedup_key and the defaults after them.
_new_item = tuple.__new__
_PLAIN_TAIL = (0.0, None, None, *Item._field_defaults.values())
assert Item._fields[-len(_PLAIN_TAIL) :] == ("delay", "ttl", "dedup_key", *Item._field_defaults)


def new_item(
    payload: object,
    priority: int,
    headers: Mapping[str, Any] | None,
    delay: float,
    ttl: float | None,
    dedup_key: str | None,
    layer: Mapping[str, str] | None = None,
) -> Item:
    """An enqueue's arguments checked and encoded (nothing read or written). ``layer``: the
    headers the layer itself sets (a schedule's name, a RemoteQueue's dedup key), added after
    ``headers`` are checked for names it reserves."""
    if (
        payload.__class__ is bytes
        and priority.__class__ is int
        and -(2**31) <= priority < 2**31
        and delay.__class__ is float
        and delay == 0.0
        and ttl is None
        and dedup_key is None
        and headers is None
        and layer is None
    ):
        # The common call (bytes, no options): what the checks below conclude, without their
        # calls (a plain int and a float 0.0 are what they pass through unchanged). The
        # current trace's context is added as below (tracing.inject).
        traced = inject(None)
        hdrs = {} if traced is None else check_headers(traced)
        return _new_item(Item, ("", new_rand(), payload, _BYTES, priority, hdrs, *_PLAIN_TAIL))
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise QueueError(f"priority must be an int, not {type(priority).__name__}")
    if not -(2**31) <= priority < 2**31:
        raise QueueError(f"priority must fit in 32 bits, got {priority}")
    delay = check_duration("delay", delay)
    if ttl is not None:
        ttl = check_duration("ttl", ttl)
        if ttl == 0:
            raise QueueError("ttl must be > 0 (None: never expires)")
    if dedup_key is not None and (not isinstance(dedup_key, str) or not dedup_key):
        raise QueueError("dedup_key must be a non-empty str")
    if dedup_key is not None:
        check_dedup_key(dedup_key)
    data, ctype = coerce_payload(payload)
    # Reserved names refused, then the layer's headers and the current trace's context added.
    hdrs = check_headers(inject(unreserved(headers, layer)))
    # A ready message's id names its home key (see _write_new): none to make here.
    msg_id = new_id() if delay > 0 else ""
    return Item(msg_id, new_rand(), data, ctype, priority, hdrs, delay, ttl, dedup_key)


# Header names the layer writes itself (``fdbqueue-remote-dedup``, which the forwarder acts on,
# ``fdbqueue-schedule``, ``fdbqueue-tick``): a caller's headers may not use the prefix, in any case.
# (``traceparent`` is not reserved: W3C Trace Context lets a caller set its own, tracing.py.)
RESERVED_HEADER_PREFIX = "fdbqueue-"


def unreserved(
    headers: Mapping[str, Any] | None, layer: Mapping[str, str] | None = None
) -> Mapping[str, Any] | None:
    """A caller's ``headers``, refused (QueueError) when a name has the reserved prefix, with
    the layer's own ``layer`` headers added."""
    if headers is None:  # the common case, without the ABC's isinstance (Python code)
        return {**layer} if layer else None
    if isinstance(headers, Mapping):
        for k in headers:
            if isinstance(k, str) and k.lower().startswith(RESERVED_HEADER_PREFIX):
                raise QueueError(
                    f"header {k!r}: names beginning {RESERVED_HEADER_PREFIX!r} are reserved for "
                    "fdbqueue's own use"
                )
    if not layer or not (headers is None or isinstance(headers, Mapping)):
        return headers  # (headers of the wrong type: check_headers says so)
    return {**(headers or {}), **layer}


def batch_items(
    keys: QueueKeys,
    payloads: Iterable[object],
    priority: int,
    headers: Mapping[str, Any] | None,
    delay: float,
    ttl: float | None,
) -> list[Item]:
    """``enqueue_many``'s items: a :class:`NewMessage`'s fields left None take the call's.

    A batch past what FoundationDB accepts in one transaction (``USER_TXN_LIMIT``,
    docs/budgets.md) is refused with BudgetExceededError before anything is written.
    """
    if (
        payloads.__class__ in (list, tuple)  # (no caller's code runs while it is read)
        and headers is None
        and priority.__class__ is int
        and -(2**31) <= priority < 2**31
        and delay.__class__ is float
        and delay == 0.0
        and ttl is None
    ):
        # The common batch (no options): new_item's short way, the trace context asked once
        # for the batch and the random parts drawn in one go; NewMessages and payloads not of
        # bytes take the long way.
        payloads = list(payload_list(payloads))
        traced = inject(None)
        pool = random_bytes(8 * len(payloads))
        items = [
            _new_item(
                Item,
                (
                    "",
                    pool[8 * i : 8 * i + 8],
                    p,
                    _BYTES,
                    priority,
                    {} if traced is None else check_headers(traced),
                    *_PLAIN_TAIL,
                ),
            )
            if p.__class__ is bytes
            else _item_of(p, priority, headers, delay, ttl)
            for i, p in enumerate(payloads)
        ]
        check_batch_size(keys, items, journaled=False)
        return items
    items = [_item_of(p, priority, headers, delay, ttl) for p in payload_list(payloads)]
    check_batch_size(keys, items, journaled=False)
    return items


def _item_of(
    p: object, priority: int, headers: Mapping[str, Any] | None, delay: float, ttl: float | None
) -> Item:
    """One of ``enqueue_many``'s payloads as an Item: a :class:`NewMessage`'s fields left None
    take the call's."""
    if not isinstance(p, NewMessage):
        return new_item(p, priority, headers, delay, ttl, None)
    return new_item(
        p.payload,
        priority if p.priority is None else p.priority,
        headers if p.headers is None else p.headers,
        delay if p.delay is None else p.delay,
        ttl if p.ttl is None else p.ttl,
        p.dedup_key,
    )


def check_batch_size(keys: QueueKeys, items: list[Item], *, journaled: bool) -> None:
    """Refuse (BudgetExceededError, nothing written) a batch FoundationDB would refuse as
    one transaction: over ``TRANSACTION_SIZE_LIMIT`` less the layer's margin (budget.py).
    ``journaled``: each message also writes its journal entries."""
    # write_cost of the common message (no headers, delay, TTL nor dedup key, inline): a
    # set of the record, whose cost grows with the payload's length byte for byte.
    plain = set_cost(len(keys.packed) + 40, _PLAIN_RECORD + 32)
    cost = 0
    for it in items:
        n = len(it.payload)
        if journaled or it.headers or n > CHUNK_SIZE or it.delay > 0 or it.ttl is not None or it.dedup_key:
            cost += write_cost(keys, it, journaled=journaled)
        else:
            cost += plain + n
    if cost > USER_TXN_LIMIT:
        raise BudgetExceededError(
            f"enqueue_many of {len(items):,} messages would write about {cost:,} bytes in one "
            f"transaction, past what FoundationDB accepts ({TRANSACTION_SIZE_LIMIT:,} bytes, less "
            f"{LAYER_MARGIN_BYTES:,} for the layer's own keys): split it"
        )


# The encoded length of write_cost's record for a message without headers whose payload is
# inline, less the payload's (the same for every content type: each is one letter).
_PLAIN_RECORD = len(Record("r" * 80, 0, "b", {}, 0, 0, 0, {}, b"").encode())
assert all(len(ct.value) == 1 for ct in ContentType)


def write_cost(keys: QueueKeys, it: Item, *, journaled: bool = False) -> int:
    """An upper bound of the bytes one new message adds to its transaction (budget.py)."""
    k = len(keys.packed) + 40  # a ready key: the prefix, then at most 38 bytes
    chunks = math.ceil(len(it.payload) / CHUNK_SIZE) if len(it.payload) > CHUNK_SIZE else 0
    inline = b"" if chunks else it.payload
    raw = Record("r" * 80, 0, it.content_type.value, it.headers, 0, 0, chunks, {}, inline).encode()
    cost = set_cost(k, len(raw) + 32)
    if it.delay > 0 or it.ttl is not None:
        cost += 2 * set_cost(k, k)  # its id and expiry entries
    if it.dedup_key is not None:  # its two dedup keys (the key packed up to twice as long)
        cost += 2 * set_cost(k + 2 * len(it.dedup_key.encode()), 64)
    if journaled:  # an entry and a history pointer (journaling.record)
        cost += 2 * set_cost(k + len(keys.name.encode()) + 24, 160)
    return cost + chunks * set_cost(k + 32, CHUNK_SIZE + CRC_BYTES)


def plain_item(payload: bytes, priority: int, rand: bytes) -> Item:
    """:func:`new_item`'s Item of the common call (``payload`` bytes, ``priority`` a checked
    int, no option, no trace context) with its random part ``rand`` drawn already."""
    return _new_item(Item, ("", rand, payload, _BYTES, priority, {}, *_PLAIN_TAIL))
