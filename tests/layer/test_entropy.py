"""fdbqueue.store.entropy: the random bytes of message keys, ids and receipts never repeat."""

from __future__ import annotations

import os
import sys
import threading

from fdbqueue.store import entropy
from fdbqueue.store.entropy import random_bytes


def test_sizes_and_no_repeats_across_refills() -> None:
    got = [random_bytes(8) for _ in range(2000)]  # several 4 KiB pages
    assert {len(b) for b in got} == {8}
    assert len(set(got)) == len(got)
    assert len(random_bytes(300)) == 300 and len(random_bytes(0)) == 0


def test_threads_never_share_bytes() -> None:
    out: list[list[bytes]] = [[] for _ in range(8)]
    start = threading.Barrier(len(out))

    def take(mine: list[bytes]) -> None:
        start.wait()
        mine.extend(random_bytes(8) for _ in range(3000))

    threads = [threading.Thread(target=take, args=(m,)) for m in out]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: inside random_bytes too
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    every = [b for m in out for b in m]
    assert len(set(every)) == len(every) == 24_000


def test_a_forked_child_does_not_repeat_what_its_parent_hands_out() -> None:
    random_bytes(8)  # a page in the buffer, mostly unspent
    assert entropy._buf
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next 64 bytes
        try:
            os.write(w, b"".join(random_bytes(8) for _ in range(8)))
        finally:
            os._exit(0)
    os.close(w)
    child = b""
    while chunk := os.read(r, 64):
        child += chunk
    os.close(r)
    os.waitpid(pid, 0)
    parent = b"".join(random_bytes(8) for _ in range(8))
    assert len(child) == 64 and child != parent


def test_new_rand_never_repeats_across_refills_nor_what_random_bytes_hands_out() -> None:
    """new_rand's pieces come from a page of their own (a deque, no lock on the common draw)."""
    got = [entropy.new_rand() for _ in range(3000)]  # several pages of 512 pieces
    other = [random_bytes(8) for _ in range(3000)]
    assert {len(b) for b in got} == {8}
    assert len(set(got) | set(other)) == 6000


def test_new_rand_threads_never_share_bytes() -> None:
    out: list[list[bytes]] = [[] for _ in range(8)]
    start = threading.Barrier(len(out))

    def take(mine: list[bytes]) -> None:
        start.wait()
        mine.extend(entropy.new_rand() for _ in range(3000))

    threads = [threading.Thread(target=take, args=(m,)) for m in out]
    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads often: inside a refill too
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    every = [b for m in out for b in m]
    assert len(set(every)) == len(every) == 24_000


def test_new_rand_in_a_forked_child_does_not_repeat_what_its_parent_hands_out() -> None:
    entropy.new_rand()  # a page cut into pieces, mostly unspent
    if not entropy._eights:  # that draw took the last piece of an older page: the next refills
        entropy.new_rand()
    assert entropy._eights
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report its next 64 bytes
        try:
            os.write(w, b"".join(entropy.new_rand() for _ in range(8)))
        finally:
            os._exit(0)
    os.close(w)
    child = b""
    while chunk := os.read(r, 64):
        child += chunk
    os.close(r)
    os.waitpid(pid, 0)
    parent = b"".join(entropy.new_rand() for _ in range(8))
    assert len(child) == 64 and child != parent
