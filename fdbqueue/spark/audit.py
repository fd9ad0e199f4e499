"""``fdbqueue audit``: a Spark job that accounts for every message of journaled queues.

For each message it puts the journal (what happened to it, in commit order) beside the
queues' current contents (``export``), and says its fate: acked, dead-lettered (with the
reason), expired, purged, deleted, moved or forwarded out, destroyed with its queue, still queued, or in
flight. A message is **unaccounted** when the journal and the contents disagree: the journal
says it is in a queue and it is nowhere (deleted behind the layer's back), or it is somewhere
the journal never put it (written without its journal entry), or in two places at once.

Consistency on a live queue: the journal head ``v0`` is read first, then the contents, then
the journal up to the head after them. A message whose last entry is at or before ``v0``
has not moved since, so the contents (read later) must agree with it; one that moved during
the audit has an entry after ``v0`` and is reported as the journal says, not judged. A
message in the contents with no entry at all is judged unless it was enqueued before its
queue's oldest journal entry (before the journal was turned on, or trimmed away). Where a
message went to a queue that keeps no journal (an error queue without ``journal=True``), its
fate there cannot be checked: it is reported, not judged.

Latency is enqueue to ack (or exactly-once dequeue) by the entries' wall-clock times, per the
queue the message entered. Output: ``messages.parquet`` (one row per message), a summary,
and ``audit.png`` (fates and latency per queue, matplotlib).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fdbqueue.api.export import (
    error_queues,
    journal_head,
    journal_names,
    open_from,
    queue_names,
)
from fdbqueue.errors import QueueError
from fdbqueue.ops.journaling import journaled_queues
from fdbqueue.store.layout import DEFAULT_ROOT

FATES = (
    "acked",
    "dead-lettered",
    "expired",
    "purged",
    "deleted",
    "moved out",
    "forwarded out",
    "destroyed",
    "queued",
    "in flight",
    "before the journal",
)
GONE = ("acked", "expired", "purged", "deleted", "moved out", "forwarded out", "destroyed")
QUANTILES = [i / 100 for i in range(1, 101)]


@dataclass(frozen=True)
class QueueSummary:
    """One audited queue: its messages by fate, how many are unaccounted, and the latency
    from enqueue to ack in seconds (p50, p90, p99; None when none was acked)."""

    queue: str
    fates: dict[str, int]
    unaccounted: int
    latency: tuple[float, float, float] | None


@dataclass(frozen=True)
class AuditReport:
    """What ``run_audit`` found; ``examples``: the first unaccounted messages (id, queue, problem)."""

    queues: list[QueueSummary]
    messages: int
    unaccounted: int
    examples: list[tuple[str, str, str]]
    parquet: Path
    plot: Path
    head: str  # the journal version the audit judged up to (hex)
    seconds: dict[str, float] = field(default_factory=dict)


def run_audit(
    spark: Any,
    url: str,
    out: str | Path,
    *,
    queues: str = "*",
    root: tuple[Any, ...] = DEFAULT_ROOT,
    principal: str | None = None,
) -> AuditReport:
    """Audit the journaled queues ``queues`` names (a name, a pattern, a comma-separated
    list; default every one) of the database at ``url``, with their error queues; writes
    ``out/messages.parquet`` and ``out/audit.png``. Reads only (snapshot reads, bounded
    transactions); needs ``browse`` on each queue."""
    from pyspark.sql import functions as F

    opts = {"url": url, "root": json.dumps(list(root))}
    if principal is not None:
        opts["principal"] = principal
    db = open_from(opts)
    try:
        audited = journal_names(db, queues, root=root)
        if not audited:
            raise QueueError(
                f"no journaled queue matches {queues!r} (journal=True on create_queue keeps one)"
            )
        names = queue_names(db, audited, root=root)  # and their error queues
        every_journaled = set(journaled_queues(db, root=root))
        journaled = [n for n in names if n in every_journaled]
        errors = error_queues(db, names, root=root)
        v0 = journal_head(db, journaled, root=root) or bytes(12)
    finally:
        db.close()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)

    contents = (
        spark.read.format("fdbqueue")
        .options(**opts, queue=",".join(names))
        .load()
        .select("queue", "id", "state", "enqueued_at")
        .localCheckpoint(eager=True)  # read now, before the journal's head is taken again
    )
    db = open_from(opts)
    try:
        v1 = journal_head(db, journaled, root=root) or bytes(12)
    finally:
        db.close()
    until = (int.from_bytes(v1, "big") + 1).to_bytes(12, "big").hex()
    journal = spark.read.format("fdbqueue").options(**opts, journal=",".join(journaled), until=until).load()

    messages = _judge(F, journal, contents, journaled, errors, v0)
    parquet = out / "messages.parquet"
    messages.write.mode("overwrite").parquet(str(parquet))
    table = spark.read.parquet(str(parquet))
    report = _summarise(F, table, parquet, out / "audit.png", v0.hex())
    return report


def _judge(
    F: Any, journal: Any, contents: Any, journaled: list[str], errors: dict[str, str], v0: bytes
) -> Any:
    """One row per message: its fate by its last journal entry, beside where it is."""
    col, lit, when = F.col, F.lit, F.when
    entries = journal.where(col("message_id").isNotNull())
    last = entries.groupBy("message_id").agg(
        F.max_by(F.struct("version", "op", "queue", "reason", "details"), "version").alias("last"),
        F.min_by("queue", "version").alias("home"),
        F.min(when(col("op").isin("enqueue", "forward_in", "move_in"), col("at"))).alias("entered_at"),
        F.max(when(col("op").isin("ack", "dequeue"), col("at"))).alias("acked_at"),
    )
    op, q, details = col("last.op"), col("last.queue"), col("last.details")
    to = F.get_json_object(details, "$.to")
    to_error = (op == "expired") & (F.get_json_object(details, "$.action") == "error")
    error_of = F.create_map(*[lit(x) for pair in errors.items() for x in pair]) if errors else None
    fate = (
        when(op.isin("ack", "dequeue"), "acked")
        .when((op == "dead") | to_error, "dead-lettered")
        .when(op == "expired", "expired")
        .when(op == "purge", "purged")
        .when(op == "delete", "deleted")
        .when(op == "move_out", "moved out")
        .when(op == "forward_out", "forwarded out")
        .when(op == "lease", "in flight")
        .otherwise("queued")
    )
    dead_in = F.coalesce(to, F.element_at(error_of, q)) if error_of is not None else to
    loc = (
        when(op == "dead", F.coalesce(to, q))
        .when(to_error, dead_in)
        .when(op == "redrive", F.coalesce(to, q))  # out of the error queue ("to"), or into this one
        .when(fate.isin("queued", "in flight"), q)
    )
    reason = when(to_error, lit("expired")).otherwise(col("last.reason"))
    last = last.select(
        "message_id",
        "home",
        "entered_at",
        "acked_at",
        fate.alias("jfate"),
        loc.alias("loc"),
        reason.alias("reason"),
        op.alias("last_op"),
        col("last.version").alias("last_version"),
    )
    destroyed = (
        journal.where(col("op") == "destroy").groupBy("queue").agg(F.max("version").alias("destroyed_v"))
    )
    last = (
        last.join(F.broadcast(destroyed.withColumnRenamed("queue", "loc")), "loc", "left")
        .withColumn(
            "jfate",
            when(col("destroyed_v") > col("last_version"), lit("destroyed")).otherwise(col("jfate")),
        )
        .withColumn("loc", when(col("jfate") == "destroyed", lit(None)).otherwise(col("loc")))
        .drop("destroyed_v")
    )
    here = contents.groupBy("id").agg(
        F.count("*").alias("places"),
        F.min("queue").alias("cqueue"),
        F.min_by("state", "queue").alias("state"),
        F.min("enqueued_at").alias("cenqueued_at"),
    )
    since = journal.groupBy("queue").agg(F.min("at").alias("journal_from"))
    here = here.join(F.broadcast(since.withColumnRenamed("queue", "cqueue")), "cqueue", "left")
    m = last.join(here, last.message_id == here.id, "full_outer")
    mid = F.coalesce(col("message_id"), col("id"))
    cq, cs, jfate, loc = col("cqueue"), col("state"), col("jfate"), col("loc")
    present = cq.isNotNull()
    stable = col("last_version") <= lit(v0)
    checked_here = loc.isin(journaled)
    agrees = (cq == loc) & (
        ((jfate == "in flight") & (cs == "leased"))
        | ((jfate != "in flight") & cs.isin("ready", "delayed", "dead"))
    )
    before = col("cenqueued_at") < col("journal_from")
    problem = (
        when(
            (col("places") > 1) & (stable | col("last_version").isNull()),
            F.concat(lit("in "), col("places").cast("string"), lit(" places at once")),
        )
        .when(
            col("last_version").isNull()
            & present
            & cq.isin(journaled)
            & col("journal_from").isNotNull()
            & ~before,
            F.concat(lit("no journal entry, yet it is in "), cq),
        )
        .when(stable & jfate.isin(*GONE) & present, F.concat(lit("still in "), cq, lit(" after "), jfate))
        .when(
            stable & checked_here & ~present,
            F.concat(lit("missing: the journal says "), jfate, lit(" in "), loc, lit(", it is nowhere")),
        )
        .when(
            stable & checked_here & present & ~agrees,
            F.concat(
                lit("elsewhere: "), cq, lit("/"), cs, lit(", the journal says "), jfate, lit(" in "), loc
            ),
        )
    )
    found_fate = when(cs == "leased", "in flight").when(cs == "dead", "dead-lettered").otherwise("queued")
    fate = F.coalesce(jfate, when(before, lit("before the journal")).otherwise(found_fate))
    latency = col("acked_at").cast("double") - col("entered_at").cast("double")
    return m.select(
        mid.alias("message_id"),
        F.coalesce(col("home"), cq).alias("queue"),
        fate.alias("fate"),
        F.coalesce(loc, cq).alias("where"),
        col("reason"),
        cs.alias("state"),
        F.coalesce(col("entered_at"), col("cenqueued_at")).alias("enqueued_at"),
        col("acked_at"),
        when(jfate == "acked", latency).alias("latency_s"),
        col("last_op"),
        col("last_version"),
        problem.alias("problem"),
    )


def _summarise(F: Any, table: Any, parquet: Path, png: Path, head: str) -> AuditReport:
    col = F.col
    counts = table.groupBy("queue", "fate").count().collect()
    lost = table.where(col("problem").isNotNull())
    per_queue_lost = {r["queue"]: r["count"] for r in lost.groupBy("queue").count().collect()}
    cdf = {
        r["queue"]: r["q"]
        for r in table.where(col("latency_s").isNotNull())
        .groupBy("queue")
        .agg(F.percentile_approx("latency_s", QUANTILES, 10_000).alias("q"))
        .collect()
    }
    fates: dict[str, dict[str, int]] = {}
    for r in counts:
        fates.setdefault(r["queue"], {})[r["fate"]] = r["count"]
    summaries = []
    for name in sorted(fates):
        qs = cdf.get(name)
        latency = (qs[49], qs[89], qs[98]) if qs else None
        summaries.append(QueueSummary(name, fates[name], per_queue_lost.get(name, 0), latency))
    examples = [
        (r["message_id"], r["queue"], r["problem"])
        for r in lost.orderBy("queue", "message_id").limit(50).collect()
    ]
    total_lost = sum(per_queue_lost.values())
    _plot(summaries, cdf, png)
    return AuditReport(
        summaries,
        sum(sum(f.values()) for f in fates.values()),
        total_lost,
        examples,
        parquet,
        png,
        head,
    )


def _plot(summaries: list[QueueSummary], cdf: dict[str, list[float]], png: Path) -> None:
    """Fates per queue (stacked bars) and the latency distribution per queue (CDFs), in ``png``."""
    import matplotlib.pyplot as plt

    fig = _figure(summaries, cdf)
    fig.savefig(png, dpi=100)
    plt.close(fig)


def _figure(summaries: list[QueueSummary], cdf: dict[str, list[float]]) -> Any:
    """The audit's figure (matplotlib's Figure): see :func:`_plot`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, (bars, lines) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = [s.queue for s in summaries]
    bottom = [0] * len(names)
    for fate in FATES:
        heights = [s.fates.get(fate, 0) for s in summaries]
        if any(heights):
            bars.bar(names, heights, bottom=bottom, label=fate)
            bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    lost = [s.unaccounted for s in summaries]
    if any(lost):
        bars.bar(names, lost, bottom=bottom, label="unaccounted", color="red")
    bars.set_title("messages by fate")
    bars.set_ylabel("messages")
    # Whole messages on the axis, and a scale up to one at least: matplotlib's default locator
    # marks 0.2 of a message, and an empty audit would get an axis of nothing.
    bars.yaxis.set_major_locator(MaxNLocator(integer=True))
    tallest = max((b + n for b, n in zip(bottom, lost, strict=True)), default=0)
    bars.set_ylim(0, max(1, tallest * 1.05))
    if any(bottom) or any(lost):
        bars.legend(fontsize="small")
    else:
        bars.bar(names, [0] * len(names))  # the queues along the axis all the same
        bars.text(0.5, 0.5, "no message", ha="center", transform=bars.transAxes)
    bars.tick_params(axis="x", labelrotation=30)
    for name, qs in sorted(cdf.items()):
        lines.plot(qs, [q * 100 for q in QUANTILES], label=name)
    lines.set_title("enqueue to ack")
    lines.set_xlabel("seconds")
    lines.set_ylabel("percent of acked messages")
    if cdf:
        lines.set_xscale("symlog", linthresh=0.01)
        lines.legend(fontsize="small")
    else:
        lines.text(0.5, 0.5, "no message acked", ha="center", transform=lines.transAxes)
        lines.set_ylim(0, 100)
        lines.set_xticks([])
    fig.tight_layout()
    return fig


def summary_lines(report: AuditReport) -> list[str]:
    """The report as the terminal shows it: a table per queue, then the unaccounted."""
    shown = [f for f in FATES if any(s.fates.get(f) for s in report.queues)]
    head = ["queue", *shown, "unaccounted", "p50 s", "p90 s", "p99 s"]
    rows = []
    for s in report.queues:
        lat = [f"{x:.3f}" for x in s.latency] if s.latency else ["-"] * 3
        rows.append([s.queue, *(str(s.fates.get(f, 0)) for f in shown), str(s.unaccounted), *lat])
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]

    def fmt(cells: list[str]) -> str:
        pairs = enumerate(zip(cells, widths, strict=True))
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in pairs)

    lines = [fmt(head), *(fmt(r) for r in rows)]
    lines.append(
        f"{report.messages} messages, {report.unaccounted} unaccounted (journal up to {report.head})"
    )
    for mid, queue, problem in report.examples:
        lines.append(f"  UNACCOUNTED {queue} {mid}: {problem}")
    if report.unaccounted > len(report.examples):
        lines.append(f"  ... and {report.unaccounted - len(report.examples)} more (see the Parquet table)")
    lines.append(f"per message: {report.parquet}")
    lines.append(f"plot: {report.plot}")
    return lines
