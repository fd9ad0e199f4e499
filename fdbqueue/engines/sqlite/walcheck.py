"""Detect acknowledged commits that SQLite's WAL recovery dropped (a damaged or truncated WAL).

SQLite's recovery, run by the first connection that opens a WAL database no process has open
(after every process was killed, say), keeps the frames up to the first one whose salt or
cumulative checksum is wrong and ignores every later frame without an error
(https://www.sqlite.org/fileformat.html#the_write_ahead_log, ``walIndexRecover`` in
src/wal.c). One flipped bit in the middle of the WAL, or a WAL cut short, so silently drops
every commit written after it, acknowledged or not.

So each commit with writes records, under the store lock, what the WAL index header in
``<db>-shm`` says once it is done (https://www.sqlite.org/walformat.html, ``WalIndexHdr``,
native byte order): the number of valid frames ``mxFrame``, the WAL's salts and how many
frames a checkpoint had copied into the database file (``nBackfill``), tagged with the
version clock's tag (this boot + this store). The record lives in the lock file's shared
page (:data:`.page.WAL_RECORD`).

At open, the first process to open the store (no other holds the "presence" byte of
``<db>-lock``, an OFD read lock each process keeps while it has the store open; Linux only:
elsewhere nothing is checked) keeps a hard link of the WAL, lets SQLite recover on a
connection of its own, under the store lock, and reads the recovered header. When the
record names this boot and this store and the WAL kept fewer frames than the record says
were committed (same salts), or the WAL lost its header while the record says some frames
were not yet copied into the database file, the open is refused: the WAL is kept as
``<db>-wal.damaged`` and every read-write open is refused while that file exists (removing
it accepts the loss; the store then opens with the commits before the damage). The
recovering connection is closed after the refusal: if it is the last, SQLite copies the
recovered commits into the database file and removes the WAL, as any open would; the
frames after the damage stay in ``<db>-wal.damaged``, a hard link SQLite never rewrites.

Not detected: damage after a power loss or a reboot (another boot id: the page may be
stale, or ahead of what reached the disk, so nothing is compared); a WAL removed while no
process had the store open (nothing left to compare); damage found by a process that is
not the first to open the store (SQLite recovers only once). A false alarm: a WAL emptied by
``PRAGMA wal_checkpoint(TRUNCATE)`` run by another program (the ``sqlite3`` shell, say) after
the last commit, then found empty after a crash, is taken for a loss. Read-only handles
(``mode=ro``) neither record nor check, and are not refused: they read what SQLite recovered.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sqlite3
import struct
import threading
from collections.abc import Iterator
from urllib.parse import quote

from fdbqueue.engines.sqlite import shared as _shared
from fdbqueue.engines.sqlite import storelock as _storelock
from fdbqueue.engines.sqlite.page import PRESENCE_BYTE, WAL_RECORD, SharedPage
from fdbqueue.errors import StoreError

# WalIndexHdr (https://www.sqlite.org/walformat.html): mxFrame at 16, aSalt at 32; the
# checkpoint info follows both copies of the header, its nBackfill at 96.
# The WAL index header's fields a commit records (WritableStore.after_writes, under the store
# lock, reads them from ``-shm`` through Held.shm): mxFrame, aSalt, nBackfill.
HEADER = struct.Struct("=16xI12x8s56xI")
HEADER_BYTES = HEADER.size
#: Where HEADER's three fields lie in those bytes, and their sizes (mxFrame, aSalt, nBackfill).
HEADER_FIELDS = ((16, 4), (32, 8), (96, 4))
_probe = HEADER.unpack(bytes(range(HEADER_BYTES)))
assert [struct.pack("=I", _probe[0]), _probe[1], struct.pack("=I", _probe[2])] == [
    bytes(range(at, at + n)) for at, n in HEADER_FIELDS
]
_WAL_HEADER = 32  # bytes before the first frame (https://www.sqlite.org/fileformat.html)
DAMAGED = "-wal.damaged"
AT_OPEN = "-wal.at-open"


def damaged_message(path: str, damaged: str, found: int, recorded: int) -> str:
    return (
        f"{path}: its WAL was damaged or truncated: SQLite's recovery kept {found} of the "
        f"{recorded} WAL frames that commits were acknowledged for, so the commits written after "
        f"the damage would be lost. The WAL as it was found is kept as {damaged}, and the store "
        f"is refused while that file exists: restore the store from a backup, or remove {damaged} "
        "to accept the loss and open the store with the commits before the damage"
    )


def refused_message(path: str, damaged: str) -> str:
    return (
        f"{path}: refused while {damaged} exists: a damaged or truncated WAL was found there at an "
        f"earlier open, and commits that were acknowledged are missing from the store. Restore the "
        f"store from a backup, or remove {damaged} to accept the loss and open the store with the "
        "commits before the damage"
    )


class Held:
    """This process's descriptors for one store: ``-shm`` (read at each commit) and the
    presence lock on ``-lock``; shared by every handle of the process on the store and
    closed only after the last one closed its connections (closing any descriptor of a
    file drops all of the process's POSIX locks on it, SQLite's included:
    https://www.sqlite.org/howtocorrupt.html section 2.2)."""

    def __init__(self, key: tuple[int, int], presence: int) -> None:
        self.key = key
        self.presence = presence
        self.shm: int | None = None
        self.spare: list[int] = []  # descriptors of threads that opened the store at once
        self.refs = 0

    def _open_shm(self, real: str) -> None:
        if self.shm is None:
            with contextlib.suppress(OSError):
                self.shm = os.open(real + "-shm", os.O_RDONLY | os.O_CLOEXEC)


def record_reader(tag: bytes) -> tuple[bytearray, list[memoryview]]:
    """A WAL record (:data:`.page.WAL_RECORD`'s bytes) with ``tag`` in it, and the buffers that
    ``os.preadv`` of ``-shm``'s first :data:`HEADER_BYTES` fills so that the header's fields
    land in the record (the rest in scratch space): what a commit records in one system call
    and one copy into the page (``WritableStore.after_writes``), no object made."""
    record = bytearray(WAL_RECORD.size)
    record[: len(tag)] = tag
    view, scratch = memoryview(record), memoryview(bytearray(HEADER_BYTES))
    into = [WAL_RECORD.at(field) - WAL_RECORD.offset for field in ("frames", "salts", "backfilled")]
    buffers: list[memoryview] = []
    read = 0
    for (at, size), to in zip(HEADER_FIELDS, into, strict=True):
        if at > read:
            buffers.append(scratch[read:at])
        buffers.append(view[to : to + size])
        read = at + size
    assert read == HEADER_BYTES
    return record, buffers


def all_copied(page: SharedPage) -> None:
    """After a checkpoint that copied every frame into the database file, under the store
    lock: the record says so, so that a WAL found empty at the next open is no loss."""
    tag, frames, _, salts = page.wal_record()
    page.set_wal_record(tag, frames, frames, salts)


_lock = threading.Lock()
_held: dict[tuple[int, int], Held] = {}
_inherited: list[dict[tuple[int, int], Held]] = []


def _after_fork_in_child() -> None:
    # The parent's descriptors stay open and untouched in the child (closing the one on
    # -shm there would be harmless, the one on -lock would keep the parent's presence).
    global _lock, _held
    _inherited.append(_held)
    _lock = threading.Lock()
    _held = {}


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def opening(
    store: _shared.SharedStore, real: str, path: str, boot: bytes | None, timeout: float
) -> Iterator[Held]:
    """Around the connect of a read-write open: refuse a store whose WAL lost acknowledged
    commits (see the module's docstring), then hold this process's presence.

    On success the caller keeps the :class:`Held` and passes it to :func:`release` after
    closing its connections; on an exception nothing is held.
    """
    damaged = real + DAMAGED
    with _lock:
        held = _held.get(store.ident)
        if held is not None:
            held.refs += 1  # before the connect: no descriptor is closed while it runs
    if held is not None:
        if os.path.lexists(damaged):
            release(held)
            raise StoreError(refused_message(path, damaged))
        try:
            yield held
        except BaseException:
            release(held)
            raise
        return
    checker: sqlite3.Connection | None = None
    shm: int | None = None
    store.acquire(timeout, path)
    try:
        if os.path.lexists(damaged):
            raise StoreError(refused_message(path, damaged))
        presence = os.open(real + "-lock", os.O_RDWR | os.O_CLOEXEC)
        try:
            first = _take_presence(presence)
            if first:
                checker, shm = _check(store.page, real, path, boot)
        except BaseException:
            os.close(presence)
            raise
    finally:
        store.release()
    with _lock:
        held = _held.get(store.ident)  # another thread of this process got there meanwhile
        if held is None:
            held = _held[store.ident] = Held(store.ident, presence)
        else:  # its own presence holds: ours goes at its last close (no POSIX lock on -lock)
            held.spare.append(presence)
        if held.shm is None:
            held.shm = shm
        elif shm is not None:
            held.spare.append(shm)  # closed only after every connection, as the other one
        held.refs += 1
    try:
        yield held
    except BaseException:
        if checker is not None:
            checker.close()  # before our descriptors: closing them would drop its locks
            checker = None
        release(held)
        raise
    else:
        held._open_shm(real)
    finally:
        if checker is not None:
            checker.close()  # not the last connection on success: SQLite does not checkpoint


def release(held: Held) -> None:
    """After the handle closed its connections: the last one of the process closes the descriptors."""
    with _lock:
        held.refs -= 1
        if held.refs > 0:
            return
        if _held.get(held.key) is held:
            del _held[held.key]
    for fd in (held.shm, *held.spare, held.presence):
        if fd is not None:
            os.close(fd)


def _take_presence(fd: int) -> bool:
    """Hold the presence byte (shared); True when no other process held it (Linux only)."""
    if not _storelock.OFD:
        return False
    found = fcntl.fcntl(fd, fcntl.F_OFD_GETLK, _storelock.byte_request(fcntl.F_WRLCK, PRESENCE_BYTE))
    alone = bool(_storelock.FLOCK.unpack(found)[0] == fcntl.F_UNLCK)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, _storelock.byte_request(fcntl.F_RDLCK, PRESENCE_BYTE))
    return alone


