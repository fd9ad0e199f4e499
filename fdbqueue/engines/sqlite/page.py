"""The lock file ``<db>-lock``, declared once: its first page, as typed regions, and its lock bytes.

Every process of a store maps the lock file's first :data:`PAGE` bytes shared (allocated on
disk first: :func:`allocate_page`) and meets the others there, through the page cache, with
no system call: the version clock and its last reading with the wall clock (the embedded
engine's database time), the store lease's generation and two slots (:mod:`.storelock`), the
sync mark (the last version committed and the last on disk, :mod:`.walsync`), the WAL record
(what the WAL held after the last commit, :mod:`.walcheck`) and the watchers' token
(:mod:`.notify`). Each region is a :class:`Region` below: its offset, size and ``struct``
layout; :class:`SharedPage` reads and writes them, and nothing else knows an offset.

Past the page, the file's bytes are never written, only locked (open-file-description byte
locks, Linux: fcntl(2)): :data:`PRESENCE_BYTE`, :data:`MUTEX_BYTE` and the lease's bytes from
:data:`LEASE_BYTES` on.

Each region is written by one step of the engine, under the store lock unless its module says
otherwise; a page left by an older fdbqueue reads as zeros where it wrote nothing. The layout
is part of the on-disk format: a region never moves.
"""

from __future__ import annotations

import errno
import mmap
import operator
import os
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any, cast

PAGE = 4096


@dataclass(frozen=True)
class Region:
    """A part of the page: ``fields`` (name, ``struct`` code) laid out from ``offset`` in ``order``."""

    name: str
    offset: int
    order: str  # the struct byte order: ">" big-endian, "=" native, both without padding
    fields: tuple[tuple[str, str], ...]

    @property
    def layout(self) -> struct.Struct:
        return struct.Struct(self.order + "".join(code for _, code in self.fields))

    @property
    def size(self) -> int:
        return self.layout.size

    @property
    def end(self) -> int:
        return self.offset + self.size

    def at(self, field: str) -> int:
        """The offset in the page of ``field``."""
        codes: list[str] = []
        for name, code in self.fields:
            if name == field:
                return self.offset + struct.calcsize(self.order + "".join(codes))
            codes.append(code)
        raise KeyError(field)


#: The version clock: boot id + store id (its tag: trusted only by this boot, for this store),
#: the last commit version, the reservation stored in meta, a flag set while a raised
#: reservation is not committed yet, and the clock's base (version = base + CLOCK_MONOTONIC).
CLOCK = Region(
    "version clock",
    0,
    ">",
    (("tag", "32s"), ("last", "Q"), ("reserved", "Q"), ("pending", "B"), ("base", "q")),
)
#: The watchers' token: renewed whenever a socket is bound or closed (committers cache the
#: notify folder's listing under it).
TOKEN = Region("watchers' token", 64, "=", (("token", "8s"),))
#: The sync mark: the version clock's tag, the highest version known to be on disk, and the
#: last version whose COMMIT returned; each version written on its own (8 aligned bytes).
SYNC = Region("sync mark", 128, ">", (("tag", "32s"), ("on_disk", "Q"), ("committed", "Q")))
#: The version clock's last reading handed out under the store lock, and the wall clock (µs)
#: of the process that read it.
STAMP = Region("clock stamp", 176, "=", (("reading", "q"), ("wall", "q")))
#: The lease's current generation; its slots follow, one for even generations, one for odd.
LEASE = Region("lease generation", 192, "=", (("generation", "Q"),))
_SLOT_FIELDS = (("generation", "Q"), ("since", "q"), ("pid", "I"), ("claims", "I"))
#: A lease slot: the generation it was claimed for, the holder's start (0: released), its
#: pid, and a claims counter that every claim moves on.
LEASE_SLOTS = (
    Region("lease slot (even generations)", 200, "=", _SLOT_FIELDS),
    Region("lease slot (odd generations)", 224, "=", _SLOT_FIELDS),
)
#: The WAL record: the version clock's tag, the WAL index's mxFrame and nBackfill, and the
#: WAL's two salts as their file bytes, after the last commit with writes.
WAL_RECORD = Region(
    "WAL record", 256, "=", (("tag", "32s"), ("frames", "I"), ("backfilled", "I"), ("salts", "8s"))
)
#: The lease's waiters: non-zero when a process may be waiting for the store lock on the
#: wake-up FIFO (:class:`.lockwait.WakeChannel`): the next release writes it a byte.
WAITERS = Region("lease waiters", 304, "=", (("wanted", "Q"),))

