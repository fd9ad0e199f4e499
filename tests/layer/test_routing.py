"""Partitioned queues and routing: a stable hash, routes kept in the database, every partition
seen as one queue."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import fdbqueue
from fdbqueue import PartitionedQueue, Queue, QueueError
from fdbqueue.engines.contract import Database
from fdbqueue.testing import FaultScript

# The partition of each value among 8: fixed here, so that a change of the hash (which would
# send a producer's messages to other partitions than those of a process still running the old
# code) fails this test. CRC-32 of the UTF-8 bytes, mod 8.
FIXED = {"c-17": 7, "acme": 6, "": 0, "tenant/ü": 7, "x" * 100: 7}


def test_the_hash_is_stable_across_processes_and_versions() -> None:
    orders = PartitionedQueue("orders", partitions=8, key="customer")
    expected = {v: f"orders.p{p}" for v, p in FIXED.items()}
    assert {v: orders.partition_of(v) for v in FIXED} == expected
    code = (
        "import json, sys, fdbqueue\n"
        "q = fdbqueue.PartitionedQueue('orders', partitions=8, key='customer')\n"
        "print(json.dumps({v: q.partition_of(v) for v in json.loads(sys.argv[1])}))\n"
    )
    import json

    other = subprocess.run(
        [sys.executable, "-c", code, json.dumps(list(FIXED))],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345", **__import__("os").environ},
    )
    assert json.loads(other.stdout) == expected


def test_messages_go_to_their_partition_and_routes_remap_future_ones(db: Database) -> None:
    orders = PartitionedQueue("orders", partitions=4, key="customer")
    a = orders.enqueue(db, b"1", headers={"customer": "c-17"})
    home = orders.partition_of("c-17")
    assert Queue(home).get(db, a) is not None
    fdbqueue.set_route(db, "orders", "c-17", "orders.vip")
    assert fdbqueue.routes(db, "orders") == {"c-17": "orders.vip"}
    b = orders.enqueue(db, b"2", headers={"customer": "c-17"})
    assert Queue("orders.vip").get(db, b) is not None
    assert Queue(home).get(db, a) is not None  # already queued: stays
    fdbqueue.set_route(db, "orders", "c-17", None)
    assert fdbqueue.routes(db, "orders") == {}
    c = orders.enqueue(db, b"3", headers={"customer": "c-17"})
    assert Queue(home).get(db, c) is not None
    assert orders.size(db) == 2  # the partitions; orders.vip is a queue of its own
    assert sorted(m.id for m in orders.browse(db)) == sorted([a, c])
    assert sum(s.ready for s in orders.stats(db)) == 2


def test_a_function_can_route_and_the_route_is_read_in_the_callers_transaction(db: Database) -> None:
    by_kind = PartitionedQueue("events", partitions=2, key=lambda payload, headers: str(payload)[:3])
    tr = db.create_transaction()
    mid = by_kind.enqueue(tr, "abc-1")
    tr.cancel()
    assert by_kind.size(db) == 0
    mid = by_kind.enqueue(db, "abc-1")
    assert Queue(by_kind.partition_of("abc")).get(db, mid) is not None


def test_a_routed_enqueue_is_exactly_once_across_commit_unknown_result() -> None:
    db = fdbqueue.open("sim://?seed=3&faults=0")
    orders = PartitionedQueue("orders", partitions=2, key="customer")
    FaultScript(db).arm([("1021", True)])
    orders.enqueue(db, b"once", headers={"customer": "x"})
    assert orders.size(db) == 1


def test_bad_input() -> None:
    with pytest.raises(QueueError, match="partitions"):
        PartitionedQueue("o", partitions=0, key="k")
    with pytest.raises(QueueError, match="key must be"):
        PartitionedQueue("o", partitions=2, key="")
    q = PartitionedQueue("o", partitions=2, key="k")
    db = fdbqueue.open("memory://")
    with pytest.raises(QueueError, match="routes by header 'k'"):
        q.enqueue(db, b"x")
    with pytest.raises(QueueError, match="routing value is a str"):
        q.enqueue(db, b"x", headers={"k": 5})
    with pytest.raises(QueueError, match="routing value"):
        fdbqueue.set_route(db, "o", "", "q")


def test_the_command_line(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli import main

    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert main(["--url", url, "routes", "orders"]) == 0
    assert "hashed partition" in capsys.readouterr().out
    assert main(["--url", url, "route", "orders", "acme", "orders.vip"]) == 0
    assert "now go to orders.vip" in capsys.readouterr().out
    assert main(["--url", url, "routes", "orders", "--json"]) == 0
    assert capsys.readouterr().out.strip() == '{"acme": "orders.vip"}'
    assert main(["--url", url, "route", "orders", "acme", ""]) == 0
    capsys.readouterr()
    assert main(["--url", url, "routes", "orders", "--json"]) == 0
    assert capsys.readouterr().out.strip() == "{}"


def test_list_shows_a_partitioned_queue_as_one_with_its_partitions(
    tmp_path: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from fdbqueue.cli import main

    url = f"sqlite:///{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    orders = PartitionedQueue("orders", partitions=3, key="customer")
    for i in range(12):
        orders.enqueue(db, b"o", headers={"customer": f"c-{i}"})
    Queue("jobs").enqueue(db, b"j")
    assert fdbqueue.partitioned_queues(db) == {"orders": 3}
    capsys.readouterr()
    assert main(["--url", url, "list"]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if "orders" in line or "jobs" in line]

    row = next(i for i, line in enumerate(lines) if "orders (3 partitions)" in line)
    assert " 12 " in lines[row]  # the partitions' sum
    assert all(q.size(db) for q in orders.queues)  # each partition got some
    assert [line.strip("│ ").split()[0] for line in lines[row + 1 : row + 4]] == [
        "orders.p0",
        "orders.p1",
        "orders.p2",
    ]
    assert sum("orders." in line for line in lines) == 3  # listed under it, not again
