"""Cross-process wake-ups for the embedded engine's watches.

Every process that watches keys of a store binds one Unix datagram socket in the store's
notify directory and runs one daemon thread that waits on it. A process that commits
writes sends, after releasing the store lock, one datagram to every socket in that
directory: the 8-byte hashes of the keys it wrote, or an "all" marker (clear_range, or
more keys than fit in about 4 KB). The receiving thread re-reads only the watched keys
whose hash arrived and fires the watches whose value now differs from what their
transaction saw. Watches of the committing process itself are checked directly.

A process that binds or closes its socket writes a fresh random token into the lock file's
shared page (:data:`.page.TOKEN`, mapped by every process). Committers cache the directory listing
under that token, so a commit with no new watcher costs one memory read, no system call.
Sockets that refuse a datagram belong to dead processes and are removed by whoever meets
them. The folder exists while some process watches: each closing hub removes it once empty.

Files removed under running processes (``rm -rf X.db-notify``, ``rm X.db-lock``): a socket
whose file is gone can no longer be found by committers, and a lock file replaced by a new
one splits the processes in two. So each receiving thread, when idle for
:data:`CHECK_EVERY` seconds, checks that its socket file and the lock file are still the
ones it knows (two ``stat`` calls): a missing socket is bound again (and every watched key
re-read, since a wake-up may have been lost meanwhile); a removed or replaced lock file
wakes every watch, whose waiter then meets the StoreError its next commit raises.

A receiver's queue is short (``net.unix.max_dgram_qlen``, often 10). A sender that finds it
full creates ``<socket>.overflow`` and sends one more "all" marker; the receiver checks for
that file after draining each batch, so a full queue never loses a wake-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import select
import socket
import tempfile
import threading
from collections.abc import Callable, Collection

from fdbqueue.engines.local.watches import EventWatch
from fdbqueue.engines.sqlite.page import TOKEN_WORD, SharedPage

Reader = Callable[[list[bytes]], dict[bytes, bytes | None]]

_ALL = b"A"
_KEYS = b"K"
_STOP = b"S"
_MAX_HASHES = 500  # 4,000 bytes of hashes: one datagram, well under any socket limit
_SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes on Linux, 104 on macOS
CHECK_EVERY = 1.0  # seconds a receiver waits before checking that its files are still there


def key_hash(key: bytes) -> bytes:
    return hashlib.blake2b(key, digest_size=8).digest()


def notify_dir_for(real_path: str) -> str:
    """``<db>-notify``, or a directory in the temp dir when socket paths there would be too long."""
    directory = real_path + "-notify"
    if len(directory) + 32 > _SOCKET_PATH_MAX:  # "/<pid>-<12 hex>.sock" is at most 32 bytes
        digest = hashlib.blake2b(real_path.encode(), digest_size=10).hexdigest()
        directory = os.path.join(tempfile.gettempdir(), f"fdbqueue-{digest}-notify")
    return directory


class WatchHub:
    """The watches of one process on one store, and the sockets that wake them."""

    def __init__(
        self,
        directory: str,
        read: Reader,
        page: SharedPage,
        lock: tuple[str, tuple[int, int]] | None = None,
    ) -> None:
        self._dir = directory
        self._lock_file = lock  # the lock file's path and (device, inode), checked when idle
        self._ident: tuple[int, int] | None = None  # our socket file's (device, inode)
        self._read = read
        self._page = page
        self._words = page.words
        self._lock = threading.Lock()
        self._watches: dict[bytes, set[EventWatch]] = {}
        self._by_hash: dict[bytes, set[bytes]] = {}
        self._sock: socket.socket | None = None
        self._path = ""
        self._thread: threading.Thread | None = None
        self._closing = False
        self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._out.setblocking(False)  # a full receiver must never stall a committer
        # The token (its 8 bytes as the page's word: page.TOKEN_WORD; None: never listed) and
        # the sockets of other processes.
        self._cache: tuple[int | None, tuple[str, ...]] = (None, ())

    # -- watching ------------------------------------------------------------------------------

    def add(self, watches: list[EventWatch]) -> None:
        """Register committed watches, then fire those whose key already changed."""
        self._listen()
        with self._lock:
            for w in watches:
                w._on_cancel = self.remove
                self._watches.setdefault(w.key, set()).add(w)
                self._by_hash.setdefault(key_hash(w.key), set()).add(w.key)
        # Registered first, read second: a commit lands either before this read (seen
        # here) or after the registration (its notification finds the watch).
        self.check([w.key for w in watches])

    def remove(self, watch: EventWatch) -> None:
        with self._lock:
            self._drop(watch)

    def _drop(self, watch: EventWatch) -> None:
        group = self._watches.get(watch.key)
        if group is None or watch not in group:
            return
        group.discard(watch)
        if not group:
            del self._watches[watch.key]
            h = key_hash(watch.key)
            keys = self._by_hash.get(h)
            if keys is not None:
                keys.discard(watch.key)
                if not keys:
                    del self._by_hash[h]

    def check(self, keys: Collection[bytes] | None) -> None:
        """Re-read ``keys`` (None: every watched key) and fire the watches they no longer match."""
        with self._lock:
            wanted = list(self._watches) if keys is None else [k for k in set(keys) if k in self._watches]
        if not wanted:
            return
        try:
            values: dict[bytes, bytes | None] | None = self._read(wanted)
        except Exception:
            # A watch is a hint: waking its waiter, who re-reads and meets the real
            # error in a transaction, beats leaving it asleep.
            values = None
        with self._lock:
            for k in wanted:
                for w in list(self._watches.get(k, ())):
                    if values is None or values.get(k) != w.seen:
                        w.fire()
                        self._drop(w)

    # -- receiving -----------------------------------------------------------------------------

    def _bind(self) -> tuple[socket.socket, str, tuple[int, int]]:
        """A new socket bound in the notify folder (made if missing)."""
        path = os.path.join(self._dir, f"{os.getpid()}-{secrets.token_hex(6)}.sock")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        try:
            for attempt in range(3):
                # Never makedirs: a store's folder removed under it is not made again.
                with contextlib.suppress(FileExistsError):
                    os.mkdir(self._dir)
                try:
                    sock.bind(path)
                    break
                except FileNotFoundError:
                    # The last watcher of another process removed the empty folder
                    # between our makedirs and bind (see close): make it again.
                    if attempt == 2:
                        raise
            st = os.stat(path)
        except OSError:
            sock.close()
            raise
        return sock, path, (st.st_dev, st.st_ino)

    def _listen(self) -> None:
        with self._lock:
            if self._sock is not None or self._closing:
                return
            sock, path, ident = self._bind()
            self._sock, self._path, self._ident = sock, path, ident
            # After the bind: a committer that reads the new token lists the new socket.
            self._page.set_token(secrets.token_bytes(8))
            self._thread = threading.Thread(
                target=self._run, args=(sock,), name="fdbqueue-watch", daemon=True
            )
            self._thread.start()

    def _files_gone(self, sock: socket.socket) -> socket.socket | None:
        """When idle: check our socket file and the lock file (see the module's docstring).

        Returns the socket to receive on (a new one if ours was removed), None once closing.
        """
        if self._lock_file is not None:
            name, ident = self._lock_file
            try:
                st = os.stat(name)
                moved = (st.st_dev, st.st_ino) != ident
            except OSError:
                moved = True
            if moved:
                self._fire_all()  # the waiters' next commit says what happened
        try:
            st = os.stat(self._path)
            if (st.st_dev, st.st_ino) == self._ident:
                return sock
        except OSError:
            pass
        try:
            new, path, ident = self._bind()
        except OSError:
            return sock  # e.g. a full or read-only folder now: try again at the next check
        with self._lock:
            if self._closing:
                new.close()
                self._forget(path)
                return None
            old_path = self._path
            self._sock, self._path, self._ident = new, path, ident
        self._page.set_token(secrets.token_bytes(8))  # committers list the folder again
        sock.close()
        with contextlib.suppress(OSError):
            os.unlink(old_path + ".overflow")
        self.check(None)  # a commit made while nobody could find us woke nobody
        return new

    def _run(self, sock: socket.socket) -> None:
        poll = select.poll()  # not select(): descriptors above 1023 are common in servers
        poll.register(sock, select.POLLIN)
        while True:
            try:
                ready = poll.poll(CHECK_EVERY * 1000)
            except OSError:
                return
            if self._closing:
                return
            if not ready:
                found = self._files_gone(sock)
                if found is None:
                    return
                if found is not sock:
                    poll = select.poll()
                    poll.register(found, select.POLLIN)
                    sock = found
                continue
            overflow = self._path + ".overflow"
            try:
                batch = [sock.recv(65536)]
                while True:
                    try:
                        batch.append(sock.recv(65536, socket.MSG_DONTWAIT))
                    except BlockingIOError:
                        break
            except OSError:
                return  # the socket was closed
            if self._closing:
                return
            everything = any(m[:1] != _KEYS for m in batch)
            try:
                os.unlink(overflow)
                everything = True
            except FileNotFoundError:
                pass
            except OSError:
                everything = True
            try:
                if everything:
                    self.check(None)
                else:
                    hashes = {m[i : i + 8] for m in batch for i in range(1, len(m), 8)}
                    with self._lock:
                        keys = [k for h in hashes for k in self._by_hash.get(h, ())]
                    if keys:
                        self.check(keys)
            except Exception:
                # This thread must survive anything: if it died, every later watch would hang.
                self._fire_all()

    def _fire_all(self) -> None:
        with self._lock:
            for group in list(self._watches.values()):
                for w in list(group):
                    w.fire()
                    self._drop(w)

    # -- sending -------------------------------------------------------------------------------

    def publish(self, keys: Collection[bytes] | None) -> None:
        """After a commit: wake the watches of ``keys`` (None: any key) in every process.

        Never raises: the commit it reports has already happened.
        """
        if self._watches:
            self.check(keys)
        cached, targets = self._cache
        if self._words[TOKEN_WORD] != cached:  # _targets' own test, inline: every commit asks
            targets = self._targets()
        if not targets:
            return
        if keys is None:
            payload = _ALL
        else:
            unique = set(keys)
            payload = _ALL if len(unique) > _MAX_HASHES else _KEYS + b"".join(map(key_hash, unique))
        for path in targets:
            try:
                self._out.sendto(payload, path)
            except BlockingIOError:
                self._overflow(path)
            except (ConnectionRefusedError, FileNotFoundError):
                self._forget(path)
            except OSError:
                pass  # e.g. another user's socket we may not write to: it cannot be woken by us

    def _targets(self) -> tuple[str, ...]:
        token = self._page.words[TOKEN_WORD]
        cached, listing = self._cache
        if token == cached:
            return listing
        # Token first, listing second: a socket bound after the listing changes the token again.
        try:
            names = os.listdir(self._dir)
        except OSError:
            names = []  # no directory: nobody watches this store
        own = self._path
        paths = (os.path.join(self._dir, n) for n in names if n.endswith(".sock"))
        listing = tuple(p for p in paths if p != own)
        self._cache = (token, listing)  # one tuple, swapped whole by concurrent committers
        return listing

    def _overflow(self, path: str) -> None:
        try:
            os.close(os.open(path + ".overflow", os.O_CREAT | os.O_WRONLY, 0o666))
        except OSError:
            return
        # Still full: the receiver drains it, then finds the overflow file.
        with contextlib.suppress(OSError):
            self._out.sendto(_ALL, path)

    def _forget(self, path: str) -> None:
        token, listing = self._cache
        if path in listing:
            self._cache = (token, tuple(p for p in listing if p != path))
        for stale in (path, path + ".overflow"):
            with contextlib.suppress(OSError):  # another process removed it first
                os.unlink(stale)

    # -- life cycle ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop the thread, remove the socket, fail the watches still waiting (1101)."""
        with self._lock:
            self._closing = True
            sock, path, thread = self._sock, self._path, self._thread
            self._sock = None
            waiting = [w for group in self._watches.values() for w in group]
            self._watches.clear()
            self._by_hash.clear()
        for w in waiting:
            w.fail(1101, "the database was closed")
        if sock is not None and thread is not None:
            with contextlib.suppress(OSError):  # the thread then stops when its socket closes
                self._out.sendto(_STOP, path)
            thread.join(2.0)
            sock.close()
            self._forget(path)
            self._page.set_token(secrets.token_bytes(8))
        # The last watcher leaves no folder behind (so ``rm -f X.db*`` works); rmdir fails
        # while another process's socket is still in it, and a process binding at the same
        # moment makes the folder again (see _listen).
        with contextlib.suppress(OSError):
            os.rmdir(self._dir)
        self._out.close()

    def unlink_socket(self) -> None:
        """At interpreter exit: leave no socket file behind (the thread dies with the process)."""
        if self._sock is not None:
            self._forget(self._path)
