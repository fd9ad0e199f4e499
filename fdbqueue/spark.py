"""The data source ``fdbqueue`` for Spark, on PySpark 4's Python Data Source API
(``pyspark.sql.datasource``): ``fdbqueue.spark.register(spark)``, then::

    spark.read.format("fdbqueue").option("url", u).option("queue", "jobs").load()

Imported only when used (``fdbqueue.spark``); it needs the ``spark`` extra (pyspark, pyarrow).

Options: ``url`` (any fdbqueue URL the executors can open: an embedded store's file on a
shared disk, a cluster file), ``queue`` (a name, a comma-separated list, a pattern such as
``"tenant.*"``, or a partitioned queue's name), ``split`` (messages a partition holds at most,
default 20,000), ``root`` (a JSON list, default ``["fdbqueue"]``), ``principal``. One row per
message, in every state: ready, leased, delayed, and dead (in the queue's error queue); the
columns are ``fdbqueue.export.COLUMNS``. Partitions are key ranges (``fdbqueue/export.py``), each
read in transactions of at most 500 messages.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

try:
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "fdbqueue.spark needs pyspark >= 4.0 and pyarrow: pip install 'fdbqueue[spark]'"
    ) from exc

import fdbqueue
from fdbqueue.errors import QueueError
from fdbqueue.export import (
    COLUMNS,
    JOURNAL_COLUMNS,
    SPLIT,
    Piece,
    journal_plan,
    plan,
    queue_names,
    read_journal_piece,
    read_piece,
)
from fdbqueue.journaling import check_version
from fdbqueue.layout import DEFAULT_ROOT

NAME = "fdbqueue"


def register(spark: Any) -> None:
    """Register the data source ``fdbqueue`` with the SparkSession ``spark``."""
    spark.dataSource.register(FdbQueueDataSource)


def _root(options: dict[str, str]) -> tuple[Any, ...]:
    raw = options.get("root")
    if raw is None:
        return DEFAULT_ROOT
    try:
        root = json.loads(raw)
    except ValueError:
        raise QueueError(f"option root must be a JSON list, got {raw!r}") from None
    if not isinstance(root, list) or not root:
        raise QueueError(f"option root must be a non-empty JSON list, got {raw!r}")
    return tuple(root)


def _open(options: dict[str, str]) -> fdbqueue.Database:
    url = options.get("url")
    if not url:
        raise QueueError('the fdbqueue data source needs .option("url", ...)')
    return fdbqueue.open(url, principal=options.get("principal"))


class FdbQueueDataSource(DataSource):
    """``spark.read.format("fdbqueue")``: a queue's messages (see the module docstring)."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> str:
        return JOURNAL_COLUMNS if "journal" in self.options else COLUMNS

    def reader(self, schema: Any) -> DataSourceReader:
        if "journal" in self.options:
            return _JournalReader(dict(self.options))
        return _QueueReader(dict(self.options))


class _Part(InputPartition):
    def __init__(self, piece: Piece) -> None:
        super().__init__(piece)
        self.piece = piece


class _Reader(DataSourceReader):
    """What both readers share: the options ``split`` and ``root``, a database opened for the
    planning on the driver and for each partition on an executor."""

    def __init__(self, options: dict[str, str]) -> None:
        self.options = options
        raw_split = options.get("split", str(SPLIT))
        try:
            self.split = int(raw_split)
        except ValueError:
            raise QueueError(f"option split must be an int, got {raw_split!r}") from None
        self.root = _root(options)

    def _plan(self, db: fdbqueue.Database) -> list[Piece]:
        raise NotImplementedError

    def _rows(self, db: fdbqueue.Database, piece: Piece) -> Iterator[tuple[Any, ...]]:
        raise NotImplementedError

    def partitions(self) -> list[InputPartition]:
        db = _open(self.options)
        try:
            return [_Part(p) for p in self._plan(db)]
        finally:
            db.close()

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, _Part):
            return  # no partitions: Spark reads once with none
        db = _open(self.options)
        try:
            yield from self._rows(db, partition.piece)
        finally:
            db.close()


class _QueueReader(_Reader):
    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        spec = options.get("queue")
        if not spec:
            raise QueueError('the fdbqueue data source needs .option("queue", ...)')
        self.spec = [s.strip() for s in spec.split(",")] if "," in spec else spec

    def _plan(self, db: fdbqueue.Database) -> list[Piece]:
        return plan(db, queue_names(db, self.spec, root=self.root), split=self.split, root=self.root)

    def _rows(self, db: fdbqueue.Database, piece: Piece) -> Iterator[tuple[Any, ...]]:
        return read_piece(db, piece, root=self.root)


class _JournalReader(_Reader):
    """``.option("journal", "jobs")`` (a queue, a pattern, or ``"*"``), ``since`` / ``until``:
    versions as 24 hex digits (``since`` exclusive, ``until`` exclusive)."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.spec = options["journal"]
        if not self.spec:
            raise QueueError('option journal names a queue, a pattern or "*"')
        self.since = check_version(options.get("since"))
        self.until = check_version(options.get("until"))

    def _plan(self, db: fdbqueue.Database) -> list[Piece]:
        since, until = self.since, self.until
        return journal_plan(db, self.spec, since=since, until=until, split=self.split, root=self.root)

    def _rows(self, db: fdbqueue.Database, piece: Piece) -> Iterator[tuple[Any, ...]]:
        return read_journal_piece(db, piece, root=self.root)


def local_session(app: str = "fdbqueue", cores: int = 2, *, retries: int = 1) -> Any:
    """A local SparkSession (``local[cores, retries]``) whose Python workers run this
    interpreter, with the data source registered: for tests, the demo and the audit."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(f"local[{cores},{retries}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
