"""The embedded engine's free-space reserve: the last space on the disk is the consumers'.

Consumers write too: a dequeue, lease or ack moves and deletes records, and SQLite logs every
change in the WAL before it frees a page; the WAL restarts from its beginning only after a
checkpoint has copied it into the database file (https://www.sqlite.org/wal.html, sections
"Checkpointing" and "Avoiding Excessively Large WAL Files"). On a disk that producers have
filled until SQLite returned SQLITE_FULL, consumers fail the same way, and the queue that
would free the space cannot be drained. So producers are turned away earlier: an enqueue is
refused, before it writes, while the file system holding the store has less free space
(``statvfs``: ``f_bavail * f_frsize``, what an unprivileged writer may use) than the reserve
(``reserve=`` in the URL). Consumers and settling are never refused; they spend the reserve,
and give it back as the records they delete are checkpointed and reused.

The free space is read at most once a second while it is far above the reserve, and at
every enqueue while it is near or below (``statvfs`` costs ~2 us; an enqueue tens).
"""

from __future__ import annotations

import math
import os
import re
import time

from fdbqueue.errors import InvalidURLError, StoreFullError

_monotonic = time.monotonic

MB = 1024 * 1024

# The default reserve. What a drain needs: the WAL's working size (at sync=full it is
# zero-filled to walsync.WAL_FRAMES frames of 4 KB, about 4.5 MB; at sync=normal it grows to
# about that before SQLite's automatic checkpoint runs, at 1000 pages of 4 KB:
# https://www.sqlite.org/pragma.html#pragma_wal_autocheckpoint), plus room in the database
# file for the pages a checkpoint copies there (at most the WAL's 1000 pages, ~4 MB), plus
# the -shm index growing by 32 KB per 4096 frames. About 8.5 MB; twice that for margin
# (a checkpoint held back by a reader lets the WAL grow past 1000 pages).
DEFAULT_RESERVE = 16 * MB
DEFAULT_TEXT = "16M"  # as the URL spells it

# Far above the reserve, the free space is read once per CHECK_INTERVAL seconds: the store's
# commits are serialised (one writer at a time), and FAR bytes a second is well past what
# they write (docs/performance.md: thousands of messages a second). Within FAR of the
# reserve it is read at every enqueue, so producers stop within one commit of it.
CHECK_INTERVAL = 1.0
FAR = 64 * MB

_UNITS = {"": 1, "K": 1024, "M": MB, "G": 1024 * MB, "T": 1024 * 1024 * MB}
_RESERVE = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([KMGT]?)\s*", re.IGNORECASE)


def parse_reserve(text: str, url: str) -> int:
    """``reserve=`` as bytes: a number with an optional unit K, M, G or T (powers of 1024)."""
    m = _RESERVE.fullmatch(text)
    value = float(m.group(1)) * _UNITS[m.group(2).upper()] if m else math.nan
    if not math.isfinite(value) or value >= 2**63:
        raise InvalidURLError(
            f"reserve={text!r} in {url!r}: use bytes with an optional unit K, M, G or T "
            "(e.g. reserve=64M), or reserve=0 to turn the free-space reserve off"
        )
    return int(value)


def mb(n: int) -> str:
    """``n`` bytes in MB, for messages."""
    return f"{n / MB:.1f}".removesuffix(".0")


class DiskRoom:
    """Refuses producers while the file system holding ``folder`` has less than ``reserve`` free."""

    def __init__(self, folder: str, path: str, reserve: int) -> None:
        self.folder = folder
        self.path = path  # the store as the user named it, for messages
        self.reserve = reserve
        # When to read the free space again (time.monotonic): never without a reserve.
        self._next = 0.0 if reserve > 0 else math.inf

    def free(self) -> int | None:
        """Free space for an unprivileged writer, or None if the file system will not say."""
        try:
            st = os.statvfs(self.folder)
        except OSError:
            return None  # a removed folder: the commit's file check says so, clearly
        return st.f_bavail * st.f_frsize

    def check(self) -> None:
        """Raise StoreFullError if a producer must be turned away now."""
        if _monotonic() < self._next:  # (every enqueue asks: one comparison while far above)
            return
        free = self.free()
        if free is None:
            return
        if free - self.reserve >= FAR:
            self._next = time.monotonic() + CHECK_INTERVAL  # a race only reads it twice
            return
        if free < self.reserve:
            raise StoreFullError(
                f"{self.path}: the device holding {self.folder} has {mb(free)} MB free, below "
                f"the reserve of {mb(self.reserve)} MB kept for consumers (so that they can "
                "still drain the queue): nothing was enqueued. Free some space there, or "
                "lower reserve= in the URL (reserve=0 turns the reserve off)"
            )
