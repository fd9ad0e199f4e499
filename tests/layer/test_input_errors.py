"""Bad input gets a clear QueueError and writes nothing; a staged result put back is not done."""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Queue
from fdbqueue.engines.contract import Database
from fdbqueue.engines.versions import VERSIONS_PER_SECOND
from fdbqueue.errors import QueueError
from fdbqueue.ops.contention import fulfil
from fdbqueue.ops.receipts import RESULT_TTL_VERSIONS
from fdbqueue.store.clock import db_now, fake_clock
from fdbqueue.store.codec import unpack_count


@pytest.fixture
def db() -> Iterator[Database]:
    db = fdbqueue.open("sim://?seed=1")
    try:
        yield db
    finally:
        db.close()


def counter(db: Database, q: Queue, name: str) -> int:
    return unpack_count(db.create_transaction().get(q.keys.counter(name)))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"payload": "lone \ud800 surrogate"},
        {"payload": b"x", "dedup_key": "lone \udc00"},
        {"payload": b"x", "headers": {"n": 10**5000}},
        {"payload": b"x", "headers": {1: "a", "1": "b"}},
        {"payload": b"x", "headers": {("a",): "b"}},
    ],
    ids=[
        "payload-surrogate",
        "dedup-key-surrogate",
        "header-int-5000-digits",
        "int-header-name",
        "tuple-name",
    ],
)
def test_bad_message_input_is_a_queue_error_and_writes_nothing(db: Database, kwargs: dict[str, Any]) -> None:
    q = Queue("jobs")
    with pytest.raises(QueueError) as info:
        q.enqueue(db, **kwargs)
    assert type(info.value).__module__.startswith("fdbqueue")
    assert q.peek(db) is None


def test_a_header_int_past_pythons_digit_limit_names_the_header(db: Database) -> None:
    with pytest.raises(QueueError, match="'big'"):
        Queue("jobs").enqueue(db, b"x", headers={"big": -(10**5000)})


@pytest.mark.parametrize("name", ["lone \ud800", "\udfff"])
def test_a_queue_name_with_a_lone_surrogate_is_a_queue_error(db: Database, name: str) -> None:
    with pytest.raises(QueueError, match="UTF-8"):
        Queue(name)
    with pytest.raises(QueueError, match="UTF-8"):
        fdbqueue.create_queue(db, name)


def test_a_filter_with_a_non_str_header_name_is_refused(db: Database) -> None:
    q = Queue("jobs")
    q.enqueue(db, b"x", headers={"1": "a"})
    with pytest.raises(QueueError, match="header names"):
        q.dequeue(db, where={1: "a"})
    assert q.size(db) == 1


def test_a_staged_result_put_back_after_its_ttl_is_not_counted_done(db: Database) -> None:
    """A result nobody collected (its requester died) goes back to the queue: it was counted
    done when it was paired, and must not stay counted when it is delivered again."""
    q = Queue("jobs")
    q.enqueue(db, b"A")
    with fake_clock() as clock:
        tr = db.create_transaction()
        tr.set(q.keys.pop_key(db_now(tr), os.urandom(8)), b"")  # a requester that then died
        tr.commit()
        assert fulfil(db, q.keys) == 1
        assert q.size(db) == 0
        clock.advance(RESULT_TTL_VERSIONS / VERSIONS_PER_SECOND + 1)
        assert q.sweep(db).results == 1
    assert q.size(db) == 1 and counter(db, q, "done") == 0
    m = q.dequeue(db)
    assert m is not None and m.payload == b"A"
    assert counter(db, q, "done") == 1, "one message taken once, counted done twice"


# -- headers: names and values JSON and UTF-8 can carry (issue 26) --------------------------------

BAD_HEADERS = [
    {"k": "lone \ud800"},
    {"lone \udfff": "v"},
    {"k": float("nan")},
    {"k": float("inf")},
    {"k": -float("inf")},
]
BAD_HEADER_IDS = ["value-surrogate", "name-surrogate", "nan", "inf", "-inf"]


