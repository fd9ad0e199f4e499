"""Store-and-forward: ``RemoteQueue`` enqueues to a remote database when it answers, else to a
local queue that a forwarder drains to the remote when it is back.

The queue manager's model between systems (Bernstein & Newcomer): a client enqueues locally
whether or not the server is up, and the requests are forwarded later. Four rules keep it
exactly once and in order:

* **Exactly once across an unanswered remote enqueue.** Each message gets an id and a dedup
  key before its first attempt; the remote enqueue uses both (a retry after
  commit_unknown_result finds the first one), and when the attempt ends without an answer
  (timeout, outage) the local copy keeps the id, is enqueued with the key, and names it in the
  ``fdbqueue-remote-dedup`` header. The forwarder skips a copy the remote holds already (this
  very id, or the key within its window), and for one it installs writes the key there in
  the same transaction, so a remote commit that lands late conflicts instead of adding a
  second copy (FoundationDB resolves a commit against its read version, however late it
  arrives): remotededup.py. The remote remembers a key for its queue's ``dedup_window`` (an
  hour by default): a remote down longer than that after an unanswered commit may get the
  message twice.
* **A producer's dedup key is one message, one id, whichever side each attempt took.** Before
  its remote attempt, an enqueue with ``dedup_key`` looks for the key in the local queue (an
  earlier attempt that went local, or went remote: that one's id is recorded locally); the
  local copy is enqueued with the key; and the forwarder carries the key to the remote, where
  a direct enqueue with it finds the forwarded message.
* **Inside a caller's transaction it is always local**, so the message commits or aborts
  with the caller's own writes.
* **One producer's order.** After a message went local, this producer's next messages go
  local too while anything waits in the local queue (ready, leased by the forwarder or
  delayed); the forwarder moves them in order, so none overtakes an earlier one.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from fdbqueue.api.admin import queue_stats
from fdbqueue.api.queue import Queue
from fdbqueue.engines.contract import Database, Transaction, adopt, is_transaction
from fdbqueue.errors import ClusterUnavailableError, EngineError, QueueError, QueueNotFoundError, StoreError
from fdbqueue.ops.enqueuing import enqueue_items, first_of
from fdbqueue.ops.items import new_item
from fdbqueue.ops.privileges import checked
from fdbqueue.ops.remotededup import DEDUP_HEADER
from fdbqueue.ops.txn import run_once
from fdbqueue.runtime.forwarding import Forwarder
from fdbqueue.store.clock import db_now
from fdbqueue.store.config import QueueConfig, write_config
from fdbqueue.store.entropy import new_id
from fdbqueue.store.layout import DEFAULT_ROOT
from fdbqueue.types import Item, check_duration

log = logging.getLogger("fdbqueue.runtime.remote")
_Args = tuple[object, int, Mapping[str, Any] | None, float, float | None]  # an enqueue's, for new_item

# What "the remote did not answer" is: a timeout, an unreachable cluster or store, or a
# retryable error that outlasted the attempt's time (each leaves the outcome unknown).
_NO_ANSWER = (1031, 1004)


@dataclass
class RemoteStats:
    """Where a RemoteQueue's messages went: to the remote directly, or to the local queue."""

    remote: int = 0
    local: int = 0


