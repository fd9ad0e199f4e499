"""Virtual time: hundreds of clients in one thread, each one a greenlet, on a discrete-event clock.

A client is ordinary blocking code - the layer's own ``Queue.enqueue``, ``lease_many``, ``ack``
on a :class:`~fdbqueue.engines.sim.cluster.ClusterDatabase` - run in a greenlet. Whenever the
cluster model says that something takes time (a read version, a read, a commit batch, a retry's
backoff, ``db.sleep``), the client calls :meth:`VirtualTime.sleep`: it is put on the event heap at
``now + seconds`` and control goes back to the scheduler, which wakes the client whose time comes
first. No real time passes while a client waits, so a run's cost is the CPU its clients use, and
the clock shows what the modelled cluster would take.

Deterministic: events at equal times run in the order they were scheduled (a sequence number
breaks ties), one at a time, in one thread; no thread, no wall clock and no unseeded randomness
decides an order. The store lock of the sim engine is never held across a :meth:`sleep` (the
model sleeps before it takes it), so clients in one thread cannot deadlock on it.

The idea is FoundationDB's own simulator (``flow/`` and ``fdbrpc/sim2.actor.cpp``: every actor of
a whole cluster on one thread, against a simulated clock), applied here to the clients.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from fdbqueue.engines.sim.store import ManualClock
from fdbqueue.errors import MissingExtraError

try:
    import greenlet
except ImportError as exc:  # the model extra: a clear error, not a bare ImportError
    raise MissingExtraError("fdbqueue.engines.sim.cluster", "model", exc.name) from exc

__all__ = ["Client", "VirtualTime"]


class Client:
    """One client of a :class:`VirtualTime`: ``fn(*args)`` in its own greenlet.

    ``result`` is what it returned once ``done``; ``error`` what it raised (the scheduler's
    :meth:`VirtualTime.run` re-raises it unless the client was spawned with ``errors="keep"``).
    """

    def __init__(self, name: str, glet: greenlet.greenlet) -> None:
        self.name = name
        self.glet = glet
        self.done = False
        self.result: Any = None
        self.error: BaseException | None = None

    def __repr__(self) -> str:
        return f"Client({self.name!r}, done={self.done})"


class VirtualTime(ManualClock):
    """A discrete-event clock that clients (greenlets) sleep on; a :class:`ManualClock` to the sim.

    Make it in the thread that will call :meth:`run` (its scheduler is that thread's greenlet).
    Outside a client (set-up code in the scheduler's own greenlet), :meth:`sleep` just moves
    the clock on.
    """

    def __init__(self, start: float = 0.0) -> None:
        super().__init__(start)
        self._hub = greenlet.getcurrent()
        self._heap: list[tuple[float, int, Client]] = []
        self._seq = itertools.count()
        self._clients: list[Client] = []
        self._current: Client | None = None
        self.switches = 0  # how many times a client was woken (the run's cost)

    @property
    def current(self) -> Client | None:
        """The client running now, None in the scheduler's own greenlet."""
        return self._current

    def spawn(self, fn: Callable[..., Any], *args: Any, name: str = "", delay: float = 0.0) -> Client:
        """Start ``fn(*args)`` as a client at ``now + delay``; it runs once :meth:`run` reaches it."""
        client: Client

        def body() -> None:
            try:
                client.result = fn(*args)
            except greenlet.GreenletExit:
                pass
            except BaseException as exc:  # kept for run() to re-raise in the scheduler
                client.error = exc
            finally:
                client.done = True

        client = Client(name or f"client-{len(self._clients)}", greenlet.greenlet(body, parent=self._hub))
        self._clients.append(client)
        heapq.heappush(self._heap, (self._now + max(0.0, delay), next(self._seq), client))
        return client

    def sleep(self, seconds: float) -> None:
        """Let ``seconds`` of virtual time pass for the calling client (others run meanwhile)."""
        client = self._current
        if client is None or greenlet.getcurrent() is not client.glet:
            if seconds > 0:
                self.advance(seconds)
            return
        heapq.heappush(self._heap, (self._now + max(0.0, seconds), next(self._seq), client))
        self._hub.switch()

    def run(self, until: float | None = None) -> None:
        """Wake clients in time order until none is left or the next wakes after ``until``.

        Re-raises the first error a client raised (with the client named). Clients still
        sleeping stay scheduled: ``run`` may be called again to go on.
        """
        if greenlet.getcurrent() is not self._hub:
            raise RuntimeError("VirtualTime.run() must be called from the greenlet that made the clock")
        heap = self._heap
        while heap:
            at, _, client = heap[0]
            if until is not None and at > until:
                break
            heapq.heappop(heap)
            if client.done:
                continue
            if at > self._now:
                self._now = at
            self._current = client
            self.switches += 1
            try:
                client.glet.switch()
            finally:
                self._current = None
            if client.error is not None:
                error, client.error = client.error, None
                raise RuntimeError(f"{client.name} failed: {error!r}") from error
        if until is not None and until > self._now:
            self._now = until

    def close(self) -> None:
        """End every client still sleeping (GreenletExit in each: their ``finally`` blocks run)."""
        pending = [c for c in self._clients if not c.done]
        self._heap.clear()
        for client in pending:
            self._current = client
            try:
                client.glet.throw(greenlet.GreenletExit)
            finally:
                self._current = None
        self._clients = [c for c in self._clients if not c.done]

    def __enter__(self) -> VirtualTime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