def _check(
    page: SharedPage, real: str, path: str, boot: bytes | None
) -> tuple[sqlite3.Connection | None, int | None]:
    """As the first process, under the store lock: recover the WAL and compare with the record.

    Returns the connection that ran the recovery (the caller closes it once its own
    connection is open, so that SQLite does not checkpoint at its close) and the
    descriptor on ``-shm`` the header was read with (kept until :func:`release`), or
    Nones when nothing was compared.
    """
    tag, mx_frame, backfilled, salts = page.wal_record()
    wal = real + "-wal"
    if boot is None or tag[:16] != boot or not os.path.exists(real) or not os.path.exists(wal):
        return None, None  # another boot (a power loss: the page may be stale or ahead), or no WAL
    kept = real + AT_OPEN
    with contextlib.suppress(FileNotFoundError):
        os.unlink(kept)  # left by an open that died half-way
    try:
        # The evidence, should the last close of the connection below checkpoint and delete
        # the WAL (a hard link: SQLite never rewrites the frames it could not recover).
        os.link(wal, kept)
    except OSError:
        kept = ""
    conn = None
    shm = None
    try:
        try:
            conn = sqlite3.connect(f"file:{quote(real)}?mode=rw", uri=True, isolation_level=None)
            # The first read on the first connection runs SQLite's recovery.
            row = conn.execute("SELECT value FROM meta WHERE name = 'store_id'").fetchone()
        except sqlite3.Error:
            return conn, None  # not a store, or damaged otherwise: the open itself says so
        store_id = row[0] if row else None
        if not isinstance(store_id, bytes) or tag != boot + store_id[:16].ljust(16, b"\0"):
            return conn, None  # a record of another store
        try:
            shm = os.open(real + "-shm", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            return conn, None
        found, found_salts = _recovered(shm)
        size = os.path.getsize(wal) if os.path.exists(wal) else 0
        lost = (found_salts == salts and found < mx_frame) or (size < _WAL_HEADER and mx_frame > backfilled)
        if not lost:
            return conn, shm
        damaged = real + DAMAGED
        if kept:
            os.replace(kept, damaged)
            kept = ""
        else:
            with open(damaged, "wb"):  # no link possible: the marker alone refuses later opens
                pass
        # Compared once: after the file is removed, the store opens with what was recovered.
        page.set_wal_record(bytes(32), 0, 0, bytes(8))
        raise StoreError(damaged_message(path, damaged, found, mx_frame))
    except BaseException:
        if conn is not None:
            conn.close()
        if shm is not None:
            os.close(shm)  # after the connection: its locks on -shm are gone with it
        raise
    finally:
        if kept:
            with contextlib.suppress(OSError):
                os.unlink(kept)


def _recovered(shm: int) -> tuple[int, bytes]:
    """mxFrame and salts of the WAL index header as recovery left them."""
    hdr = os.pread(shm, HEADER_BYTES, 0)
    if len(hdr) < HEADER_BYTES:
        return 0, b""
    mx_frame, salts, _ = HEADER.unpack(hdr)
    return int(mx_frame), bytes(salts)