REGIONS = (CLOCK, TOKEN, SYNC, STAMP, LEASE, *LEASE_SLOTS, WAL_RECORD, WAITERS)
#: The WAL record's bytes in the page, written whole (``WritableStore.after_writes``).
WAL_RECORD_BYTES = slice(WAL_RECORD.offset, WAL_RECORD.end)
#: The version clock's ``pending`` flag: a raised reservation is not committed yet.
PENDING = 1

#: Bytes past the page, locked, never written: a process's presence while it has the store
#: open (a shared lock: :mod:`.walcheck`), the page mutex of the lease, and the lease's bytes
#: (generation ``g`` is byte ``LEASE_BYTES + g``: :mod:`.storelock`).
PRESENCE_BYTE = 2 * PAGE
MUTEX_BYTE = 3 * PAGE
LEASE_BYTES = 4 * PAGE

# The layouts, made once (the accessors below run on every commit).
_CLOCK = CLOCK.layout
_PENDING_AT = CLOCK.at("pending")
_LAST = CLOCK.at("last")
_TOKEN = slice(TOKEN.offset, TOKEN.end)
_SYNC = SYNC.layout
_ON_DISK = SYNC.at("on_disk")
_COMMITTED = SYNC.at("committed")
_U64 = struct.Struct(">Q")
_U64N = WAITERS.layout  # native, as the store lock reads it (words[WANTED_WORD])
_STAMP = STAMP.layout
_GEN = LEASE.layout
_SLOT = LEASE_SLOTS[0].layout
_SLOTS = tuple(r.offset for r in LEASE_SLOTS)
_RECORD = WAL_RECORD.layout

