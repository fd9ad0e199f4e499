"""Partitioned queues and routing: parameter-based routing for scale-out (Bernstein & Newcomer,
the queue manager), and FoundationDB's answer to a hot shard (apple/foundationdb
``design/hotshard.md``): one queue's traffic spread over several queues, so over several key
ranges.

``PartitionedQueue("orders", partitions=8, key="customer")`` sends a message to
``orders.p<h % 8>`` where ``h`` is a stable hash of its routing value (a header, or a function of
payload and headers); ``set_route`` maps one value to a named queue instead (kept in the
database, so every producer follows a change from its next transaction; messages already
queued stay where they are).

A partitioned queue's rights are its partitions': the partitions are the queues that hold
its messages, so whoever may not read those may not redirect them either. ``set_route``
needs ``admin`` on every partition that exists, ``routes`` needs ``browse`` on each; and a
route of a value whose partition is owned is followed only to a queue of the same owner (a
route set while the partitions were open to all cannot hand their messages to a stranger).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from fdbqueue.api.admin import queue_stats
from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction, adopt, is_transaction
from fdbqueue.errors import AccessDeniedError, ForeignQueueError, QueueError, QueueNotFoundError
from fdbqueue.ops.privileges import principal_of
from fdbqueue.ops.receipts import run_once_confirmed
from fdbqueue.ops.txn import run_once
from fdbqueue.store.codec import stable_hash, utf8
from fdbqueue.store.guard import allowed, decode_guard
from fdbqueue.store.layout import (
    DEFAULT_ROOT,
    QueueKeys,
    partitioned_key,
    partitioned_name,
    partitioned_range,
    queues_prefix_range,
    root_subspace,
    route_key,
    route_range,
    route_value,
)
from fdbqueue.types import Message, QueueStats

RouteKey = str | Callable[[Any, Mapping[str, Any]], str]
MAX_PARTITIONS = 1024


def check_routing_value(value: object) -> str:
    """``value`` when it can be a routing value (a str UTF-8 can encode: it is hashed, and
    goes into a route's key), else a clear QueueError (InvalidTextError for a lone surrogate)."""
    if not isinstance(value, str):
        raise QueueError(f"a routing value is a str, got {value!r}")
    utf8(value, f"routing value {value!r}")
    return value


class PartitionedQueue:
    """A queue spread over ``partitions`` queues ``name.p0 .. name.pN-1`` by a routing value:
    the header ``key`` names, or ``key(payload, headers)``. A handle: no I/O."""

    def __init__(
        self, name: str, *, partitions: int, key: RouteKey, root: tuple[Any, ...] = DEFAULT_ROOT
    ) -> None:
        if (
            isinstance(partitions, bool)
            or not isinstance(partitions, int)
            or not 1 <= partitions <= MAX_PARTITIONS
        ):
            raise QueueError(f"partitions must be an int from 1 to {MAX_PARTITIONS}, got {partitions!r}")
        if not (isinstance(key, str) and key) and not callable(key):
            raise QueueError(
                f"key must be a header name or a function (payload, headers) -> str, got {key!r}"
            )
        self.keys = QueueKeys.make(name, root)  # validates the name; receipts of routed enqueues
        self.name = name
        self.root = root
        self.partitions = partitions
        self.key = key
        self.queues = [Queue(f"{name}.p{i}", root=root) for i in range(partitions)]
        self._registered = False  # written once a handle: what `fdbqueue list` shows

    def __repr__(self) -> str:
        return f"PartitionedQueue({self.name!r}, partitions={self.partitions})"

    def partition_of(self, value: str) -> str:
        """The partition routing value ``value`` hashes to (``set_route`` aside): the same in
        every process and Python version."""
        check_routing_value(value)
        return self.queues[stable_hash(value) % self.partitions].name

    def _value(self, payload: object, headers: Mapping[str, Any] | None) -> str:
        value: object
        if callable(self.key):
            value = self.key(payload, dict(headers or {}))
        else:
            value = (headers or {}).get(self.key)
            if value is None:
                raise QueueError(
                    f"partitioned queue {self.name!r} routes by header {self.key!r}: the message has none"
                )
        return check_routing_value(value)

    def route(self, tr: Transaction | Database, value: str) -> str:
        """The queue a message of routing value ``value`` goes to now. Needs ``browse`` on
        every partition that exists, as :func:`routes`."""

        def body(t: Transaction, _: bool) -> str:
            check_partitions(t, self.name, "browse", self.root)
            return self._target(t, value)

        return run_once(adopt(tr), body)

    def _target(self, t: Transaction, value: str) -> str:
        home = self.partition_of(value)
        routed = t.get(route_key(self.root, self.name, value))
        if routed is None or routed.decode() == home:
            return home
        target = routed.decode()
        # Followed only to a queue of the owner of the partition it redirects (when owned):
        # one more read, for routed values alone.
        hkeys, tkeys = QueueKeys.make(home, self.root), QueueKeys.make(target, self.root)
        owner, _ = decode_guard(t.get(hkeys.guard))
        if owner is not None:
            found, _ = decode_guard(t.get(tkeys.guard))
            if found != owner:
                raise ForeignQueueError(home, owner, target, found, f"routed messages (value {value!r})")
        return target

    def enqueue(self, tr: Transaction | Database, payload: object, **options: Any) -> str:
        """Enqueue into the queue the message's routing value goes to; the route is read in the
        same transaction (a change of route is followed from the next one). Takes
        :meth:`Queue.enqueue`'s options; exactly once given a Database, as it is."""
        value = self._value(payload, options.get("headers"))
        tr = adopt(tr)

        def body(t: Transaction) -> str:
            if not self._registered:  # a blind write of the same value: no conflicts
                info = json.dumps({"partitions": self.partitions}).encode()
                t.set(partitioned_key(self.root, self.name), info)
            return Queue(self._target(t, value), root=self.root).enqueue(t, payload, **options)

        if is_transaction(tr):
            mid = run_once(tr, lambda t, _: body(t))
        else:
            mid = run_once_confirmed(tr, self.keys, body)
            self._registered = True
        return mid

    def size(self, tr: Transaction | Database) -> int:
        """Ready messages over every partition (one transaction)."""
        return run_once(adopt(tr), lambda t, _: sum(q.size(t) for q in self.queues))

    def stats(self, tr: Transaction | Database) -> list[QueueStats]:
        """Each partition's :class:`QueueStats` (partitions never used are left out)."""
        out = []
        for q in self.queues:
            try:
                out.append(queue_stats(tr, q.name, root=self.root))
            except QueueNotFoundError:
                continue
        return out

    def browse(self, tr: Transaction | Database, *, limit: int | None = None) -> Iterator[Message]:
        """Ready messages of every partition, partition by partition, each in dequeue order."""
        left = limit
        for q in self.queues:
            for m in q.browse(tr, limit=left):
                yield m
                if left is not None:
                    left -= 1
                    if left <= 0:
                        return


def set_route(
    tr: Transaction | Database,
    name: str,
    value: str,
    queue: str | None,
    *,
    root: tuple[Any, ...] = DEFAULT_ROOT,
) -> None:
    """Send the messages of routing value ``value`` of partitioned queue ``name`` to ``queue``
    from the next transaction of every producer (None: back to its hashed partition). Messages
    already queued stay where they are. Needs ``admin`` on every partition of ``name`` that
    exists (AccessDeniedError before anything is written). Atomic; composes inside the
    caller's transaction."""
    QueueKeys.make(name, root)
    if not isinstance(value, str) or not value:
        raise QueueError(f"a routing value is a non-empty str, got {value!r}")
    check_routing_value(value)
    if queue is not None:
        QueueKeys.make(queue, root)  # validates the name
    key = route_key(root, name, value)

    def body(t: Transaction, _: bool) -> None:
        check_partitions(t, name, "admin", root)
        if queue is None:
            t.clear(key)
        else:
            t.set(key, queue.encode())

    run_once(adopt(tr), body)


def routes(tr: Transaction | Database, name: str, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> dict[str, str]:
    """The values of partitioned queue ``name`` routed by ``set_route``, and where to. Needs
    ``browse`` on every partition of ``name`` that exists."""
    QueueKeys.make(name, root)

    def body(t: Transaction, _: bool) -> dict[str, str]:
        check_partitions(t, name, "browse", root)
        return route_table(t, name, root)

    return run_once(adopt(tr), body)


def route_table(t: Transaction, name: str, root: tuple[Any, ...]) -> dict[str, str]:
    """:func:`routes` in ``t``, unchecked: for a worker, which serves the routed queues of a
    partitioned queue it holds ``dequeue`` on (each of those queues checks its own right)."""
    return {route_value(root, kv.key): kv.value.decode() for kv in t.get_range(*route_range(root, name))}


_PARTITION = re.compile(r"p(0|[1-9][0-9]{0,3})")


def check_partitions(t: Transaction, name: str, right: str, root: tuple[Any, ...]) -> None:
    """AccessDeniedError unless ``t``'s principal holds ``right`` on every partition of
    partitioned queue ``name`` that exists (below its registered number of partitions, else
    below MAX_PARTITIONS). Two round trips: the registration with the partitions' listing
    keys, then their guards (serializable reads: a grant or revoke meanwhile conflicts)."""
    raw = t.get(partitioned_key(root, name))
    n = int(json.loads(raw)["partitions"]) if raw is not None else MAX_PARTITIONS
    sub, skip = root_subspace(root), len(name) + 1
    parts = []
    for kv in t.get_range(*queues_prefix_range(root, f"{name}.p")):
        qname = str(sub.unpack(kv.key)[1])
        found = _PARTITION.fullmatch(qname[skip:])
        if found is not None and int(found.group(1)) < n:
            parts.append(qname)
    if not parts:
        return
    guards = t.get_many([QueueKeys.make(p, root).guard for p in parts])
    who = principal_of(t)
    for part, guard in zip(parts, guards, strict=True):
        owner, acl = decode_guard(guard)
        if not allowed(owner, acl, who, right):
            raise AccessDeniedError(who, part, right, f"a partition of partitioned queue {name!r}")


def partitioned_queues(tr: Transaction | Database, *, root: tuple[Any, ...] = DEFAULT_ROOT) -> dict[str, int]:
    """The partitioned queues enqueued to under ``root``, and how many partitions each has."""

    def body(t: Transaction, _: bool) -> dict[str, int]:
        return {
            partitioned_name(root, kv.key): int(json.loads(kv.value)["partitions"])
            for kv in t.get_range(*partitioned_range(root))
        }

    return run_once(adopt(tr), body)
