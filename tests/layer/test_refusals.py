"""Issue 26, second trial: what the first round's checks let through.

- The Spark reader checked the queue a piece names, then read whatever key range the piece
  gave: a principal could read another's queue through a piece naming a queue of its own.
- A schedule name, a route's key or a partition key with a lone surrogate was a raw
  UnicodeEncodeError (the CLI: a traceback).
- A Forwarder's arguments were used unchecked: ``retry_seconds="x"`` was a ValueError from
  deep inside ``run()``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Database, PartitionedQueue, Queue, QueueError
from fdbqueue.api import export

LONE = "s\udc80"


@pytest.fixture
def two(tmp_path: Path) -> Iterator[tuple[Database, Database]]:
    url = f"sqlite://{tmp_path / 'q.db'}"
    ops, eve = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="eve")
    yield ops, eve
    ops.close()
    eve.close()


# -- C: a piece is read only inside its queue's range for its state ---------------------------------


def test_a_piece_naming_ones_own_queue_with_anothers_range_reads_nothing(
    two: tuple[Database, Database],
) -> None:
    ops, eve = two
    fdbqueue.create_queue(ops, "payroll", owner="ops")
    Queue("payroll").enqueue(ops, {"salary": 123456}, delay=3600)
    Queue("payroll").enqueue(ops, {"salary": 7})
    fdbqueue.create_queue(eve, "mine")
    theirs = export.plan(ops, ["payroll"])
    assert any(p.state == "delayed" for p in theirs)
    for p in theirs:
        for state in ("ready", "leased", "delayed", "dead"):
            forged = export.Piece("mine", state, p.begin, p.end)
            with pytest.raises(QueueError, match="outside"):
                list(export.read_piece(eve, forged))
    with pytest.raises(QueueError, match="state"):
        list(export.read_piece(eve, export.Piece("mine", "forged", b"", b"\xff")))
    # Her own pieces still read.
    Queue("mine").enqueue(eve, b"hers")
    rows = [r for p in export.plan(eve, ["mine"]) for r in export.read_piece(eve, p)]
    assert [r[7] for r in rows] == [b"hers"]


def test_a_journal_piece_naming_ones_own_queue_with_anothers_range_reads_nothing(
    two: tuple[Database, Database],
) -> None:
    ops, eve = two
    fdbqueue.create_queue(ops, "payroll", owner="ops", journal=True)
    Queue("payroll").enqueue(ops, {"salary": 123456})
    fdbqueue.create_queue(eve, "mine", journal=True)
    theirs = export.journal_plan(ops, "payroll")
    assert theirs
    for p in theirs:
        with pytest.raises(QueueError, match="outside"):
            list(export.read_journal_piece(eve, export.Piece("mine", "journal", p.begin, p.end)))
    mine = export.journal_plan(eve, "mine")
    with pytest.raises(QueueError, match="state"):
        list(export.read_journal_piece(eve, export.Piece("mine", "ready", mine[0].begin, mine[0].end)))
    Queue("mine").enqueue(eve, b"hers")
    rows = [r for p in export.journal_plan(eve, "mine") for r in export.read_journal_piece(eve, p)]
    assert rows and {r[3] for r in rows} == {"mine"}


# -- D: names that go into keys refuse a lone surrogate ------------------------------------------


def test_a_lone_surrogate_in_a_name_that_goes_into_a_key_is_a_queue_error(tmp_path: Path) -> None:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs")
    orders = PartitionedQueue("orders", partitions=2, key="customer")
    calls: dict[str, Any] = {
        "schedule": lambda: fdbqueue.schedule(db, "jobs", "* * * * *", 1, name=LONE),
        "unschedule": lambda: fdbqueue.unschedule(db, LONE),
        "set_route key": lambda: fdbqueue.set_route(db, "orders", LONE, "jobs"),
        "partition_of": lambda: orders.partition_of(LONE),
        "partitioned enqueue": lambda: orders.enqueue(db, b"x", headers={"customer": LONE}),
    }
    for what, call in calls.items():
        with pytest.raises(QueueError, match="lone surrogate"):
            call()
            pytest.fail(f"{what} accepted a lone surrogate")
    db.close()


def test_the_cli_refuses_a_schedule_name_it_cannot_store_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from fdbqueue.cli import main

    url = f"sqlite://{tmp_path / 'q.db'}"
    assert main(["--url", url, "create", "jobs"]) == 0
    capsys.readouterr()
    assert main(["--url", url, "schedule", "s\udcff", "jobs", "* * * * *", "hi"]) == 2
    said = capsys.readouterr().err.strip().splitlines()
    assert len(said) == 1 and "lone surrogate" in said[0], said


# -- E: a Forwarder checks its arguments when made ---------------------------------------------------


@pytest.mark.parametrize(
    "kwargs",
    [
        {"retry_seconds": "x"},
        {"retry_seconds": -1},
        {"retry_seconds": float("nan")},
        {"lease_seconds": "x"},
        {"lease_seconds": 0},
        {"dst_root": "x"},
        {"root": 5},
        {"root": ()},
        {"ack_queue": 5},
    ],
)
def test_a_forwarder_refuses_a_bad_argument_when_made(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    src, dst = fdbqueue.open(f"sqlite://{tmp_path / 'a.db'}"), fdbqueue.open(f"sqlite://{tmp_path / 'b.db'}")
    with pytest.raises(QueueError):
        fdbqueue.Forwarder(src, "jobs", dst, "jobs", **kwargs)
    src.close()
    dst.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": "x"},
        {"limit": -1},
        {"limit": True},
        {"follow": "no"},
        {"progress": "x"},
        {"batch": 0},
    ],
)
def test_forward_refuses_a_bad_argument_before_it_forwards(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    src, dst = fdbqueue.open(f"sqlite://{tmp_path / 'a.db'}"), fdbqueue.open(f"sqlite://{tmp_path / 'b.db'}")
    Queue("jobs").enqueue(src, b"stays")
    with pytest.raises(QueueError):
        fdbqueue.forward(src, "jobs", dst, "jobs", **kwargs)
    assert Queue("jobs").size(src) == 1
    src.close()
    dst.close()


@pytest.mark.parametrize(
    "kwargs",
    [
        {"limit": "x"},
        {"limit": -1},
        {"idle_timeout": "x"},
        {"follow": "x"},
        {"install_signals": 1},
        {"progress": 5},
    ],
)
def test_forwarder_run_refuses_a_bad_argument(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    src, dst = fdbqueue.open(f"sqlite://{tmp_path / 'a.db'}"), fdbqueue.open(f"sqlite://{tmp_path / 'b.db'}")
    Queue("jobs").enqueue(src, b"stays")
    with pytest.raises(QueueError):
        fdbqueue.Forwarder(src, "jobs", dst, "jobs").run(**kwargs)
    assert Queue("jobs").size(src) == 1
    src.close()
    dst.close()
