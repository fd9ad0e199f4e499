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

``.option("journal", q)`` reads the journal instead (``export.JOURNAL_COLUMNS``), in a batch or
as a stream (``spark.readStream``: offsets are journal versions). ``df.write`` enqueues rows
(``_Writer``: idempotent per row through dedup keys).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from typing import Any

try:
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        DataSourceWriter,
        InputPartition,
    )
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "fdbqueue.spark needs pyspark >= 4.0 and pyarrow: pip install '.[spark]' in a checkout of fdbqueue"
    ) from exc
try:  # PySpark 4.2+: a stream reader says so to take Trigger.AvailableNow itself
    from pyspark.sql.streaming.datasource import SupportsTriggerAvailableNow
except ImportError:  # pragma: no cover - older PySpark wraps the source itself

    class SupportsTriggerAvailableNow:  # type: ignore[no-redef]
        """Stands in for the PySpark 4.2 mixin."""


import fdbqueue
from fdbqueue.errors import QueueError
from fdbqueue.export import (
    COLUMNS,
    JOURNAL_COLUMNS,
    SPLIT,
    Piece,
    journal_head,
    journal_names,
    journal_plan,
    open_from,
    option_root,
    plan,
    queue_names,
    read_journal_piece,
    read_piece,
)
from fdbqueue.journaling import check_version
from fdbqueue.sparkwrite import Writer

NAME = "fdbqueue"


def register(spark: Any) -> None:
    """Register the data source ``fdbqueue`` with the SparkSession ``spark``."""
    spark.dataSource.register(FdbQueueDataSource)


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

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        if "journal" not in self.options:
            raise QueueError('a stream reads the journal: .option("journal", queue or pattern or "*")')
        return _JournalStream(dict(self.options))

    def writer(self, schema: Any, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise QueueError('the fdbqueue data source appends (enqueues): use .mode("append")')
        return Writer(dict(self.options), schema)


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
        self.root = option_root(options)

    def _plan(self, db: fdbqueue.Database) -> list[Piece]:
        raise NotImplementedError

    def _rows(self, db: fdbqueue.Database, piece: Piece) -> Iterator[tuple[Any, ...]]:
        raise NotImplementedError

    def partitions(self) -> list[InputPartition]:
        db = open_from(self.options)
        try:
            return [_Part(p) for p in self._plan(db)]
        finally:
            db.close()

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        if not isinstance(partition, _Part):
            return  # no partitions: Spark reads once with none
        db = open_from(self.options)
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


_FIRST = "00" * 12  # before every journal entry


def _offset(version: bytes | None) -> dict[str, str]:
    return {"version": (version or bytes(12)).hex()}


class _JournalStream(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream.format("fdbqueue").option("journal", spec)``: the journal as it is
    written. An offset is a journal version (``{"version": 24 hex digits}``): a micro-batch
    reads the entries after its start up to and including its end, so a query restarted from
    its checkpoint reads each entry once. ``since`` (a version) starts a new query after it,
    else at the first entry. Entries trimmed before a query reads them are not seen."""

    def __init__(self, options: dict[str, str]) -> None:
        self.batch = _JournalReader(options)
        self.target: dict[str, str] | None = None  # Trigger.AvailableNow: the head when it began

    def initialOffset(self) -> dict[str, str]:
        return _offset(self.batch.since)

    def _head(self) -> dict[str, str]:
        db = open_from(self.batch.options)
        try:
            return _offset(journal_head(db, journal_names(db, self.batch.spec, root=self.batch.root)))
        finally:
            db.close()

    def latestOffset(self, start: dict[str, str] | None = None, limit: Any = None) -> dict[str, str]:
        head = self.target or self._head()
        if start is not None and start["version"] > head["version"]:
            return start  # an offset past the head (entries trimmed): nothing new
        return head

    def prepareForTriggerAvailableNow(self) -> None:
        self.target = self._head()

    def partitions(self, start: dict[str, str], end: dict[str, str]) -> list[InputPartition]:
        if end["version"] <= start["version"]:
            return []
        since = None if start["version"] == _FIRST else bytes.fromhex(start["version"])
        until = (int(end["version"], 16) + 1).to_bytes(12, "big")  # the end is read too
        b = self.batch
        db = open_from(b.options)
        try:
            pieces = journal_plan(db, b.spec, since=since, until=until, split=b.split, root=b.root)
            return [_Part(p) for p in pieces]
        finally:
            db.close()

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        return self.batch.read(partition)

    def commit(self, end: dict[str, str]) -> None:
        """Nothing to release: the journal keeps its entries for their retention."""


def local_session(
    app: str = "fdbqueue", cores: int = 2, *, retries: int = 1, master: str | None = None
) -> Any:
    """A SparkSession, local (``local[cores, retries]``) unless ``master`` names another as
    spark-submit takes it, whose local Python workers run this interpreter, with the data
    source registered: for tests, the demo and the audit."""
    from pyspark.sql import SparkSession

    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    spark = (
        SparkSession.builder.master(master or f"local[{cores},{retries}]")
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark
