"""Input and output helpers for the ``fdbqueue`` command (:mod:`fdbqueue.cli`).

Output: tables and key/value listings, JSON, ages and timestamps, message rendering. With rich
installed (the ``cli`` extra) tables are boxed and long enqueues show a progress bar; without it
the same figures print as plain aligned columns, so ``pip install fdbqueue`` gives a working command.
Input: argparse number types, ``--header`` pairs, payloads from arguments or stdin, the
enqueue progress bar and its batches. Figures: queue stats as a dequeue would find them.
:class:`CommandError` lives here because the parsers raise it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime
import functools
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import fdbqueue
from fdbqueue.store.budget import TXN_BUDGET_BYTES
from fdbqueue.store.record import json_safe

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table

PROGRESS_OVER = 1000  # show a progress bar (auto) when enqueueing more lines than this
BATCH = 500  # at most this many messages per enqueue_many transaction when reading stdin
BATCH_BYTES = TXN_BUDGET_BYTES // 2  # and about this many bytes (docs/budgets.md)


# Conditions of the store or the queue, not mistakes in the command: exit 1. Every other
# QueueError is the library refusing an argument (a bad name, number or URL): exit 2.
RUNTIME_ERRORS: tuple[type[Exception], ...] = (
    fdbqueue.QueueNotFoundError,
    fdbqueue.AccessDeniedError,
    fdbqueue.ForeignQueueError,
    fdbqueue.QueueStoppedError,
    fdbqueue.QueueFullError,
    fdbqueue.EngineError,
    fdbqueue.ClusterUnavailableError,
    fdbqueue.StoreError,
    fdbqueue.UnsupportedLayerFormatError,
    fdbqueue.LeaseError,
    fdbqueue.NotJournaledError,
    fdbqueue.NotAnErrorQueueError,
)


class CommandError(Exception):
    """A one-line error for the user, with the exit code to end on."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


# -- output helpers --------------------------------------------------------------------------------


@functools.cache
def have_rich() -> bool:
    """Whether rich (the ``cli`` extra) is installed: boxed tables and progress bars."""
    try:
        import rich.console  # noqa: F401
    except ImportError:
        return False
    return True


class PlainTable:
    """A table without rich: columns padded to their widest cell, a dashed rule under the header."""

    def __init__(self, title: str | None = None, show_header: bool = True) -> None:
        self.title = title
        self.show_header = show_header
        self.columns: list[str] = []
        self.right: list[bool] = []
        self.rows: list[list[str]] = []
        self.clip: dict[int, int] = {}  # column -> most characters shown

    @property
    def row_count(self) -> int:
        return len(self.rows)

    def add_column(self, name: str, justify: str = "left") -> None:
        self.columns.append(name)
        self.right.append(justify == "right")

    def add_row(self, *cells: object) -> None:
        row = [str(c) for c in cells]
        for i, most in self.clip.items():
            if len(row[i]) > most:
                row[i] = row[i][: most - 1] + "\u2026"
        self.rows.append(row)

    def lines(self) -> list[str]:
        rows = ([self.columns] if self.show_header else []) + self.rows
        widths = [max((len(r[i]) for r in rows), default=0) for i in range(len(self.columns))]

        def line(cells: Sequence[str]) -> str:
            return "  ".join(
                c.rjust(w) if right else c.ljust(w)
                for c, w, right in zip(cells, widths, self.right, strict=False)
            ).rstrip()

        out = [self.title] if self.title else []
        if self.show_header:
            out += [line(self.columns), line(["-" * w for w in widths])]
        return out + [line(r) for r in self.rows]


def _console(stderr: bool = False) -> Console:
    from rich.console import Console

    stream = sys.stderr if stderr else sys.stdout
    # Piped output is not cut at 80 columns: tables take the width their content needs.
    width = None if stream.isatty() else 512
    return Console(file=stream, width=width, highlight=False, markup=False, emoji=False)


def _table(*columns: str) -> Table | PlainTable:
    if not have_rich():
        table: Table | PlainTable = PlainTable()
    else:
        from rich.table import Table

        table = Table()
    for col in columns:
        numeric = col in ("ready", "in flight", "delayed", "errors", "priority", "deliveries")
        if isinstance(table, PlainTable):
            table.add_column(col, justify="right" if numeric else "left")
        else:
            table.add_column(col, justify="right" if numeric else "left", no_wrap=col == "id")
    return table


