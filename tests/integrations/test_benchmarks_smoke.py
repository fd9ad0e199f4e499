"""Every benchmark in scripts/ (``bench_*.py``, and the instruction counters ``count_*.py``
whose commands issue 30's measures name) runs with ``--smoke`` (its smallest settings), exits 0 and prints
its figures: the ratio lines or tables a reader compares (no timed assertion: the figures of a
smoke run mean nothing). So that no benchmark breaks unseen between the performance passes.

The Spark benchmark starts a JVM (about a minute of CPU; marked ``slow``): it runs only where
pyspark and Java are installed, as tests/integrations/test_spark.py. The others take about 20 s
of CPU together.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"

# What each script must print: its ratio column or line (the figure a reader compares), or,
# for a script that prints rates only, the line or table of them.
EXPECTED = {
    "bench_aio.py": r"/ limit",
    "bench_cluster_model.py": r"delivered twice",
    "bench_cluster_sim.py": r"conflicts \(1020\) per message",
    "bench_contention.py": r"fdbqueue ÷ huey",
    "bench_depth.py": r"ratio vs depth 0",
    "bench_engine.py": r"raw sqlite3 commits/s.*ratio",
    "bench_fairness.py": r"every small queue served by message",
    "bench_fdb_model.py": r"round trips",
    "bench_forward.py": r"enqueue_many.*ratio",
    "bench_journal.py": r"without.*with.*ratio",
    "bench_metrics.py": r"scrape of \d+ queues: median",
    "bench_peers.py": r"Ratios are fdbqueue",
    "bench_pool.py": r"processes=2",
    "bench_rate_limit.py": r"runs",
    "bench_queue.py": r"raw sqlite3 msg/s.*ratio",
    "bench_settle.py": r"/ dequeue\(tr\)",
    "bench_spark.py": r"messages/s.*ratio",
    "bench_tasks.py": r"ratio|/ raw",
    "bench_web.py": r"ratios: ",
    "bench_workers.py": r"on / off",
    # Without callgrind in a smoke run: the statements and µs columns, SQLite alone, the steps.
    "count_instructions.py": (
        r"lease_ack .*worker64 .*dequeue_among .*enqueue_among .*lease_ack_among .*among_ping "
        r".*the commit: guards.* total"
    ),
    # Timed in-process in a smoke run (valgrind may be absent): every journal row, the forward line.
    "count_journal_forward.py": (
        r"enqueue plain .*dequeue plain .*lease_ack plain .*leased forwarder .*Worker.s message"
    ),
}


def test_every_benchmark_has_a_smoke_run() -> None:
    found = sorted(p.name for pattern in ("bench_*.py", "count_*.py") for p in SCRIPTS.glob(pattern))
    assert found == sorted(EXPECTED), "a benchmark without an entry here (or an entry without its script)"


SPARK = pytest.param("bench_spark.py", marks=pytest.mark.slow)


@pytest.mark.parametrize("script", [SPARK if s == "bench_spark.py" else s for s in sorted(EXPECTED)])
def test_smoke(script: str, tmp_path: Path) -> None:
    if script == "bench_spark.py" and not os.environ.get("FDBQUEUE_REQUIRE_SPARK"):
        pytest.importorskip("pyspark", reason="pyspark is not installed (pip install '.[spark]')")
        if shutil.which("java") is None:
            pytest.skip("Spark needs a Java runtime")
    env = dict(os.environ, TMPDIR=str(tmp_path), COLUMNS="200")
    # The checkout first on the path: the scripts import fdbqueue as the tests do.
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / script), "--smoke"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, f"{script} --smoke exited {done.returncode}:\n{done.stderr[-3000:]}"
    out = re.sub(r"\s+", " ", done.stdout)  # a rich table may wrap a header over lines
    assert re.search(EXPECTED[script], out), f"{script} --smoke printed no figures:\n{done.stdout[-3000:]}"


def test_bench_journal_counts_pages(tmp_path: Path) -> None:
    """``bench_journal.py --pages``: the WAL pages an operation on either side, in its rounds."""
    env = dict(os.environ, TMPDIR=str(tmp_path), COLUMNS="200")
    env["PYTHONPATH"] = os.pathsep.join([str(SCRIPTS.parent), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    done = subprocess.run(
        [sys.executable, str(SCRIPTS / "bench_journal.py"), "--smoke", "--pages", "--markdown"],
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (enqueue|dequeue|lease \+ ack) \| ([\d.]+) \| ([\d.]+) \| \+", done.stdout, re.M)
    assert [r[0] for r in rows] == ["enqueue", "dequeue", "lease + ack"], done.stdout
    assert all(0 < float(plain) < float(journaled) for _, plain, journaled in rows), done.stdout


def test_bench_journal_puts_the_feature_on_either_side_of_its_neighbour(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``bench_journal.measure`` runs each table in two stores, the queue with the feature sorting
    after the plain one in the first and before it in the second: which of two queues sorts first
    moved their rates by itself (1.09 / 0.87 with the same settings on both), which the tables
    measured as the feature's cost before (issue 30's ninth pass)."""
    monkeypatch.syspath_prepend(str(SCRIPTS))  # (the script imports benchlib beside it)
    import fdbqueue
    from fdbqueue.api.admin import queue_config
    from scripts.bench_journal import measure

    urls = (f"sqlite:///{tmp_path / 'a.db'}?sync=normal", f"sqlite:///{tmp_path / 'b.db'}?sync=normal")
    rows = measure(urls, 2, 2, {"journal": True}, 0.85)
    assert [row[0] for row in rows] == ["enqueue", "dequeue", "lease + ack"]
    places = []
    for url in urls:
        db = fdbqueue.open(url)
        names = sorted(fdbqueue.list_queues(db))
        assert len(names) == 2
        places.append([queue_config(db, name).journal for name in names])
        db.close()
    assert places == [[False, True], [True, False]]