@pytest.mark.parametrize("headers", BAD_HEADERS, ids=BAD_HEADER_IDS)
def test_a_header_json_or_utf8_cannot_carry_is_refused_everywhere(
    db: Database, headers: dict[str, Any]
) -> None:
    """A lone surrogate or a non-finite float was stored, then every page of the queue's
    dashboard answered 500 (a JSON response is UTF-8 without NaN)."""
    q = Queue("jobs")
    with pytest.raises(QueueError, match="header"):
        q.enqueue(db, b"x", headers=headers)
    with pytest.raises(QueueError, match="header"):
        q.enqueue_many(db, [b"a", b"b"], headers=headers)
    with pytest.raises(QueueError, match="header"):
        q.enqueue_many(db, [b"a", fdbqueue.NewMessage(b"b", headers=headers)])
    assert q.peek(db) is None


def test_finite_floats_and_other_json_scalars_stay_valid_header_values(db: Database) -> None:
    headers = {"f": 1.5, "i": -3, "b": True, "n": None, "s": "\u00e9\U0001f600"}
    q = Queue("jobs")
    q.enqueue(db, b"x", headers=headers)
    m = q.dequeue(db)
    assert m is not None and dict(m.headers) == headers


# -- payloads and batches --------------------------------------------------------------------------


def _nested(depth: int) -> list[Any]:
    out: list[Any] = []
    inner = out
    for _ in range(depth):
        inner.append([])
        inner = inner[0]
    return out


def test_a_payload_nested_too_deep_for_json_is_a_queue_error(db: Database) -> None:
    q = Queue("jobs")
    with pytest.raises(fdbqueue.InvalidPayloadError, match="nested"):
        q.enqueue(db, _nested(100_000))
    with pytest.raises(fdbqueue.InvalidPayloadError, match="nested"):
        q.enqueue_many(db, [b"ok", {"deep": _nested(100_000)}])
    assert q.peek(db) is None
    q.enqueue(db, _nested(100))  # ordinary nesting stays fine
    assert q.size(db) == 1


@pytest.mark.parametrize("payloads", [5, None, "abc", b"abc", bytearray(b"ab"), {"a": 1}], ids=repr)
def test_enqueue_many_of_no_list_of_payloads_is_refused(db: Database, payloads: Any) -> None:
    """``enqueue_many(db, "abc")`` enqueued three messages; ``enqueue_many(db, 5)`` raised a raw
    TypeError; a dict enqueued its keys."""
    q = Queue("jobs")
    with pytest.raises(QueueError, match="enqueue_many"):
        q.enqueue_many(db, payloads)
    assert q.peek(db) is None


def test_enqueue_many_takes_any_iterable_of_payloads(db: Database) -> None:
    q = Queue("jobs")
    assert len(q.enqueue_many(db, (f"m{i}" for i in range(3)))) == 3
    assert len(q.enqueue_many(db, [])) == 0
    assert [q.dequeue(db).text() for _ in range(3)] == ["m0", "m1", "m2"]  # type: ignore[union-attr]


def test_the_async_api_refuses_the_same_input() -> None:
    import asyncio

    from fdbqueue.aio import AsyncQueue

    async def main() -> None:
        db = fdbqueue.open("sim://?seed=2")
        try:
            q = AsyncQueue("jobs")
            with pytest.raises(QueueError, match="enqueue_many"):
                await q.enqueue_many(db, "abc")
            with pytest.raises(QueueError, match="header"):
                await q.enqueue(db, b"x", headers={"k": float("nan")})
            with pytest.raises(fdbqueue.InvalidPayloadError, match="nested"):
                await q.enqueue(db, _nested(100_000))
            assert Queue("jobs").peek(db) is None
        finally:
            db.close()

    asyncio.run(main())


# -- error queues: never the queue itself, never a cycle -----------------------------------------


def test_a_queue_is_not_its_own_error_queue(db: Database) -> None:
    with pytest.raises(QueueError, match="its own error queue"):
        fdbqueue.create_queue(db, "jobs", error_queue="jobs")
    assert "jobs" not in fdbqueue.list_queues(db)
    fdbqueue.create_queue(db, "jobs", max_deliveries=2)
    with pytest.raises(QueueError, match="its own error queue"):
        fdbqueue.create_queue(db, "jobs", error_queue="jobs")
    cfg = fdbqueue.queue_config(db, "jobs")
    assert cfg.error_queue is None and cfg.max_deliveries == 2


