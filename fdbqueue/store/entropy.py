"""Random bytes from the operating system, fetched a page at a time, and the ids made of them.

Message keys, ids and receipts each take 8 to 16 random bytes; ``os.urandom`` makes one
``getrandom`` system call per request, which costs more than the rest of building a message.
The bytes are the kernel's all the same (a buffer of 4 KiB, refilled when spent), handed out
under a lock so that two threads never share any, and dropped in a forked child so that it
never repeats what its parent hands out.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections import deque

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
    global _buf, _at, _lock, _eights
    _lock = threading.Lock()  # held by another thread of the parent at the fork, perhaps
    _buf, _at = b"", 0
    _eights = deque()


os.register_at_fork(after_in_child=_forget)

# new_rand's own page, cut into 8-byte pieces: handed out by a deque's popleft, which is
# atomic ("Deques support thread-safe, memory efficient appends and pops from either side",
# the collections documentation), so that the common draw takes no lock and no slice of its
# own. Refilled under the lock from a page of its own: never bytes random_bytes hands out.
_eights: deque[bytes] = deque()
_PIECES = re.compile(b"(?s).{8}").findall  # a page in 8-byte pieces, cut in C


def new_rand() -> bytes:
    """8 random bytes (as ``random_bytes(8)``): the random part of a message's key."""
    try:
        return _eights.popleft()
    except IndexError:
        return _refilled()


def _refilled() -> bytes:
    while True:
        with _lock:
            if not _eights:
                _eights.extend(_PIECES(os.urandom(_PAGE)))
        try:  # (another thread may take the whole page between: then again)
            return _eights.popleft()
        except IndexError:  # pragma: no cover
            continue


def new_id() -> str:
    """A message id: 48 bits of milliseconds, then 80 random bits, as 32 hex digits.

    Time first (as in UUIDv7), so that the id index grows at its end instead of at random
    places: an enqueue then dirties one index page, not a new random one each time. The
    wall clock serves locality only: uniqueness is the random bits', and nothing orders or
    ages messages by their ids, so a client's wrong clock costs nothing here.
    """
    return f"{time.time_ns() // 1_000_000:012x}{random_bytes(10).hex()}"