def _clip(table: Table | PlainTable, column: int, most: int) -> None:
    """Column ``column`` on one line, cut with an ellipsis past ``most`` characters."""
    if isinstance(table, PlainTable):
        table.clip[column] = most
        return
    col = table.columns[column]
    col.max_width, col.no_wrap, col.overflow = most, True, "ellipsis"


def _cells(*values: object) -> list[Any]:
    if not have_rich():
        return ["-" if v is None else str(v) for v in values]
    from rich.text import Text

    return [Text("-" if v is None else str(v)) for v in values]  # Text: no markup parsing


def _print_pairs(rows: Sequence[tuple[str, object]], title: str | None = None) -> None:
    if not have_rich():
        plain = PlainTable(title=title, show_header=False)
        plain.add_column("field")
        plain.add_column("value")
        for k, v in rows:
            plain.add_row(*_cells(k, v))
        _render(plain)
        return
    from rich.table import Table

    table = Table(title=title, title_justify="left", show_header=False, box=None, pad_edge=False)
    table.add_column("field")
    table.add_column("value")
    for k, v in rows:
        table.add_row(*_cells(k, v))
    _render(table)


def _render(table: Table | PlainTable) -> None:
    if isinstance(table, PlainTable):
        print("\n".join(table.lines()))
        return
    console = _console()
    with console.capture() as captured:
        console.print(table)
    print("\n".join(line.rstrip() for line in captured.get().splitlines()))


def _print_json(value: Any) -> None:
    # Strict JSON whatever a store holds: a NaN header of an older version would print NaN,
    # which jq and JSON.parse refuse (json_safe: "NaN", and lone surrogates escaped).
    print(json.dumps(json_safe(value), indent=None, sort_keys=False, default=str, allow_nan=False))


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    return f"{seconds / 3600:.1f} h"


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    at = datetime.datetime.fromtimestamp(ts).isoformat(sep=" ", timespec="seconds")
    delta = time.time() - ts
    return f"{at} ({_age(abs(delta))} {'ago' if delta >= 0 else 'from now'})"


def _payload_text(m: fdbqueue.Message) -> str:
    try:
        return m.payload.decode("utf-8")
    except UnicodeDecodeError:
        return f"<binary, {len(m.payload)} bytes> base64:{base64.b64encode(m.payload).decode()}"


def _message_json(m: fdbqueue.Message) -> dict[str, Any]:
    fields = ("id", "queue", "priority", "deliveries", "enqueued_at", "expires_at", "lease_deadline")
    out: dict[str, Any] = {f: getattr(m, f) for f in fields}
    out.update(headers=dict(m.headers), content_type=m.content_type.name.lower())
    if m.reason is not None:
        out.update(reason=m.reason, origin=m.origin)
    try:
        if m.content_type is fdbqueue.ContentType.JSON:
            out.update(payload=m.json(), payload_encoding="json")
        else:
            out.update(payload=m.payload.decode("utf-8"), payload_encoding="text")
    except (UnicodeDecodeError, ValueError):
        out.update(payload=base64.b64encode(m.payload).decode(), payload_encoding="base64")
    return out


def _print_message(m: fdbqueue.Message, args: argparse.Namespace) -> None:
    if getattr(args, "json", False):
        _print_json(_message_json(m))
        return
    if getattr(args, "payload_only", False):
        sys.stdout.flush()
        sys.stdout.buffer.write(m.payload)
        sys.stdout.buffer.flush()
        return
    rows = [("id", m.id), ("priority", m.priority), ("deliveries", m.deliveries)]
    rows += [
        ("enqueued", _when(m.enqueued_at)),
        ("headers", json.dumps(dict(m.headers)) if m.headers else "-"),
    ]
    if m.expires_at is not None:
        rows.append(("expires", _when(m.expires_at)))
    if m.lease_deadline is not None:
        rows.append(("leased until", _when(m.lease_deadline)))
    if m.reason is not None:
        rows.append(("reason", f"{m.reason} (from {m.origin})"))
    for k, v in [*rows, ("payload", _payload_text(m))]:
        print(f"{k:<12} {v}")  # plain lines, not a table: a long payload is neither cut nor wrapped