# The native-order fields that every transaction reads or writes (the lease's generation and
# its slots, the clock's stamp), as indexes into the page seen as 8-byte signed words and as
# 4-byte unsigned halves (SharedPage.words, SharedPage.halves): an item of a memoryview is one
# C call, where a region's struct function bound with partial also parses its arguments and
# builds a tuple (a transaction's begin, pin and release make about ten such accesses).
GEN_WORD = LEASE.at("generation") // 8
#: Per slot (by a generation's parity): the word of its generation (its ``since`` follows) ...
SLOT_WORDS = tuple(r.at("generation") // 8 for r in LEASE_SLOTS)
#: ... and the half of its pid (its claims counter follows).
SLOT_HALVES = tuple(r.at("pid") // 4 for r in LEASE_SLOTS)
STAMP_WORD = STAMP.at("reading") // 8  # the wall clock's follows
TOKEN_WORD = TOKEN.offset // 8  # the watchers' token, its 8 bytes as one word
WANTED_WORD = WAITERS.offset // 8  # the lease's waiters' flag
#: The version clock's last commit version (big-endian) and the first 8 bytes of its tag's
#: store id, each as the native word its bytes make: compared, never written, this way (a
#: version's word is a one-to-one image of it; see ``WritableStore.begin``).
LAST_WORD = CLOCK.at("last") // 8
STORE_WORD = (CLOCK.at("tag") + 16) // 8
assert CLOCK.at("last") % 8 == 0 and CLOCK.at("tag") % 8 == 0
assert all(r.order == "=" for r in (LEASE, STAMP, TOKEN, WAITERS, *LEASE_SLOTS)) and TOKEN.size == 8
assert LEASE.offset % 8 == STAMP.offset % 8 == TOKEN.offset % 8 == WAITERS.offset % 8 == 0 and all(
    r.offset % 8 == 0 for r in LEASE_SLOTS
)
assert all(r.at("since") == r.offset + 8 and r.at("claims") == r.at("pid") + 4 for r in LEASE_SLOTS)

ClockState = tuple[bytes, int, int, int, int]  # tag, last, reserved, pending, base
Slot = tuple[int, int, int, int]  # generation, since, pid, claims


class SharedPage:
    """Typed access to the regions of a lock file's first page.

    ``buffer`` is the shared mapping, or the page's bytes as read from the file (reading only).
    A plain read or write of a region is the region's ``struct`` function bound to it here
    (it runs at every commit: no Python frame in between); the rest are methods.
    """

    __slots__ = (
        "buffer",
        "clear_pending",
        "clock",
        "generation",
        "halves",
        "pack_clock",
        "set_committed",
        "set_last",
        "set_on_disk",
        "set_slot",
        "set_stamp",
        "set_sync_mark",
        "set_token",
        "set_wal_record",
        "set_wanted",
        "slot",
        "stamp",
        "sync_mark",
        "token",
        "wal_record",
        "wanted",
        "words",
    )

    def __init__(self, buffer: Any) -> None:
        self.buffer = buffer
        #: The page as native 8-byte signed words and 4-byte unsigned halves (see GEN_WORD):
        #: ``words[GEN_WORD]`` is the lease's generation. Views of the buffer: a mapping is
        #: closed only after :meth:`release`.
        #: (A page read for reading only may be shorter: whole words only.)
        view = memoryview(buffer)
        whole = len(view) // 8 * 8
        self.words: memoryview = view[:whole].cast("q")
        self.halves: memoryview = view[:whole].cast("I")
        view.release()  # the two casts keep the buffer exported until release()
        #: The version clock: (tag, last commit version, reservation, pending flag, base).
        self.clock: Callable[[], ClockState] = partial(_CLOCK.unpack_from, buffer, CLOCK.offset)
        #: The version clock written (``set_clock`` without the stamp): tag, last, reserved,
        #: pending, base.
        self.pack_clock: Callable[[bytes, int, int, int, int], None] = partial(
            _CLOCK.pack_into, buffer, CLOCK.offset
        )
        #: The version clock's last commit version alone (a commit that changes nothing else).
        self.set_last: Callable[[int], None] = partial(_U64.pack_into, buffer, _LAST)
        #: The raised reservation is committed: the page's last version is trusted again.
        self.clear_pending: Callable[[], None] = partial(operator.setitem, buffer, _PENDING_AT, 0)
        #: The clock's stamp: (its last reading handed out, the wall clock in µs then).
        self.stamp: Callable[[], tuple[int, int]] = partial(_STAMP.unpack_from, buffer, STAMP.offset)
        self.set_stamp: Callable[[int, int], None] = partial(_STAMP.pack_into, buffer, STAMP.offset)
        #: The sync mark: (tag, the highest version on disk, the last version committed).
        self.sync_mark: Callable[[], tuple[bytes, int, int]] = partial(_SYNC.unpack_from, buffer, SYNC.offset)
        self.set_sync_mark: Callable[[bytes, int, int], None] = partial(_SYNC.pack_into, buffer, SYNC.offset)
        self.set_on_disk: Callable[[int], None] = partial(_U64.pack_into, buffer, _ON_DISK)
        self.set_committed: Callable[[int], None] = partial(_U64.pack_into, buffer, _COMMITTED)
        #: The WAL record: (tag, frames, frames copied into the database file, salts).
        self.wal_record: Callable[[], tuple[bytes, int, int, bytes]] = partial(
            _RECORD.unpack_from, buffer, WAL_RECORD.offset
        )
        self.set_wal_record: Callable[[bytes, int, int, bytes], None] = partial(
            _RECORD.pack_into, buffer, WAL_RECORD.offset
        )
        #: The lease's generation, as a 1-tuple.
        self.generation: Callable[[], tuple[int]] = partial(_GEN.unpack_from, buffer, LEASE.offset)
        #: The lease's slots, indexed by a generation's parity: ``slot[gen & 1]()`` is
        #: (generation, since, pid, claims); ``set_slot[gen & 1](gen, since, pid, claims)``.
        self.slot: tuple[Callable[[], Slot], ...] = tuple(
            partial(_SLOT.unpack_from, buffer, at) for at in _SLOTS
        )
        self.set_slot: tuple[Callable[[int, int, int, int], None], ...] = tuple(
            partial(_SLOT.pack_into, buffer, at) for at in _SLOTS
        )
        #: The watchers' token (8 bytes).
        self.token = cast("Callable[[], bytes]", partial(operator.getitem, buffer, _TOKEN))
        self.set_token: Callable[[bytes], None] = partial(operator.setitem, buffer, _TOKEN)
        #: The lease's waiters' flag (the store lock reads and writes it as ``words[WANTED_WORD]``).
        self.wanted: Callable[[], tuple[int]] = partial(_U64N.unpack_from, buffer, WAITERS.offset)
        self.set_wanted: Callable[[int], None] = partial(_U64N.pack_into, buffer, WAITERS.offset)

    def release(self) -> None:
        """Release the views of the buffer (:attr:`words`, :attr:`halves`), so that a mapping
        can be closed; the page is not used afterwards."""
        self.words.release()
        self.halves.release()

    # -- the version clock -------------------------------------------------------------------

    def set_clock(self, tag: bytes, last: int, reserved: int, pending: int, base: int, wall: int) -> None:
        """The version clock, and its stamp: ``last`` read at ``wall`` on this process's wall clock."""
        buf = self.buffer
        _CLOCK.pack_into(buf, 0, tag, last, reserved, pending, base)
        _STAMP.pack_into(buf, STAMP.offset, last, wall)

    # -- the lease ---------------------------------------------------------------------------

    def set_generation(self, gen: int) -> None:
        _GEN.pack_into(self.buffer, LEASE.offset, gen)

    def lease(self) -> tuple[int, int, int, int, int]:
        """The generation and its slot: (generation, slot's generation, since, pid, claims)."""
        buf = self.buffer
        gen = _GEN.unpack_from(buf, LEASE.offset)[0]
        return (gen, *_SLOT.unpack_from(buf, _SLOTS[gen & 1]))


def read_page(path: str, size: int = PAGE) -> SharedPage | None:
    """The first ``size`` bytes of the lock file at ``path`` as they are now (for reading only),
    or None when the file cannot be read or is shorter."""
    try:
        with open(path, "rb") as f:
            data = f.read(size)
    except OSError:
        return None
    return SharedPage(data) if len(data) == size else None


def boot_id() -> bytes | None:
    """This boot's id: the page cache's contents from before a crash of the machine are not
    trusted (the page is not fsynced). None where the system has none (not Linux)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return uuid.UUID(f.read().strip()).bytes
    except (OSError, ValueError):
        return None


BOOT_ID = boot_id()


def clock_tag(store_id: bytes) -> bytes | None:
    """The tag of the version clock, the sync mark and the WAL record: this boot, this store."""
    return None if BOOT_ID is None else BOOT_ID + store_id[:16].ljust(16, b"\0")


class Mapping:
    """The lock file's page mapped (:func:`map_page`); :meth:`close` releases the page's views
    of it (:meth:`SharedPage.release`) and unmaps it."""

    __slots__ = ("_mapped", "_page")

    def __init__(self, mapped: mmap.mmap, page: SharedPage) -> None:
        self._mapped = mapped
        self._page = page

    def close(self) -> None:
        self._page.release()
        self._mapped.close()


def map_page(fd: int) -> tuple[Mapping, SharedPage]:
    """Map the lock file's page shared (allocate it first: :func:`allocate_page`)."""
    mapped = mmap.mmap(fd, PAGE)
    page = SharedPage(mapped)
    return Mapping(mapped, page), page


def allocate_page(fd: int) -> None:
    """Give the lock file's first page real blocks on disk before anyone maps it.

    A page of a shared file mapping with no block behind it (a hole, as ``ftruncate``
    leaves) is allocated at the first store into it; on a full file system that store is
    SIGBUS, which kills the process, and every later one that opens the store
    (mmap(2), "SIGBUS"; SQLite writes into each new page of its own ``-shm`` for the same
    reason: ``unixShmMap`` in ``src/os_unix.c``). ``posix_fallocate`` allocates without
    changing a byte (glibc emulates it where the file system lacks ``fallocate``: one
    zero written into each block that reads as zero); where Python lacks it, each block of
    the page that is not allocated yet is written with the bytes it holds. Raises OSError
    (ENOSPC on a full disk).
    """
    if os.fstat(fd).st_size < PAGE:
        os.ftruncate(fd, PAGE)  # extends with zeros; never shortens what others wrote
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is not None:
        try:
            fallocate(fd, 0, PAGE)
            return
        except OSError as exc:
            if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    if os.fstat(fd).st_blocks * 512 >= PAGE:
        return  # already backed by disk blocks
    os.pwrite(fd, os.pread(fd, PAGE, 0).ljust(PAGE, b"\0"), 0)
    os.fsync(fd)