def test_error_queues_that_would_loop_are_refused(db: Database) -> None:
    """a -> b -> a: a poison message would go round for ever and never rest anywhere."""
    fdbqueue.create_queue(db, "a", error_queue="b")
    fdbqueue.create_queue(db, "b", error_queue="c")
    with pytest.raises(QueueError, match="'c' -> 'a' -> 'b' -> 'c'"):
        fdbqueue.create_queue(db, "c", error_queue="a")
    assert "c" not in fdbqueue.list_queues(db)
    fdbqueue.create_queue(db, "c")  # its default, c.error: no loop
    with pytest.raises(QueueError, match="loop"):
        fdbqueue.create_queue(db, "c", error_queue="a")
    assert fdbqueue.queue_config(db, "c").error_queue is None
    with pytest.raises(QueueError, match="loop"):
        fdbqueue.create_queue(db, "b", error_queue="a")
    fdbqueue.create_queue(db, "b", error_queue="shared")  # chains that end are fine
    fdbqueue.create_queue(db, "c", error_queue="shared")
    assert fdbqueue.queue_config(db, "c").error_queue == "shared"
    # A default closes a loop too: x.error -> x, then x (whose default is x.error).
    with pytest.raises(QueueError, match=re.escape("'x.error' -> 'x' -> 'x.error'")):
        fdbqueue.create_queue(db, "x.error", error_queue="x")
    fdbqueue.create_queue(db, "x")
    with pytest.raises(QueueError, match=re.escape("'x.error' -> 'x' -> 'x.error'")):
        fdbqueue.create_queue(db, "x.error", error_queue="x")


def test_a_self_loop_stored_before_the_check_dead_letters_to_the_default(db: Database) -> None:
    """A setting stored by an older version (the check is at create): a dead letter must
    not go back into the queue it left, to be delivered for ever."""
    import dataclasses

    from fdbqueue.store.config import QueueConfig, write_config
    from fdbqueue.store.layout import QueueKeys

    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    tr = db.create_transaction()
    write_config(
        tr, QueueKeys.make("jobs"), dataclasses.replace(QueueConfig(max_deliveries=1), error_queue="jobs")
    )
    tr.commit()
    q = Queue("jobs")
    q.enqueue(db, b"poison")
    q.nack(db, q.lease(db), reason="bad")  # type: ignore[arg-type]
    assert q.size(db) == 0 and Queue("jobs.error").size(db) == 1


# -- the command line: the same refusals in one line, and whatever is stored printed -----------


def test_the_cli_refuses_the_same_input_in_one_line(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from fdbqueue.cli import main

    monkeypatch.delenv("FDBQUEUE_URL", raising=False)
    url = f"sqlite://{tmp_path / 'q.db'}"
    for argv, text in (
        (["create", "jobs", "--error-queue", "jobs"], "its own error queue"),
        (["enqueue", "jobs", "x", "--header", "n:=NaN"], "not JSON"),
        (["enqueue", "jobs", "x", "--header", "n:=-Infinity"], "not JSON"),
        (["enqueue", "jobs", "x", "--header", "k=\udcff"], "lone surrogate"),  # argv's undecodable byte
    ):
        assert main(["--url", url, *argv]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("fdbqueue: error: ") and err.count("\n") == 1 and text in err, (argv, err)
    db = fdbqueue.open(url)
    try:
        assert Queue("jobs").peek(db) is None
    finally:
        db.close()


def test_the_cli_prints_strict_json_of_whatever_a_store_holds(
    tmp_path: Any, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Headers written before enqueue refused them (NaN, infinities): ``--json`` stays JSON
    that strict readers (jq, JSON.parse) take."""
    import json

    from fdbqueue.cli import main
    from fdbqueue.ops.enqueuing import enqueue_items
    from fdbqueue.store.entropy import new_rand
    from fdbqueue.types import ContentType, Item

    monkeypatch.delenv("FDBQUEUE_URL", raising=False)
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    headers = {"k\ud800": "v", "n": float("nan"), "i": float("inf")}
    item = Item("", new_rand(), b"x", ContentType.BYTES, 0, headers, 0.0, None, None)
    mid = enqueue_items(Queue("jobs").keys, db, [item], None)[0]
    db.close()

    def strict(text: str) -> Any:
        def refuse(name: str) -> Any:
            raise ValueError(f"{name} is not JSON")

        return json.loads(text, parse_constant=refuse)

    for argv in (["browse", "jobs", "--json"], ["get", "jobs", mid, "--json"], ["peek", "jobs", "--json"]):
        assert main(["--url", url, *argv]) == 0, argv
        got = strict(capsys.readouterr().out)
        assert got["headers"] == {"k\\ud800": "v", "n": "NaN", "i": "Infinity"}, argv
