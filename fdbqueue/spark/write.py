"""Writing a DataFrame to a queue: ``df.write.format("fdbqueue").option("queue", q).save()``
enqueues its rows, each Spark task its own rows in batches (``Queue.enqueue_many``, a
transaction a batch).

Exactly once per row, across a task that fails and is retried, a speculative copy of a task,
or the whole job run again: every row has a dedup key, and a batch writes only the rows whose
keys the queue has not seen within its ``dedup_window`` (default an hour). The key is the
value of the column ``dedupColumn`` when given; else it is derived from the row: a SHA-256 of
all its columns, so that two identical rows are one message (give a ``dedupColumn`` to keep
them apart). A job is not atomic - a batch is, and what committed stays when a later task
fails - so a failed job is run again, and its rows already in the queue are skipped.

Columns: ``payload`` (binary or string) is the message, else the row (its other columns)
as a JSON object; ``priority`` (an integer), ``headers`` (a map of strings), ``delay`` and
``ttl`` (seconds) are the message's options when present. Options: ``url``, ``queue`` (one
queue), ``dedupColumn``, ``batch`` (rows a transaction holds at most, default 500; fewer when
their payloads pass half the transaction budget), ``root``, ``principal``.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import hashlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pyspark.sql import Row
from pyspark.sql.datasource import DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import (
    BinaryType,
    DataType,
    IntegralType,
    MapType,
    NumericType,
    StringType,
    StructType,
)

from fdbqueue.api.export import open_from, option_root
from fdbqueue.api.queue import Queue
from fdbqueue.errors import QueueError
from fdbqueue.store.budget import TXN_BUDGET_BYTES
from fdbqueue.types import NewMessage

log = logging.getLogger("fdbqueue")

BATCH = 500  # rows a transaction enqueues at most
OPTION_COLUMNS = ("priority", "headers", "delay", "ttl")
_ROW_COST = 300  # bytes a message costs besides its payload (keys, record, dedup entries)


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    """What one task reports to the driver: the rows it wrote (new or already there)."""

    rows: int


def _check_column(schema: StructType, name: str, allowed: tuple[type[DataType], ...], what: str) -> bool:
    if name not in schema.fieldNames():
        return False
    kind = schema[name].dataType
    if not isinstance(kind, allowed):
        raise QueueError(f"column {name!r} must be {what}, not {kind.simpleString()}")
    if isinstance(kind, MapType) and not (
        isinstance(kind.keyType, StringType) and isinstance(kind.valueType, StringType)
    ):
        raise QueueError(f"column {name!r} must be {what}, not {kind.simpleString()}")
    return True


class Writer(DataSourceWriter):
    """Enqueues each task's rows (the module docstring says how, and why exactly once)."""

    def __init__(self, options: dict[str, str], schema: StructType) -> None:
        options = {k.lower(): v for k, v in options.items()}  # Spark's options ignore case
        self.options = options
        self.root = option_root(options)
        self.queue = options.get("queue", "")
        if not self.queue or "," in self.queue or any(c in self.queue for c in "*?["):
            raise QueueError(f'a write enqueues into one queue: .option("queue", name), got {self.queue!r}')
        Queue(self.queue, root=self.root)  # the name is valid
        raw = options.get("batch", str(BATCH))
        try:
            self.batch = int(raw)
        except ValueError:
            self.batch = 0
        if self.batch < 1:
            raise QueueError(f"option batch must be an int >= 1, got {raw!r}")
        self.dedup = options.get("dedupcolumn")
        self.names = schema.fieldNames()
        if self.dedup is not None and self.dedup not in self.names:
            raise QueueError(f"dedupColumn {self.dedup!r} is not a column of {self.names}")
        self.payload = _check_column(schema, "payload", (BinaryType, StringType), "binary or string")
        self.has = {
            "priority": _check_column(schema, "priority", (IntegralType,), "an integer"),
            "headers": _check_column(schema, "headers", (MapType,), "map<string,string>"),
            "delay": _check_column(schema, "delay", (NumericType,), "a number of seconds"),
            "ttl": _check_column(schema, "ttl", (NumericType,), "a number of seconds"),
        }

    def write(self, iterator: Iterator[Any]) -> Written:
        db = open_from(self.options)
        q = Queue(self.queue, root=self.root)
        rows = 0
        try:
            batch: list[NewMessage] = []
            size = 0
            names = self.names
            for row in iterator:
                msg = self._message(dict(zip(names, row, strict=True)))
                batch.append(msg)
                rows += 1
                size += _ROW_COST + _size(msg.payload)
                if len(batch) >= self.batch or size > TXN_BUDGET_BYTES // 2:
                    q.enqueue_many(db, batch)
                    batch, size = [], 0
            if batch:
                q.enqueue_many(db, batch)
        finally:
            db.close()
        return Written(rows)

    def _message(self, row: dict[str, Any]) -> NewMessage:
        opts = {k: row.get(k) if self.has[k] else None for k in OPTION_COLUMNS}
        if self.payload:
            payload: object = row["payload"]
            if payload is None:
                raise QueueError(f"a row with a null payload: {_short(row)}")
            if isinstance(payload, bytearray):
                payload = bytes(payload)
        else:
            payload = {k: _plain(v) for k, v in row.items() if not (k in OPTION_COLUMNS and self.has[k])}
        if self.dedup is not None:
            value = row[self.dedup]
            if value is None:
                raise QueueError(f"a row with no dedup key in column {self.dedup!r}: {_short(row)}")
            key = value if isinstance(value, str) else json.dumps(_plain(value), sort_keys=True)
        else:
            canon = json.dumps({k: _plain(v) for k, v in row.items()}, sort_keys=True, separators=(",", ":"))
            key = "row:" + hashlib.sha256(canon.encode()).hexdigest()
        delay, ttl = opts["delay"], opts["ttl"]
        return NewMessage(
            payload,
            priority=opts["priority"],
            headers=opts["headers"],
            delay=None if delay is None else float(delay),
            ttl=None if ttl is None else float(ttl),
            dedup_key=key,
        )

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        rows = sum(m.rows for m in messages if isinstance(m, Written))
        log.info("fdbqueue: wrote %d rows to queue %r", rows, self.queue)

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        done = sum(m.rows for m in messages if isinstance(m, Written))
        log.warning(
            "fdbqueue: the write to queue %r failed; the batches committed before it stay "
            "(%d rows of finished tasks at least): run it again, and the rows already in the "
            "queue are skipped by their dedup keys",
            self.queue,
            done,
        )


def _size(payload: object) -> int:
    if isinstance(payload, bytes | str):
        return len(payload)
    return len(json.dumps(payload, default=str))


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: timestamps and dates in ISO 8601, decimals as strings,
    binary as base64."""
    if isinstance(value, Row):
        return {str(k): _plain(v) for k, v in value.asDict().items()}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, datetime.datetime | datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray):
        return base64.b64encode(bytes(value)).decode()
    return value


def _short(row: dict[str, Any]) -> str:
    text = repr({k: v for k, v in row.items() if k != "payload"})
    return text if len(text) <= 200 else text[:200] + "..."
