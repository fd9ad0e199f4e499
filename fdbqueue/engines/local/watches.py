"""Watches and versionstamp futures of the in-process engines (sim and sqlite).

An :class:`EventWatch` is completed by its engine from any thread (a commit that changed the
key, the database closing); a :class:`StampFuture` answers once its transaction committed.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from fdbqueue.engines.local.mutations import make_versionstamp
from fdbqueue.errors import EngineError

_CALLBACKS = threading.Lock()  # an on_ready racing the watch's completion

# Set at interpreter exit, before the embedded engine closes the handles a program left open
# (engines/sqlite/shared.py, _at_exit).
EXITING = threading.Event()


def park_at_exit() -> None:
    """In a daemon thread that meets a store closed at interpreter exit: stay here.

    Python stops daemon threads where they stand at exit; the close at exit would instead
    wake one blocked on the store (a watch failed with 1101, a closed handle) and run its
    code on into an exception it cannot handle to any end, printed as a traceback as the
    program ends. So it waits here, quietly, until the interpreter ends it. The main thread
    (an atexit handler's call) and non-daemon threads still get the error."""
    if EXITING.is_set() and threading.current_thread().daemon:
        threading.Event().wait()


class EventWatch:
    """A :class:`Watch` completed by its engine from any thread."""

    __slots__ = ("_callbacks", "_error", "_event", "_on_cancel", "key", "seen")

    def __init__(self, key: bytes, seen: bytes | None) -> None:
        self.key = key
        self.seen = seen
        self._event = threading.Event()
        self._error: EngineError | None = None
        self._on_cancel: Callable[[EventWatch], None] | None = None
        self._callbacks: list[Callable[[], None]] | None = None

    def fire(self) -> None:
        self._event.set()
        self._done()

    def fail(self, code: int, message: str | None = None) -> None:
        if not self._event.is_set():
            self._error = EngineError(code, message)
            self._event.set()
            self._done()

    def on_ready(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the watch fires or fails (now, if it has), from whichever
        thread completes it: an asyncio waiter needs no thread of its own (fdbqueue.aio)."""
        with _CALLBACKS:
            if not self._event.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()

    def _done(self) -> None:
        with _CALLBACKS:
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback()

    def wait(self, timeout: float | None = None) -> bool:
        if not self._event.wait(timeout):
            return False
        if self._error is not None:
            park_at_exit()  # failed by the close at exit: as Python leaves a daemon thread
            raise self._error
        return True

    def is_ready(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        self.fail(1101, "watch cancelled")
        if self._on_cancel is not None:
            self._on_cancel(self)


class StampFuture:
    __slots__ = ("_error", "_version")

    def __init__(self) -> None:
        self._version: int | None = None  # the commit version: the stamp is made when asked
        self._error: int | None = None

    def wait(self) -> bytes:
        if self._version is not None:
            return make_versionstamp(self._version)
        raise EngineError(self._error or 2021, "the versionstamp is known only after a commit with writes")
