"""The embedded engine's version clock: database time, shared by a store's processes.

Read versions and commit versions of the store (:class:`VersionClock`), kept in the lock
file's page (:mod:`.page`) with a reservation in the store's ``meta`` table; used by the
engine's transaction (:mod:`.transaction`) and made once per writable store
(:mod:`.database`).
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable

from fdbqueue.engines import versions as _versions
from fdbqueue.engines.sqlite.page import PENDING, STAMP_WORD, ClockState, SharedPage
from fdbqueue.engines.sqlite.store import WritableStore
from fdbqueue.engines.versions import VERSIONS_PER_SECOND, monotonic_us, wall_us

_SET_VERSION = "UPDATE meta SET value = ? WHERE name = 'version'"
_RESERVE_US = 1_000_000  # one meta write per second of versions
# How far a process's clock may run ahead of the stamp's reading plus the wall-clock time
# since, before its monotonic clock is taken for offset: 1 s, plus 0.1 % of that time (NTP
# slews a wall clock by 0.05 % at most: ntpd's 500 ppm).
_AGREE_US = 1_000_000


def _calibrated(page: SharedPage, base: int, mono: int) -> int:
    """This process's base of the version clock, at its first use of the store.

    The page's base, unless the clock it gives (``base + mono``) runs ahead of the stamp's
    reading plus the wall-clock time since by more than :data:`_AGREE_US` (+0.1 %): then this
    process's monotonic clock is ahead of the others' (they stamped the page on theirs),
    and its clock starts from that estimate instead. The lower of the two is taken because
    a deadline read late is a delay, read early a duplicate; a wall clock stepped back
    between the stamp and now makes the estimate low, and a process starting then reads
    the store's time late by at most that step until another process's commit carries
    it forward (the catch-up in ``VersionClock._now``).
    """
    reading, wall = page.stamp()
    if reading <= 0 or wall <= 0:
        return base  # no stamp: a page of an older fdbqueue
    since = max(0, wall_us() - int(wall))
    estimate = int(reading) + since
    if base + mono > estimate + _AGREE_US + since // 1000:
        return estimate - mono
    return base


#: What the version clock read: (last commit version, reservation, the page's base, the clock
#: then, this process's base).
Held = tuple[int, int, int, int, int]


class VersionClock:
    """The version clock of a writable store: database time, shared by its processes.

    A read version is ``max(last commit, clock - 1)``; a commit gets ``max(last + 1, clock,
    read version + 1)``: strictly increasing across processes, and above every read version
    handed out before. The clock, the last version and meta's reservation live in the lock
    file's page (:data:`.page.CLOCK`), with the clock's last reading and the wall clock then
    (:data:`.page.STAMP`): writing the version into meta at every commit would dirty a
    second page and cost a third of the commit rate. So meta holds a reservation, raised in
    the commit's own write transaction when a version passes it: every committed version is
    at most meta's reservation. The page is trusted only when it names this boot and this
    store and no commit died half-way (its pending flag); otherwise the clock restarts from
    the reservation.
    """

    __slots__ = ("_store",)

    def __init__(self, store: WritableStore) -> None:
        self._store = store

    def read_version(self, reserved: Callable[[], int], nested: bool) -> tuple[int, Held | None]:
        """A read version, and what the clock read then for :meth:`next_version` to reuse (None
        when nested or without a trusted page: the commit reads the clock again)."""
        if not nested:
            held = self._trusted_now()
            if held is not None:
                last, now = held[0], held[3]
                version = max(last, now - 1)  # (as below)
                # page.set_stamp's two fields, one word each (page.STAMP_WORD)
                words = self._store.page.words
                words[STAMP_WORD] = version
                words[STAMP_WORD + 1] = int(_versions._wall() * 1e6)
                return version, held
        state = self._now(reserved, nested)
        last, _, _, now, _ = state
        # One below the clock: every later commit (at least the clock) is above it.
        version = max(last, now - 1)
        if nested or self._store.clock_tag is None:
            return version, None
        self._store.page.set_stamp(version, wall_us())
        return version, state

    def _trusted_now(self, state: ClockState | None = None) -> Held | None:
        """:meth:`_now`'s common case without its calls (every read version and commit): the
        page trusted (this boot, this store), no commit died half-way, this process's base
        known and not behind the last commit. None in every other case: :meth:`_now`.
        ``state``: the page's clock as the caller just read it, under the store lock."""
        store = self._store
        tag = store.clock_tag
        if tag is None:
            return None
        found, last, meta, pending, base = store.page.clock() if state is None else state
        own = store.shared.clock_base
        if found != tag or pending == PENDING or own is None:
            return None
        # The monotonic clock read once, as monotonic_us() reads it (inline: its call saved).
        if _versions._frozen_us is None:
            now = own + time.monotonic_ns() // 1000 + _versions._ahead_us
        else:
            now = own + monotonic_us()
        if now + VERSIONS_PER_SECOND < last:
            return None  # behind the last commit: _now catches this process's base up
        return last, meta, base, now, own

    def _now(self, reserved: Callable[[], int], nested: bool) -> Held:
        """(last commit version, reservation, the page's base, the version clock now, this
        process's base: the clock is that plus ``monotonic_us()``).

        From the lock file when it names this boot and this store; its last version and
        reservation only when no commit died half-way (flag pending), else meta's
        reservation stands for both. Without a trusted page (a new boot) the clock restarts
        from the last version, on this process's ``CLOCK_MONOTONIC``, and the page records
        that base for the others.

        Each process reads the clock as ``its base + its CLOCK_MONOTONIC``. Its base is the
        page's, checked at its first use against the page's stamp (the clock's last reading
        and the wall clock then, :func:`_calibrated`), so a process whose monotonic clock is
        offset (a time namespace, libfaketime) reads the store's time, not its own: database
        time never follows one process's clock. A process found behind the last commit
        catches up with it (its own base only).
        """
        store = self._store
        tag = store.clock_tag
        if tag is None:  # not Linux: no boot id to trust a monotonic base by
            last = reserved()
            return last, last, 0, max(last, time.time_ns() // 1000), 0
        page = store.page
        found, last, meta, pending, base = page.clock()
        mono = monotonic_us()
        trusted = found == tag
        if not trusted or pending == PENDING:
            last = meta = reserved()
        shared = store.shared
        own = shared.clock_base
        if not trusted:
            own = base = last - mono
            if not nested:  # under the store lock
                page.set_clock(tag, last, meta, 0, base, wall_us())
        elif own is None:
            own = _calibrated(page, base, mono)
        if own + mono + VERSIONS_PER_SECOND < last:
            own = last - mono
        shared.clock_base = own
        return last, meta, base, own + mono, own

    def next_version(
        self,
        conn: sqlite3.Cursor,
        reserved: Callable[[], int],
        read: int | None,
        held: Held | None,
        begin: Callable[[], object] | None = None,
        state: ClockState | None = None,
    ) -> tuple[int, bool]:
        """(max(last + 1, the version clock, read version + 1), whether it raised meta's
        reservation), in the write transaction open on ``conn``: the reservation is raised
        there when the version passes it, and the page is marked pending until that commit
        is done (``WritableStore.after_writes``); a version that never commits is a gap.

        ``held``: what :meth:`read_version` read in this transaction, under the store lock
        it still holds (the lease pinned: no other process committed or touched the clock
        since), so the page's last version, reservation and base stand; only the monotonic
        clock is read again. The clock is then read once a write transaction, not twice.

        ``begin``: for a transaction with no SQLite transaction open yet, called before the
        reservation is raised, so that the raise and the rows commit together.

        ``state``: the page's clock as the caller read it under the pin (or None: read here).

        When the page was trusted as it stands (:meth:`_trusted_now`: this tag, nothing
        pending, read under the pin, so nobody else writes it until the release) and the
        reservation is not raised, the commit writes only the last version: the tag, the
        reservation, the flag and the base would be written with the bytes they hold."""
        store = self._store
        tag = store.clock_tag
        page = store.page
        trusted = False
        if held is None:
            # _trusted_now inline (every commit asks): the page trusted as it stands (this tag,
            # nothing pending, this process's base known and not behind the last commit).
            found, last, meta, pending, base = page.clock() if state is None else state
            own = store.shared.clock_base
            if found == tag and pending != PENDING and own is not None:
                if _versions._frozen_us is None:  # monotonic_us(), inline
                    now = own + time.monotonic_ns() // 1000 + _versions._ahead_us
                else:
                    now = own + monotonic_us()
                trusted = now + VERSIONS_PER_SECOND >= last
            if not trusted:
                last, meta, base, now, _ = self._now(reserved, False)
        else:
            last, meta, base, _, own = held
            now = own + monotonic_us()
        # max(last + 1, now, read + 1), without the call
        version = last + 1
        if now > version:
            version = now
        if read is not None and read >= version:
            version = read + 1
        bumped = version > meta
        if bumped:
            # Without a trusted lock file (no boot id), meta holds the last version itself.
            meta = version + (_RESERVE_US if tag is not None else 0)
            if begin is not None:
                begin()
            conn.execute(_SET_VERSION, (meta,))
        if tag is not None:
            # page.set_clock's two writes: pending only while a raised reservation is not
            # committed yet; the stamp, the version read at this process's wall clock (wall_us).
            if trusted and not bumped:
                page.set_last(version)  # the rest of the clock holds these bytes already
            else:
                page.pack_clock(tag, version, meta, PENDING if bumped else 0, base)
            words = page.words  # page.set_stamp's two fields, one word each (page.STAMP_WORD)
            words[STAMP_WORD] = version
            words[STAMP_WORD + 1] = int(_versions._wall() * 1e6)
        return version, bumped


# ---------------------------------------------------------------------------------------------
