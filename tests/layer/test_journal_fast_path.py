"""A journaled enqueue on the plain enqueue's short way (``moves.write_plain_journaled``) and
the journal's leaner entry (``journaling.record``): the rows are those the general way writes,
and every shortcut it leans on (the settings cached per queue, the values a commit keeps)
still sees a journal turned on or off, a pause, a failed commit and a retry."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fdbqueue
from fdbqueue import Queue, QueueStoppedError
from fdbqueue.engines.contract import Database
from fdbqueue.store.layout import DEFAULT_ROOT, QUEUE_SHARD, JournalKeys
from fdbqueue.testing import FaultScript


def _enqueues(db: object) -> list[fdbqueue.JournalEntry]:
    return [e for e in fdbqueue.journal(db, "jobs") if e.op == "enqueue"]  # type: ignore[arg-type]


def test_the_short_way_journals_what_the_long_way_journals(db: Database) -> None:
    """An entry of the short way (bytes, no options) and of the long way (headers: the general
    record and ``write_new``) differ only in their ids, times and versions; each value is
    byte for byte ``json.dumps`` of its fields, with one history pointer each."""
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    short = [q.enqueue(db, b"a"), q.enqueue(db, b"b", priority=3)]
    long = [q.enqueue(db, b"a", headers={"h": "1"}), q.enqueue(db, b"b", priority=3, headers={"h": "1"})]
    got = {e.message_id: e for e in _enqueues(db)}
    assert set(got) == {*short, *long}

    def fields(e: fdbqueue.JournalEntry) -> tuple[object, ...]:
        return (e.op, e.queue, e.principal, e.deliveries, e.reason, e.details)

    assert [fields(got[i]) for i in short] == [fields(got[i]) for i in long]
    assert [got[i].details for i in short] == [{}, {"priority": 3}]
    jk = JournalKeys.make(DEFAULT_ROOT)
    tr = db.create_transaction()
    for i in short:
        e = got[i]
        shards = range(8) if getattr(db, "may_conflict", True) else [QUEUE_SHARD]  # (in the queue)
        raws = [tr.get(jk.entry_key("jobs", s, e.version)) for s in shards]
        (raw,) = [r for r in raws if r is not None]
        want = [1, "enqueue", i, e.principal, 0, None, e.details, round(e.at * 1e6)]
        assert json.loads(raw) == want
        assert raw == json.dumps(want, separators=(",", ":")).encode()
        assert [h.version for h in fdbqueue.history(tr, i)] == [e.version]
    tr.cancel()
    assert [m.payload for m in q.browse(db)] == [b"b", b"b", b"a", b"a"]


def test_several_journaled_enqueues_in_one_transaction_keep_their_order(db: Database) -> None:
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    tr = db.create_transaction()
    ids = [q.enqueue(tr, b"%d" % i) for i in range(3)]
    tr.commit()
    entries = _enqueues(db)
    assert [e.message_id for e in entries] == ids
    assert [e.version[10:] for e in entries] == [i.to_bytes(2, "big") for i in range(3)]
    assert len({e.version[:10] for e in entries}) == 1
    jk = JournalKeys.make(DEFAULT_ROOT)
    bell = jk.bell("jobs") if getattr(db, "may_conflict", True) else jk.queue_bell_of("jobs")  # (embedded)
    assert db[bell] == entries[0].version[:10]  # type: ignore[index]
    for i in ids:
        assert [e.message_id for e in fdbqueue.history(db, i)] == [i]


# Another process changes the queue's settings (journal on or off, or a pause).
_SETTINGS = r"""
import sys, fdbqueue
from fdbqueue.api.admin import create_queue, set_state
db = fdbqueue.open(sys.argv[1])
what = sys.argv[2]
if what == "pause":
    set_state(db, "jobs", enqueue=False)
else:
    create_queue(db, "jobs", journal=what == "on")
db.close()
"""


def _elsewhere(url: str, what: str) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _SETTINGS, url, what], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr


def test_a_journal_turned_on_and_off_by_another_process_is_seen_by_the_next_enqueue(tmp_path: Path) -> None:
    """The settings are cached per queue and the last commit's reads kept: another process's
    change of ``journal`` decides this handle's next enqueue, both ways."""
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "jobs")
    q = Queue("jobs")
    q.enqueue(db, b"unjournaled")
    q.enqueue(db, b"unjournaled too")  # settings cached, reads kept
    _elsewhere(url, "on")
    on = [q.enqueue(db, b"journaled"), q.enqueue(db, b"journaled too")]
    _elsewhere(url, "off")
    q.enqueue(db, b"unjournaled again")
    q.enqueue(db, b"and again")
    assert [e.message_id for e in _enqueues(db)] == on
    db.close()


def test_a_journal_turned_on_by_another_handle_is_seen_by_the_next_enqueue(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    db, other = fdbqueue.open(url), fdbqueue.open(url)
    q = Queue("jobs")
    q.enqueue(db, b"unjournaled")
    q.enqueue(db, b"unjournaled too")
    fdbqueue.create_queue(other, "jobs", journal=True)
    on = q.enqueue(db, b"journaled")
    fdbqueue.create_queue(other, "jobs", journal=False)
    q.enqueue(db, b"unjournaled again")
    assert [e.message_id for e in _enqueues(db)] == [on]
    other.close()
    db.close()


def test_a_journaled_queue_paused_by_another_process_refuses_and_journals_nothing(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    first = [q.enqueue(db, b"1"), q.enqueue(db, b"2")]
    _elsewhere(url, "pause")
    with pytest.raises(QueueStoppedError):
        q.enqueue(db, b"refused")
    assert [e.message_id for e in _enqueues(db)] == first
    assert q.size(db) == 2
    db.close()


@pytest.mark.parametrize("fault", [1020, 1007, ("1021", False), ("1021", True)])
def test_a_failed_or_unknown_commit_leaves_one_entry_after_the_retry(fault: object) -> None:
    """A journaled enqueue whose commit fails (a conflict, too old, an unknown result that did
    or did not land) and is retried: one message, one entry, one history pointer."""
    db = fdbqueue.open("sim://?seed=5&faults=0")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    q.enqueue(db, b"before")
    script = FaultScript(db)
    script.arm([fault])
    mid = q.enqueue(db, b"retried")
    q.enqueue(db, b"after")
    entries = _enqueues(db)
    assert [e.message_id for e in entries].count(mid) == 1 and len(entries) == 3
    assert [e.op for e in fdbqueue.history(db, mid)] == ["enqueue"]
    assert q.size(db) == 3


def test_a_cancelled_journaled_enqueue_leaves_nothing_for_the_next(tmp_path: Path) -> None:
    """A transaction that enqueued and was cancelled: no entry, and the next enqueue of the
    same handle (which may take what the last commit kept) writes one."""
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    fdbqueue.create_queue(db, "jobs", journal=True)
    q = Queue("jobs")
    q.enqueue(db, b"1")
    tr = db.create_transaction()
    q.enqueue(tr, b"never")
    tr.cancel()
    last = q.enqueue(db, b"2")
    entries = _enqueues(db)
    assert len(entries) == 2 and entries[-1].message_id == last
    assert [m.payload for m in q.browse(db)] == [b"1", b"2"]
    assert q.size(db) == 2
    db.close()
