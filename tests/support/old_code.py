"""Run an earlier commit's code in a process of its own, to make a store as that version left it
(a keyspace or format change must read what an earlier version wrote).

The package is taken out of this checkout's history with ``git archive``; where git or the
commit is missing (a shallow clone, an export) the test is skipped with that reason.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def old_tree(dest: Path, commit: str) -> Path:
    """The package as ``commit`` had it, under ``dest / "old"`` (made once per ``dest``)."""
    git = shutil.which("git")
    found = git is not None and (
        subprocess.run(
            [git, "-C", str(REPO), "cat-file", "-e", f"{commit}^{{commit}}"], capture_output=True
        ).returncode
        == 0
    )
    if not found or git is None:
        pytest.skip(
            f"git and commit {commit} of this checkout's history are needed to take out the older code"
        )
    old = dest / "old"
    if not (old / "fdbqueue").is_dir():
        archive = dest / "old.tar"
        with archive.open("wb") as out:
            subprocess.run([git, "-C", str(REPO), "archive", commit, "fdbqueue"], stdout=out, check=True)
        with tarfile.open(archive) as tar:
            tar.extractall(old, filter="data")
    return old


def run_old(dest: Path, commit: str, script: str, *args: str, timeout: float = 120) -> str:
    """Run ``script`` (Python source) with ``args`` on ``commit``'s package in a process of its
    own; its standard output. Fails the test, with its standard error, when it fails."""
    old = old_tree(dest, commit)
    env = {"PYTHONPATH": str(old), "PATH": "/usr/bin:/bin", "PYTHONHASHSEED": "0"}
    out = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=old,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


#: ``run_old``'s script for a journaled queue's work as an earlier version did it: four arrivals,
#: a dequeue, a lease and its ack on queue "jobs" of the store at ``argv[1]``; prints the ids
#: and the journal's operations as JSON.
JOURNALED_WORK = r"""
import json, sys, fdbqueue
from fdbqueue import Queue
db = fdbqueue.open(sys.argv[1])
fdbqueue.create_queue(db, "jobs", journal=True, retry_delay=0.0)
q = Queue("jobs")
ids = q.enqueue_many(db, [b"a", b"b", b"c", b"d"])
q.dequeue(db)
m = q.lease(db, 30)
q.ack(db, m)
print(json.dumps({"ids": ids, "ops": [e.op for e in fdbqueue.journal(db, "jobs")]}))
db.close()
"""


def store_rows(db: Any, begin: bytes, end: bytes) -> dict[bytes, bytes]:
    """Every key and value of ``db`` in [``begin``, ``end``), read in one transaction."""
    tr = db.create_transaction()
    try:
        return {kv.key: kv.value for kv in tr.get_range(begin, end)}
    finally:
        tr.cancel()