class RemoteQueue:
    """Queue ``name`` of ``remote``, with queue ``local_name`` (default ``name``) of ``local``
    as its store-and-forward buffer (see the module docstring). A handle for one producer:
    its enqueues keep their order; share one between threads and they take turns."""

    def __init__(
        self,
        name: str,
        *,
        remote: Database,
        local: Database,
        timeout: float = 1.0,
        local_name: str | None = None,
        root: tuple[Any, ...] = DEFAULT_ROOT,
    ) -> None:
        remote_db, local_db = adopt(remote), adopt(local)
        if is_transaction(remote_db) or is_transaction(local_db):
            raise QueueError("RemoteQueue takes two Databases (a caller's transaction goes to enqueue)")
        self.remote_db: Database = remote_db  # type: ignore[assignment]
        self.local_db: Database = local_db  # type: ignore[assignment]
        self.timeout = check_duration("timeout", timeout)
        if self.timeout <= 0:
            raise QueueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.remote = Queue(name, root=root)
        self.local = Queue(local_name or name, root=root)
        self.stats = RemoteStats()
        self._lock = threading.Lock()
        self._local_first = False  # a message of this producer went local: later ones follow it

    def __repr__(self) -> str:
        return f"RemoteQueue({self.remote.name!r}, local={self.local.name!r})"

    def enqueue(
        self,
        tr: Transaction | None,
        payload: object,
        *,
        priority: int = 0,
        delay: float = 0.0,
        ttl: float | None = None,
        headers: Mapping[str, Any] | None = None,
        dedup_key: str | None = None,
        autonomous: bool = False,
        timeout: float | None = None,
    ) -> str:
        """Enqueue ``payload`` (with :meth:`Queue.enqueue`'s options); returns its id.

        ``tr`` None: to the remote when it answers within ``timeout``, else (or while this
        producer's earlier messages wait locally) to the local queue; exactly once either
        way, and the same ``dedup_key`` is one message with one id whichever side each
        attempt took. ``tr``, a transaction of the local database: to the local queue, inside
        it (``autonomous`` as :meth:`Queue.enqueue`'s).
        """
        args: _Args = (payload, priority, headers, delay, ttl)
        new_item(*args, dedup_key)  # every check (reserved header names too) before any I/O
        if tr is not None:
            t = adopt(tr)
            if not is_transaction(t):
                raise QueueError("enqueue takes a transaction of the local database, or None")
            item = _local_item(args, dedup_key, None)
            if autonomous:
                mid: str = self.local._autonomous(t, item)  # type: ignore[arg-type]
            else:
                mid = enqueue_items(self.local.keys, t, [item], timeout)[0]
            with self._lock:
                self._local_first = True
            return mid
        with self._lock:
            if dedup_key is not None:
                seen = self._local_entry(dedup_key)  # an earlier attempt with this key, either side
                if seen is not None:
                    return seen
            if self._local_first and self._waiting_locally():
                return self._to_local(_local_item(args, dedup_key, None), timeout)
            key = dedup_key or f"rq-{uuid.uuid4().hex}"
            msg_id = new_id()  # the local copy keeps it: the forwarder knows the message at the remote
            sent = self._to_remote(new_item(*args, key)._replace(id=msg_id, fixed_id=True))
            if sent is not None:
                self._local_first = False
                self.stats.remote += 1
                if dedup_key is not None:  # a later attempt that goes local finds this id
                    self._remember(dedup_key, sent)
                return sent
            return self._to_local(_local_item(args, key, msg_id), timeout)

    def _waiting_locally(self) -> bool:
        try:
            st = queue_stats(self.local_db, self.local.name, root=self.local.root)
        except QueueNotFoundError:
            return False
        return bool(st.ready or st.inflight or st.delayed)

    def _local_entry(self, key: str, remember: str | None = None) -> str | None:
        """The id the local queue's dedup entry for ``key`` names within its window, or None;
        with ``remember``, an entry naming that id is written when there is none (one local
        transaction, under the enqueue right, as the local enqueue's own check)."""
        keys = self.local.keys

        def body(t: Transaction, _: bool) -> str | None:
            meta = checked(t, keys, "enqueue")
            cfg = meta.config or QueueConfig()
            now = db_now(t)
            seen = first_of(t.get(keys.dedup_key(key)), cfg, now)
            if seen is None and remember is not None:
                if meta.config is None:
                    write_config(t, keys, cfg)  # the queue made, as its first enqueue would
                t.set(keys.dedup_key(key), f"{remember}|{now}".encode())
                t.set(keys.dedup_time_key(now, key), b"")
            return seen

        return run_once(self.local_db, body)

    def _remember(self, key: str, msg_id: str) -> None:
        """Best effort: the message is at the remote, whose own entry dedups a later remote
        attempt; this one only gives a later local attempt the same id (the forwarder skips
        that copy either way, the key being the layer's and the remote's)."""
        try:
            self._local_entry(key, msg_id)
        except (EngineError, QueueError) as exc:
            log.warning("RemoteQueue %r: dedup key %r not recorded locally: %s", self.remote.name, key, exc)

    def _to_local(self, item: Item, timeout: float | None) -> str:
        mid = enqueue_items(self.local.keys, self.local_db, [item], timeout)[0]
        self._local_first = True
        self.stats.local += 1
        return mid

    def _to_remote(self, item: Item) -> str | None:
        """The remote enqueue within ``timeout``; None when the remote did not answer."""
        try:
            tr = self.remote_db.create_transaction()
            tr.options.set_timeout(max(1, round(self.timeout * 1000)))
            try:
                while True:
                    try:
                        mid = enqueue_items(self.remote.keys, tr, [item], None)[0]
                        tr.commit()
                        return mid
                    except EngineError as exc:
                        tr.on_error(exc)  # retryable: again (1021 finds the first by its key)
            finally:
                tr.cancel()
        except (ClusterUnavailableError, StoreError):
            return None
        except EngineError as exc:
            if exc.code in _NO_ANSWER or exc.retryable:
                return None
            raise

    def forwarder(self, **options: Any) -> Forwarder:
        """A :class:`Forwarder` from the local queue to the remote one (``options``: its own;
        ``exclusive`` by default: the local queue is this outbox's, no one else consumes it);
        run it (``follow=True`` as a service) to drain what went local."""
        options.setdefault("exclusive", True)
        return Forwarder(
            self.local_db, self.local.name, self.remote_db, self.remote.name, root=self.local.root, **options
        )


def _local_item(args: _Args, key: str | None, msg_id: str | None) -> Item:
    """A local copy: enqueued with ``key`` (the source's entry that confirms the header to the
    forwarder) and naming it in DEDUP_HEADER; with ``msg_id``, the id of its remote attempt."""
    item = new_item(*args, key, None if key is None else {DEDUP_HEADER: key})
    return item if msg_id is None else item._replace(id=msg_id, fixed_id=True)
