"""What every benchmark script reports about the machine it ran on."""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import sqlite3
import sys
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

_console = Console(width=None if sys.stdout.isatty() else 200)


def parse_args(
    ap: argparse.ArgumentParser, argv: list[str] | None = None, **smoke: Any
) -> argparse.Namespace:
    """``ap.parse_args(argv)`` with ``--smoke``: the script's smallest settings (``smoke``,
    by argument name), which the CI's smoke run uses to check that the script still runs and
    prints its figures (tests/integrations/test_benchmarks_smoke.py); the figures of such a
    run mean nothing."""
    shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in smoke.items())
    ap.add_argument("--smoke", action="store_true", help=f"the smallest run, for CI ({shown or 'as given'})")
    args = ap.parse_args(argv)
    if args.smoke:
        for name, value in smoke.items():
            setattr(args, name, value)
    return args


def cpu_model() -> str:
    """The CPU's model name from /proc/cpuinfo ('unknown' elsewhere)."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return "unknown"


def nproc() -> int:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 0  # pragma: no cover - not Linux


def loadavg() -> list[float] | None:
    return [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None


def machine(**more: Any) -> dict[str, Any]:
    """CPUs, CPU model, Python, SQLite and platform, plus whatever the script adds."""
    return {
        "nproc": nproc(),
        "cpu": cpu_model(),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        **more,
    }


def filesystem_of(path: str) -> str:
    """'ext4 on /dev/vda' for the mount holding ``path`` (Linux), else ''."""
    best, found = "", ""
    real = os.path.realpath(path)
    with contextlib.suppress(OSError), open("/proc/mounts") as f:
        for line in f:
            dev, mnt, fstype = line.split()[:3]
            if (real == mnt or real.startswith(mnt.rstrip("/") + "/")) and len(mnt) >= len(best):
                best, found = mnt, f"{fstype} on {dev}"
    return found


def show_table(title: str, headers: list[str], cells: list[list[str]], *, markdown: bool) -> None:
    """A table of formatted cells: Markdown, or a rich table on the terminal.

    Columns whose every cell is a number (or "-") are right-aligned, the others left.
    """
    numeric = [i > 0 and all(_numeric(row[i]) for row in cells) for i in range(len(headers))]
    if markdown:
        print(f"\n**{title}**\n")
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---:" if num else "---" for num in numeric) + "|")
        for row in cells:
            print("| " + " | ".join(row) + " |")
        return
    table = Table(title=escape(title), title_justify="left")
    for h, num in zip(headers, numeric, strict=True):
        table.add_column(escape(h), justify="right" if num else "left")
    for row in cells:
        table.add_row(*(escape(c) for c in row))
    _console.print(table)


def _numeric(cell: str) -> bool:
    return cell == "-" or (bool(cell) and all(c.isdigit() or c in ",.-/%" for c in cell))