# -- input: argument types, headers, payloads ------------------------------------------------------


def _parser(kind: type, low: float | None, what: str, none: bool = False) -> Callable[[str], Any]:
    """An argparse type: ``kind`` (int or float), finite, >= ``low``; ``none`` also takes "none"."""

    def parse(text: str) -> Any:
        if none and text.lower() == "none":
            return None
        try:
            value = kind(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or (low is not None and value < low):
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        return value

    return parse


def _ttl(none: bool) -> Callable[[str], Any]:
    """``--ttl``: seconds > 0; ``create`` also takes "none" (no expiry), ``enqueue`` omits it."""
    hint = "--ttl none for no expiry" if none else "omit --ttl for no expiry"
    number = _parser(float, 0, f"seconds > 0 ({hint})", none=none)

    def parse(text: str) -> Any:
        value = number(text)
        if value is not None and value <= 0:
            raise argparse.ArgumentTypeError(f"expected seconds > 0 ({hint}), got {text!r}")
        return value

    return parse


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose usage errors are one line: ``prog: error: ... (see prog --help)``."""

    def error(self, message: str) -> Any:  # NoReturn in argparse
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help')\n")


_int = _parser(int, None, "a whole number")
_positive = _parser(int, 1, "a whole number >= 1")
_count = _parser(int, 0, "a whole number >= 0")
_seconds = _parser(float, 0, "a number of seconds >= 0")
_number = _parser(float, None, "a number")


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # json.loads takes NaN and Infinity; JSON does not


def _headers(pairs: Sequence[str] | None) -> dict[str, Any] | None:
    """``k=v`` gives the string v; ``k:=v`` parses v as JSON (a number, true, null ...)."""
    if not pairs:
        return None
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key or key == ":":
            raise CommandError(f"bad header {pair!r}: expected name=value (or name:=json)")
        if key.endswith(":"):
            key = key[:-1]
            try:
                out[key] = json.loads(value, parse_constant=_not_json)
            except ValueError:
                raise CommandError(f"bad header {pair!r}: {value!r} is not JSON") from None
        else:
            out[key] = value
    return out


def _read_stdin(args: argparse.Namespace) -> list[tuple[int, object]]:
    """(line number, payload) for every non-blank line of stdin; all parsed before any is written."""
    if sys.stdin.isatty():
        print("reading messages from stdin, one per line (end with Ctrl-D)", file=sys.stderr)
    data = sys.stdin.buffer.read()
    if args.raw:
        return [(0, data)]  # 0: not a line, all of stdin (see _where)
    out: list[tuple[int, object]] = []
    for n, raw in enumerate(data.split(b"\n"), start=1):
        raw = raw.removesuffix(b"\r")
        if not raw.strip():
            continue
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise CommandError(f"line {n}: not UTF-8 text (use --raw for a binary message)") from None
        out.append((n, _parse_payload(text, f"line {n}", args.json)))
    return out


def _where(what: str, n: int) -> str:
    """How an error names an input: "line 7", "argument 2", or all of stdin with --raw."""
    return "stdin (--raw)" if n == 0 else f"{what} {n}"


def _parse_payload(text: str, where: str, as_json: bool) -> object:
    if not as_json:
        return text
    try:
        value = json.loads(text)
        json.dumps(value, allow_nan=False)  # NaN / Infinity parse, but are no JSON payload
    except json.JSONDecodeError as exc:
        raise CommandError(f"{where}: invalid JSON: {exc.msg} (column {exc.colno})") from None
    except ValueError as exc:
        raise CommandError(f"{where}: invalid JSON: {exc}") from None
    return value


def _encoded_size(payload: object) -> int:
    if isinstance(payload, bytes):
        return len(payload)
    if isinstance(payload, str):
        return len(payload.encode("utf-8"))
    return len(json.dumps(payload, separators=(",", ":"), allow_nan=False).encode())


@contextlib.contextmanager
def _progress(total: int, show: bool | None) -> Iterator[Callable[[int], None]]:
    if show is None:
        show = total > PROGRESS_OVER and sys.stderr.isatty()
    if not show or not have_rich():
        yield lambda n: None
        return
    from rich.progress import Progress

    with Progress(console=_console(stderr=True), transient=True) as bar:
        task = bar.add_task("enqueueing", total=total)
        yield lambda n: bar.advance(task, n)


# -- figures, enqueue batches, the worker's summary, URLs ----------------------------------------


def _stats_now(db: fdbqueue.Database, name: str, interval: float = 0.0) -> fdbqueue.QueueStats:
    """A queue's figures as every view counts them now, by database time (queue_stats)."""
    if interval > 0:
        return fdbqueue.queue_rates(db, name, interval=interval)
    return fdbqueue.queue_stats(db, name)


def _batches(
    db: fdbqueue.Database,
    q: fdbqueue.Queue,
    cfg: fdbqueue.QueueConfig | None,
    payloads: list[object],
    headers: int,
) -> Iterator[list[object]]:
    """The payloads in batches of one transaction each, within ``TXN_BUDGET_BYTES``.

    A bounded queue gets batches of at most the room it has (read before each batch), so
    that what fits is enqueued; with no room, one message, which the queue refuses or
    (``overflow="block"``) waits for room to take.
    """
    pos = 0
    while pos < len(payloads):
        n, cost = 0, 0
        while pos + n < len(payloads) and n < BATCH:
            # An upper bound of a message's cost (fdbqueue/store/budget.py): its payload, its
            # headers, and the keys and record fields around it.
            more = _encoded_size(payloads[pos + n]) + 2 * headers + 600
            if n and cost + more > BATCH_BYTES:
                break
            n, cost = n + 1, cost + more
        if cfg is not None and cfg.max_size is not None:
            st = fdbqueue.queue_stats(db, q.name)
            n = max(1, min(n, cfg.max_size - (st.ready + st.inflight + st.delayed)))
        yield payloads[pos : pos + n]
        pos += n


def _enqueue_batch(
    db: fdbqueue.Database, q: fdbqueue.Queue, batch: list[object], timeout: float | None, opts: dict[str, Any]
) -> list[str]:
    if len(batch) == 1:
        return [q.enqueue(db, batch[0], timeout=timeout, **opts)]
    return q.enqueue_many(db, batch, timeout=timeout, **opts)


def _worker_summary(stats: object, values: dict[str, Any]) -> str:
    """One line for people: the stats' own ``summary()`` when they have one."""
    summary = getattr(stats, "summary", None)
    if callable(summary):
        return str(summary())
    parts = [f"processed {values.get('processed', 0)}", f"failed {values.get('failed', 0)}"]
    parts += [f"{k} {values[k]}" for k in ("released", "swept") if values.get(k)]
    per_queue = values.get("per_queue") or {}
    if len(per_queue) > 1:
        parts.append("per queue " + ", ".join(f"{k} {v}" for k, v in per_queue.items()))
    rates = [values.get("ingress_rate") or 0.0, values.get("egress_rate") or 0.0]
    parts.append(f"in {rates[0]:.3g}/s, out {rates[1]:.3g}/s")
    return "; ".join(parts)


def _check_url(url: str | None) -> None:
    """A URL naming a directory is a usage error (exit 2), not a store failure."""
    if url and url.startswith("sqlite://"):
        path = url[len("sqlite://") :].partition("?")[0]
        if path and os.path.isdir(os.path.expanduser(path)):
            raise CommandError(f"{url!r} names a directory, not a store file: add a file name (q.db)")


class JsonLogFormatter(logging.Formatter):
    """One JSON object a line (``--log-format json``): time, level, logger, message, the
    structured fields a worker attaches (queue, message_id, deliveries) and a traceback."""

    FIELDS = ("queue", "message_id", "deliveries")

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S%z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in self.FIELDS:
            if hasattr(record, name):
                out[name] = getattr(record, name)
        if record.exc_info:
            out["traceback"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def setup_logging(level: str, fmt: str) -> None:
    """The worker's logging: ``level`` (DEBUG ... ERROR) in ``fmt`` (text or json) on stderr."""
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
