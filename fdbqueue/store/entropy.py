"""Random bytes from the operating system, fetched a page at a time, and the ids made of them.

Message keys, ids and receipts each take 8 to 16 random bytes; ``os.urandom`` makes one
``getrandom`` system call per request, which costs more than the rest of building a message.
The bytes are the kernel's all the same (a buffer of 4 KiB, refilled when spent), handed out
under a lock so that two threads never share any, and dropped in a forked child so that it
never repeats what its parent hands out.
"""

from __future__ import annotations

import os
import threading
import time

__all__ = ["new_id", "new_rand", "random_bytes"]

_PAGE = 4096
_lock = threading.Lock()
_buf = b""
_at = 0


def random_bytes(n: int) -> bytes:
    """``n`` bytes from the kernel's random source (as ``os.urandom(n)``)."""
    global _buf, _at
    if n > 256:
        return os.urandom(n)
    with _lock:
        end = _at + n
        if end > len(_buf):
            _buf, _at, end = os.urandom(_PAGE), 0, n
        out = _buf[_at:end]
        _at = end
    return out


def _forget() -> None:
    """In a forked child: the parent's unspent bytes are the parent's (it may hand them out)."""
    global _buf, _at, _lock
    _lock = threading.Lock()  # held by another thread of the parent at the fork, perhaps
    _buf, _at = b"", 0


os.register_at_fork(after_in_child=_forget)


def new_rand() -> bytes:
    return random_bytes(8)


def new_id() -> str:
    """A message id: 48 bits of milliseconds, then 80 random bits, as 32 hex digits.

    Time first (as in UUIDv7), so that the id index grows at its end instead of at random
    places: an enqueue then dirties one index page, not a new random one each time. The
    wall clock serves locality only: uniqueness is the random bits', and nothing orders or
    ages messages by their ids, so a client's wrong clock costs nothing here.
    """
    return f"{time.time_ns() // 1_000_000:012x}{random_bytes(10).hex()}"
