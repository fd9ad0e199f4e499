"""The lock file's page (engines/sqlite/page.py): its regions, declared once, fit the page and
never overlap, and each lies where the on-disk format has it."""

from __future__ import annotations

import itertools
import mmap
import sys

from fdbqueue.engines.sqlite import page as _page
from fdbqueue.engines.sqlite.page import PAGE, REGIONS, SharedPage


def test_the_regions_fit_the_page_and_do_not_overlap() -> None:
    for region in REGIONS:
        assert 0 <= region.offset < region.end <= PAGE, region
    for a, b in itertools.combinations(REGIONS, 2):
        assert a.end <= b.offset or b.end <= a.offset, (a.name, b.name)
    # The lock bytes lie past the page, apart from each other.
    assert PAGE <= _page.PRESENCE_BYTE < _page.MUTEX_BYTE < _page.LEASE_BYTES


def test_the_regions_are_where_the_format_has_them() -> None:
    """The layout is on disk (a lock file outlives the processes): a region never moves."""
    where = {r.name: (r.offset, r.size) for r in REGIONS}
    assert where == {
        "version clock": (0, 57),
        "watchers' token": (64, 8),
        "sync mark": (128, 48),
        "clock stamp": (176, 16),
        "lease generation": (192, 8),
        "lease slot (even generations)": (200, 24),
        "lease slot (odd generations)": (224, 24),
        "WAL record": (256, 48),
        "lease waiters": (304, 8),
    }
    assert _page.CLOCK.at("pending") == 48
    assert (_page.SYNC.at("on_disk"), _page.SYNC.at("committed")) == (160, 168)


def test_each_accessor_writes_its_own_region_only() -> None:
    buffer = mmap.mmap(-1, PAGE)
    page = SharedPage(buffer)
    written: list[tuple[str, bytes]] = []

    def changed(name: str) -> None:
        region = next(r for r in REGIONS if r.name == name)
        outside = buffer[: region.offset] + buffer[region.end :]
        assert outside == bytes(PAGE - region.size), name
        written.append((name, buffer[region.offset : region.end]))
        buffer[:] = bytes(PAGE)

    page.set_clock(b"t" * 32, 5, 6, 1, -7, 8)
    assert page.clock() == (b"t" * 32, 5, 6, 1, -7) and page.stamp() == (5, 8)
    buffer[_page.STAMP.offset : _page.STAMP.end] = bytes(_page.STAMP.size)
    changed("version clock")
    page.set_stamp(9, 10)
    changed("clock stamp")
    page.set_token(b"12345678")
    assert page.token() == b"12345678"
    changed("watchers' token")
    page.set_sync_mark(b"s" * 32, 1, 2)
    page.set_on_disk(3)
    page.set_committed(4)
    assert page.sync_mark() == (b"s" * 32, 3, 4)
    changed("sync mark")
    page.set_generation(3)
    assert page.generation() == (3,)
    changed("lease generation")
    page.set_slot[1](3, 11, 12, 13)
    assert page.slot[1]() == (3, 11, 12, 13) and page.lease()[1:] == (0, 0, 0, 0)
    changed("lease slot (odd generations)")
    page.set_generation(4)
    page.set_slot[0](4, 11, 12, 13)
    assert page.lease() == (4, 4, 11, 12, 13)
    buffer[_page.LEASE.offset : _page.LEASE.end] = bytes(_page.LEASE.size)
    changed("lease slot (even generations)")
    page.set_wal_record(b"w" * 32, 7, 6, b"saltsalt")
    assert page.wal_record() == (b"w" * 32, 7, 6, b"saltsalt")
    changed("WAL record")
    page.set_wanted(1)
    assert page.wanted() == (1,) and page.words[_page.WANTED_WORD] == 1
    changed("lease waiters")
    assert len(written) == len(REGIONS)


def test_the_native_words_are_the_regions_fields() -> None:
    """The lease, the stamp and the token read and written as the page's native words and
    halves (SharedPage.words, .halves: what the store lock's begin, pin and release use) are
    the very bytes the regions' struct layouts read and write."""
    buffer = mmap.mmap(-1, PAGE)
    page = SharedPage(buffer)
    words, halves = page.words, page.halves
    page.set_generation(7)
    assert words[_page.GEN_WORD] == 7
    for parity in (0, 1):
        at, half = _page.SLOT_WORDS[parity], _page.SLOT_HALVES[parity]
        page.set_slot[parity](5 + parity, 2**62, 4242, 2**32 - 1)
        assert (words[at], words[at + 1], halves[half], halves[half + 1]) == (
            5 + parity,
            2**62,
            4242,
            2**32 - 1,
        )
        words[at], words[at + 1], halves[half], halves[half + 1] = 9, -3, 17, 18
        assert page.slot[parity]() == (9, -3, 17, 18)
    page.set_stamp(-11, 12)
    assert (words[_page.STAMP_WORD], words[_page.STAMP_WORD + 1]) == (-11, 12)
    words[_page.STAMP_WORD] = 13
    assert page.stamp() == (13, 12)
    page.set_token(b"12345678")
    assert words[_page.TOKEN_WORD].to_bytes(8, sys.byteorder, signed=True) == b"12345678"
    page.release()  # the views released, the mapping can close
    buffer.close()
    short = SharedPage(bytes(_page.CLOCK.size))  # a page read for reading only may be shorter
    assert short.clock()[1] == 0 and len(short.words) == _page.CLOCK.size // 8
