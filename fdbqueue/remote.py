"""Store-and-forward: ``RemoteQueue`` enqueues to a remote database when it answers, else to a
local queue that a forwarder drains to the remote when it is back.

The queue manager's model between systems (Bernstein & Newcomer): a client enqueues locally
whether or not the server is up, and the requests are forwarded later. Three rules keep it
exactly once and in order:

* **Exactly once across an unanswered remote enqueue.** Each message gets a dedup key before
  its first attempt; the remote enqueue uses it (a retry after commit_unknown_result finds
  the first one), and when the attempt ends without an answer (timeout, outage) the local
  copy carries it in the ``fdbqueue-remote-dedup`` header. The forwarder installs such a copy
  only when the remote has no message under that key, and writes the key there in the same
  transaction, so a remote commit that lands late conflicts instead of adding a second copy
  (FoundationDB resolves a commit against its read version, however late it arrives). The
  remote remembers a key for its queue's ``dedup_window`` (an hour by default): a remote down
  longer than that after an unanswered commit may get the message twice.
* **Inside a caller's transaction it is always local**, so the message commits or aborts
  with the caller's own writes.
* **One producer's order.** After a message went local, this producer's next messages go
  local too while anything waits in the local queue (ready, leased by the forwarder or
  delayed); the forwarder moves them in order, so none overtakes an earlier one.
"""

from __future__ import annotations

import threading
import uuid
from dataclasses import dataclass
from typing import Any

from fdbqueue.admin import queue_stats
from fdbqueue.engines.base import Database, Transaction, adopt, is_transaction
from fdbqueue.errors import ClusterUnavailableError, EngineError, QueueError, QueueNotFoundError, StoreError
from fdbqueue.forwarding import DEDUP_HEADER, Forwarder
from fdbqueue.layout import DEFAULT_ROOT
from fdbqueue.queue import Queue
from fdbqueue.txn import seconds

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
        self.timeout = seconds("timeout", timeout)
        if self.timeout <= 0:
            raise QueueError(f"timeout must be > 0 seconds, got {timeout!r}")
        self.remote = Queue(name, root=root)
        self.local = Queue(local_name or name, root=root)
        self.stats = RemoteStats()
        self._lock = threading.Lock()
        self._local_first = False  # a message of this producer went local: later ones follow it

    def __repr__(self) -> str:
        return f"RemoteQueue({self.remote.name!r}, local={self.local.name!r})"

    def enqueue(self, tr: Transaction | None, payload: object, **options: Any) -> str:
        """Enqueue ``payload`` (with :meth:`Queue.enqueue`'s options); returns its id.

        ``tr`` None: to the remote when it answers within ``timeout``, else (or while this
        producer's earlier messages wait locally) to the local queue; exactly once either
        way. ``tr``, a transaction of the local database: to the local queue, inside it.
        """
        if tr is not None:
            t = adopt(tr)
            if not is_transaction(t):
                raise QueueError("enqueue takes a transaction of the local database, or None")
            mid = self.local.enqueue(t, payload, **options)
            with self._lock:
                self._local_first = True
            return mid
        with self._lock:
            if self._local_first and self._waiting_locally():
                return self._to_local(payload, options, None)
            key = options.pop("dedup_key", None) or f"rq-{uuid.uuid4().hex}"
            sent = self._to_remote(payload, options, key)
            if sent is not None:
                self._local_first = False
                self.stats.remote += 1
                return sent
            return self._to_local(payload, options, key)

    def _waiting_locally(self) -> bool:
        try:
            st = queue_stats(self.local_db, self.local.name, root=self.local.root)
        except QueueNotFoundError:
            return False
        return bool(st.ready or st.inflight or st.delayed)

    def _to_local(self, payload: object, options: dict[str, Any], key: str | None) -> str:
        if key is not None:
            options = {**options, "headers": {**(options.get("headers") or {}), DEDUP_HEADER: key}}
        mid = self.local.enqueue(self.local_db, payload, **options)
        self._local_first = True
        self.stats.local += 1
        return mid

    def _to_remote(self, payload: object, options: dict[str, Any], key: str) -> str | None:
        """The remote enqueue within ``timeout``; None when the remote did not answer."""
        try:
            tr = self.remote_db.create_transaction()
            tr.options.set_timeout(max(1, round(self.timeout * 1000)))
            try:
                while True:
                    try:
                        mid = self.remote.enqueue(tr, payload, dedup_key=key, **options)
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
