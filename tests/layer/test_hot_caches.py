"""Adversarial checks of the layer's caches on the hot path (issue 30): the settings cached
per queue and database while the queue's metadata version is unchanged, and the leased
record cached by receipt for its settlement. Each case is one a wrong validity rule would
answer from the cache with something the store no longer holds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.api.admin import create_queue, destroy_queue, purge_queue, queue_stats, set_state
from fdbqueue.engines.transactional import run_transaction
from fdbqueue.errors import LeaseError, PayloadTooLargeError, QueueStoppedError

OTHER = textwrap.dedent(
    """
    import sys
    import fdbqueue
    from fdbqueue.api.admin import create_queue, destroy_queue
    db = fdbqueue.open(sys.argv[1])
    what = sys.argv[2]
    if what == "destroy":
        destroy_queue(db, "jobs")
    elif what == "recreate small":
        destroy_queue(db, "jobs")
        create_queue(db, "jobs", max_payload=10)
    db.close()
    """
)


def other_process(url: str, what: str) -> None:
    subprocess.run([sys.executable, "-c", OTHER, url, what], check=True, timeout=60)


def test_a_queue_destroyed_and_made_again_elsewhere_is_seen_with_its_new_settings(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    try:
        q = Queue("jobs")
        for _ in range(3):
            q.enqueue(db, b"longer than ten bytes")
        other_process(url, "recreate small")
        with pytest.raises(PayloadTooLargeError):
            q.enqueue(db, b"longer than ten bytes")
        q.enqueue(db, b"short")
        assert queue_stats(db, "jobs").ready == 1
        other_process(url, "destroy")  # gone: the next enqueue makes it with the defaults
        q.enqueue(db, b"longer than ten bytes")
        assert queue_stats(db, "jobs").ready == 1
    finally:
        db.close()


def test_a_change_of_settings_that_did_not_commit_is_never_answered_from_the_cache(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        q = Queue("jobs")
        for _ in range(3):
            q.enqueue(db, b"warm")

        def pause_enqueue_then_fail(tr: fdbqueue.Transaction) -> None:
            set_state(tr, "jobs", enqueue=False)
            with pytest.raises(QueueStoppedError):  # the pause is seen inside its transaction...
                q.enqueue(tr, b"refused")
            raise RuntimeError("abandoned")

        with pytest.raises(RuntimeError):
            run_transaction(db, pause_enqueue_then_fail)
        q.enqueue(db, b"accepted")  # ... and nowhere once it did not commit
        assert queue_stats(db, "jobs").ready == 4
        tr = db.create_transaction()
        create_queue(tr, "jobs", max_payload=10)
        with pytest.raises(PayloadTooLargeError):
            q.enqueue(tr, b"longer than ten bytes")
        tr.cancel()
        q.enqueue(db, b"longer than ten bytes")
    finally:
        db.close()


def test_an_ack_with_a_receipt_the_record_no_longer_carries_is_refused(tmp_path: Path) -> None:
    """The leased record cached by receipt answers only for the very bytes leased: an ack after
    the lease expired and another consumer leased the message again, after a nack, after the
    message was purged and the queue refilled, after a lease that did not commit, is refused
    and counts nothing."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        q = Queue("jobs")
        q.enqueue(db, b"one")
        first = q.lease(db, 0.05)
        assert first is not None
        time.sleep(0.2)
        second = q.lease(db, 60.0)  # the same message, leased again under a new receipt
        assert second is not None and second.id == first.id and second.receipt != first.receipt
        with pytest.raises(LeaseError):
            q.release(db, first)  # (a release takes an expired lease: the receipt decides)
        with pytest.raises(LeaseError):
            q.ack(db, first)
        assert queue_stats(db, "jobs").inflight == 1
        q.nack(db, second)
        with pytest.raises(LeaseError):
            q.ack(db, second)
        third = q.lease(db, 60.0)
        assert third is not None and third.id == first.id
        purge_queue(db, "jobs")
        q.enqueue(db, b"two")
        fourth = q.lease(db, 60.0)
        assert fourth is not None
        with pytest.raises(LeaseError):
            q.ack(db, third)
        held: list[fdbqueue.Message] = []

        def lease_then_fail(tr: fdbqueue.Transaction) -> None:
            m = q.lease(tr, 60.0)
            assert m is None  # the only message is in flight
            q.enqueue(tr, b"three")
            m = q.lease(tr, 60.0)
            assert m is not None
            held.append(m)
            raise RuntimeError("abandoned")

        with pytest.raises(RuntimeError):
            run_transaction(db, lease_then_fail)
        with pytest.raises(LeaseError):
            q.ack(db, held[0])
        stats = queue_stats(db, "jobs")
        assert (stats.ready, stats.inflight) == (0, 1)
        q.ack(db, fourth)
        assert queue_stats(db, "jobs").inflight == 0
        with pytest.raises(LeaseError):
            q.ack(db, fourth)  # once
    finally:
        db.close()


def test_destroying_a_queue_in_this_process_is_seen_by_the_next_enqueue(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    try:
        q = Queue("jobs")
        create_queue(db, "jobs", max_payload=10)
        for _ in range(3):
            q.enqueue(db, b"short")
        destroy_queue(db, "jobs")
        q.enqueue(db, b"longer than ten bytes")
        assert queue_stats(db, "jobs").ready == 1
    finally:
        db.close()
