"""The ``fdbqueue`` command: every subcommand in-process, the entry points as real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import pytest

import fdbqueue
from fdbqueue.cli import main
from tests.support import ROOT

BIN = Path(sys.executable).parent
Run = Callable[..., tuple[int, str, str]]


def one_line_error(err: str, *fragments: str) -> None:
    assert err.startswith("fdbqueue: error: "), err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    for f in fragments:
        assert f in err, (f, err)


# -- queue management --------------------------------------------------------------------------


def test_help_documents_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert "exit codes" in out and "runtime failure" in out and "usage or bad input" in out
    for cmd in ["create", "delete", "list", "stats", "enqueue", "dequeue", "peek", "browse", "get"]:
        assert cmd in out
    assert main(["worker", "--help"]) == 0
    assert "MODULE:FUNCTION" in capsys.readouterr().out


def test_create_update_and_json(run: Run, db: fdbqueue.Database) -> None:
    code, out, _ = run(
        "create",
        "jobs",
        "--max-size",
        "10",
        "--overflow",
        "block",
        "--retry-delay",
        "0.5",
        "--ttl",
        "60",
        "--strict-order",
        "--error-queue",
        "dead",
        "--max-payload",
        "4096",
    )
    assert code == 0 and "created" in out and "max_size" in out
    cfg = fdbqueue.queue_config(db, "jobs")
    assert (cfg.max_size, cfg.overflow, cfg.retry_delay, cfg.ttl) == (10, "block", 0.5, 60.0)
    assert cfg.strict_order and cfg.error_queue == "dead" and cfg.max_payload == 4096
    # An update changes only what it names; "none" clears a limit.
    code, out, _ = run("create", "jobs", "--max-size", "none", "--no-strict-order", "--json")
    settings = json.loads(out)
    assert code == 0 and settings["name"] == "jobs" and settings["max_size"] is None
    assert settings["strict_order"] is False and settings["ttl"] == 60.0 and settings["overflow"] == "block"


def test_create_rejects_bad_settings(run: Run) -> None:
    for argv in (
        ["--max-size", "0"],
        ["--max-size", "ten"],
        ["--retry-delay", "-1"],
        ["--ttl", "nan"],
        ["--overflow", "drop"],
    ):
        code, _, err = run("create", "jobs", *argv)
        assert code == 2 and err.startswith("fdbqueue create: error: ") and err.count("\n") == 1, (argv, err)
        assert "see 'fdbqueue create --help'" in err
    code, _, err = run("create", "jobs", "--max-payload", "99999999999")  # past what one transaction takes
    assert code == 2
    one_line_error(err, "max_payload", "6291456")  # 6 MiB: what one transaction can move
    code, _, err = run("create", "jobs", "--retry-backoff", "0")  # refused by QueueConfig itself
    assert code == 2
    one_line_error(err, "retry_backoff")
    code, _, err = run("create", "")
    assert code == 2
    one_line_error(err, "queue name")


def test_list_stats_delete(run: Run, db: fdbqueue.Database) -> None:
    assert run("list") == (0, "no queues\n", "")
    assert run("list", "--json")[1] == "[]\n"
    fdbqueue.Queue("a").enqueue_many(db, ["x", "y"])
    fdbqueue.Queue("b").enqueue(db, "z", delay=60)
    fdbqueue.stop_queue(db, "b")
    code, out, _ = run("list")
    assert code == 0
    lines = [line for line in out.splitlines() if " a " in line or " b " in line]
    assert len(lines) == 2 and "running" in lines[0] and "paused" in lines[1]
    rows = {r["name"]: r for r in json.loads(run("list", "--json")[1])}
    assert (rows["a"]["ready"], rows["b"]["delayed"], rows["b"]["state"]) == (2, 1, "paused")

    code, out, _ = run("stats", "a")
    assert code == 0 and "ready (depth)" in out and "oldest age" in out and "rate" not in out
    code, out, _ = run("stats", "a", "--json", "--interval", "0.05")
    st = json.loads(out)
    assert st["ready"] == 2 and st["done_rate"] == 0.0 and st["oldest_age"] >= 0
    code, out, _ = run("stats", "a", "--interval", "0.05")
    assert "done rate" in out and out.count("msg/s") >= 2

    code, _, err = run("delete", "a")
    assert code == 2
    one_line_error(err, "holds 2 message", "--yes")
    assert run("delete", "a", "--yes")[0] == 0
    fdbqueue.create_queue(db, "empty")
    code, out, _ = run("delete", "empty")
    assert code == 0 and "deleted queue 'empty'" in out
    assert fdbqueue.list_queues(db) == ["b"]


@pytest.mark.parametrize(
    "command",
    [
        ["stats"],
        ["delete", "--yes"],
        ["purge", "--yes"],
        ["pause"],
        ["resume"],
        ["sweep"],
        ["peek"],
        ["dequeue"],
        ["browse"],
        ["get", "x"],
    ],
)
def test_unknown_queue_is_exit_1(run: Run, command: list[str]) -> None:
    code, out, err = run(command[0], "nope", *command[1:])
    assert code == 1 and out == ""
    one_line_error(err, "no queue named 'nope'")


# -- enqueue -----------------------------------------------------------------------------------


def test_enqueue_arguments_headers_and_options(run: Run, db: fdbqueue.Database) -> None:
    code, out, _ = run(
        "enqueue",
        "jobs",
        "one",
        "two",
        "--priority",
        "3",
        "--header",
        "k=v",
        "--header",
        "n:=5",
        "--header",
        "flag:=true",
        "--ttl",
        "60",
    )
    ids = out.split()
    assert code == 0 and len(ids) == 2
    m = fdbqueue.Queue("jobs").get(db, ids[0])
    assert m is not None and m.text() == "one" and m.priority == 3
    assert dict(m.headers) == {"k": "v", "n": 5, "flag": True} and m.expires_at is not None
    code, out, _ = run("enqueue", "jobs", "x", "--priority", "-1", "y", "--header", "k=v", "z")
    assert code == 0 and len(out.split()) == 3  # PAYLOADs between options are all taken
    assert run("enqueue", "jobs", "x", "--bogus", "y")[0] == 2
    code, out, _ = run("enqueue", "jobs", '{"a": [1, 2]}', "--json", "--delay", "30")
    later = fdbqueue.Queue("jobs").get(db, out.strip())
    assert later is not None and later.json() == {"a": [1, 2]}
    assert fdbqueue.queue_stats(db, "jobs").delayed == 1
    first = run("enqueue", "jobs", "once", "--dedup-key", "k1")[1]
    assert run("enqueue", "jobs", "again", "--dedup-key", "k1")[1] == first
    code, _, err = run("enqueue", "jobs", "a", "b", "--dedup-key", "k2")
    assert code == 2
    one_line_error(err, "single message")


def test_enqueue_stdin_lines_batches_and_progress(run: Run, db: fdbqueue.Database) -> None:
    lines = b"".join(b"line %d\r\n" % i for i in range(1200)) + b"\n   \n"
    code, out, _err = run("enqueue", "bulk", "--quiet", "--progress", stdin=lines)
    assert (code, out) == (0, "1200\n")
    got = [m.text() for m in fdbqueue.Queue("bulk").browse(db)]
    assert got == [f"line {i}" for i in range(1200)]  # in order, blank lines skipped, CR stripped
    code, out, _ = run("enqueue", "bulk", "--json-lines", stdin=b'{"n": 1}\n\n[2]\n"three"\n')
    ids = out.split()
    assert code == 0 and len(ids) == 3
    got_back = [fdbqueue.Queue("bulk").get(db, i) for i in ids]
    assert [m.json() for m in got_back[:2] if m] == [{"n": 1}, [2]]
    # A JSON string becomes a text message: the API has no way to mark a str as JSON.
    assert got_back[2] is not None and got_back[2].content_type is fdbqueue.ContentType.TEXT


def test_enqueue_bad_input_writes_nothing(run: Run, db: fdbqueue.Database) -> None:
    good = b"".join(b'{"n": %d}\n' % i for i in range(700))
    code, out, err = run("enqueue", "jobs", "--json-lines", stdin=good + b"{broken\n" + good)
    assert code == 2 and out == ""
    one_line_error(err, "line 701", "invalid JSON")
    code, _, err = run("enqueue", "jobs", "--json-lines", stdin=b"1\nNaN\n")
    assert code == 2
    one_line_error(err, "line 2")
    code, _, err = run("enqueue", "jobs", "--json", "[1]", "{'single': 1}")
    assert code == 2
    one_line_error(err, "argument 2", "invalid JSON")
    code, _, err = run("enqueue", "jobs", stdin=b"ok\n\xff\xfe\n")
    assert code == 2
    one_line_error(err, "line 2", "UTF-8")
    code, _, err = run("enqueue", "jobs", stdin=b"\n\n")
    assert code == 2
    one_line_error(err, "nothing to enqueue")
    for header in ("novalue", "=v", "x:=nope"):
        code, _, err = run("enqueue", "jobs", "p", "--header", header)
        assert code == 2
        one_line_error(err, "bad header")
    assert run("enqueue", "jobs", "p", "--priority", "high")[0] == 2
    code, _, err = run("enqueue", "jobs", "p", "--priority", str(2**40))
    assert code == 2
    one_line_error(err, "priority")
    fdbqueue.create_queue(db, "small", max_payload=10)
    code, _, err = run("enqueue", "small", stdin=b"short\n" + b"x" * 11 + b"\n")
    assert code == 2
    one_line_error(err, "line 2", "max_payload of queue 'small' (10 bytes)", "nothing was enqueued")
    assert fdbqueue.list_queues(db) == ["small"] and fdbqueue.Queue("small").size(db) == 0


def test_enqueue_stopped_or_full_queue(run: Run, db: fdbqueue.Database) -> None:
    fdbqueue.create_queue(db, "capped", max_size=600)
    code, out, err = run("enqueue", "capped", stdin=b"".join(b"m%d\n" % i for i in range(1000)))
    assert code == 1 and len(out.split()) == 600  # what fits went in; its ids are printed
    one_line_error(err, "max_size 600", "enqueued 600 of 1000", "refused 400", "lines 601 to 1000")
    assert fdbqueue.queue_stats(db, "capped").ready == 600
    fdbqueue.set_state(db, "capped", enqueue=False)
    code, _, err = run("enqueue", "capped", "x")
    assert code == 1
    one_line_error(err, "enqueue is disabled")


@pytest.mark.parametrize(("lines", "max_size"), [(25, 10), (1200, 550)])
def test_enqueue_into_a_bounded_queue_takes_what_fits_and_says_so(
    run: Run, db: fdbqueue.Database, lines: int, max_size: int
) -> None:
    run("create", "b", "--max-size", str(max_size))
    code, out, err = run("enqueue", "b", "--quiet", stdin=b"".join(b"m%d\n" % i for i in range(lines)))
    assert (code, out) == (1, f"{max_size}\n")
    refused = lines - max_size
    one_line_error(err, f"enqueued {max_size} of {lines}", f"refused {refused}", f"lines {max_size + 1} to")
    assert fdbqueue.queue_stats(db, "b").ready == max_size
    code, out, err = run("enqueue", "b", "one more")
    assert code == 1 and out == ""
    one_line_error(err, f"is full ({max_size} of max_size {max_size} held); nothing was enqueued")
    assert "waited" not in err  # overflow "reject" does not wait


def test_enqueue_splits_large_input_within_the_transaction_budget(run: Run, db: fdbqueue.Database) -> None:
    line = b"x" * 4000 + b"\n"  # 400 lines: 1.6 MB, past one transaction's budget of 500 kB
    code, out, err = run("enqueue", "big", "--quiet", stdin=line * 400)
    assert (code, out, err) == (0, "400\n", "")
    assert fdbqueue.Queue("big").size(db) == 400


def _has_open(pid: int, path: str) -> bool:
    """Whether process ``pid`` has ``path`` open (Linux's /proc; elsewhere: after a second)."""
    fds = Path(f"/proc/{pid}/fd")
    if not fds.is_dir():
        time.sleep(1.0)
        return True
    for fd in fds.iterdir():
        try:
            if os.readlink(fd) == path:
                return True
        except OSError:  # closed meanwhile
            continue
    return False


def test_enqueue_blocks_without_timeout_and_is_interruptible(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    db = fdbqueue.open(url)
    fdbqueue.create_queue(db, "b", max_size=1, overflow="block")
    fdbqueue.Queue("b").enqueue(db, "a")
    db.close()
    cmd = [sys.executable, "-m", "fdbqueue", "--url", url, "enqueue", "b", "waits"]
    # Ctrl-C as at a terminal: a shell starts background jobs with SIGINT ignored, and an
    # ignored SIGINT is inherited (POSIX exec), which would leave the child deaf to this test.
    p = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        # Ctrl-C once the command runs (it has the store open), not while the interpreter is
        # still importing: a SIGINT there is Python's own KeyboardInterrupt traceback, before
        # the CLI's handler exists (seen on a loaded machine with a fixed wait).
        store = str(tmp_path / "q.db")
        deadline = time.monotonic() + 60
        while p.poll() is None and time.monotonic() < deadline and not _has_open(p.pid, store):
            time.sleep(0.05)
        time.sleep(0.5)
        assert p.poll() is None, p.communicate()  # still waiting for room
        p.send_signal(signal.SIGINT)
        out, err = p.communicate(timeout=10)
    finally:
        p.kill()
    assert p.returncode == 130 and out == b"", err
    db = fdbqueue.open(url)
    assert fdbqueue.Queue("b").size(db) == 1
    db.close()


def test_dequeue_with_timeout_on_a_paused_queue_says_it_is_paused(run: Run, db: fdbqueue.Database) -> None:
    fdbqueue.Queue("p").enqueue(db, "x")
    fdbqueue.set_state(db, "p", dequeue=False)
    for argv in (["dequeue", "p"], ["dequeue", "p", "--timeout", "0.2"]):
        code, _, err = run(*argv)
        assert code == 1, argv
        one_line_error(err, "dequeue is disabled")


def test_a_repeated_dedup_key_says_it_was_a_duplicate(run: Run, db: fdbqueue.Database) -> None:
    code, first, err = run("enqueue", "d", "once", "--dedup-key", "k1")
    assert code == 0 and err == ""
    code, again, err = run("enqueue", "d", "again", "--dedup-key", "k1")
    assert code == 0 and again == first  # the first message's id, as the API returns it
    assert "duplicate" in err and "k1" in err and "nothing was enqueued" in err, err
    assert fdbqueue.Queue("d").size(db) == 1


def test_binary_payload_and_message_output(run: Run, db: fdbqueue.Database) -> None:
    mid = run("enqueue", "bin", "--raw", stdin=b"\x00\xffbinary")[1].strip()
    code, out, _ = run("get", "bin", mid)
    assert code == 0 and f"id           {mid}" in out and "<binary, 8 bytes> base64:AP9iaW5hcnk=" in out
    doc = json.loads(run("peek", "bin", "--json")[1])
    assert (doc["payload"], doc["payload_encoding"], doc["content_type"]) == (
        "AP9iaW5hcnk=",
        "base64",
        "bytes",
    )
    assert run("enqueue", "bin", "x", "--raw")[0] == 2  # --raw reads stdin, takes no PAYLOAD


# -- reading messages --------------------------------------------------------------------------


def test_dequeue_peek_get_browse(run: Run, db: fdbqueue.Database) -> None:
    q = fdbqueue.Queue("jobs")
    low = q.enqueue(db, "low [b]markup[/b]", headers={"h": "1"})
    high = q.enqueue(db, {"n": 1}, priority=5)
    code, out, _ = run("browse", "jobs")
    assert code == 0 and out.index(high) < out.index(low) and "[b]markup[/b]" in out
    assert [json.loads(line)["id"] for line in run("browse", "jobs", "--json")[1].splitlines()] == [high, low]
    assert len(run("browse", "jobs", "--json", "--limit", "1")[1].splitlines()) == 1
    code, out, _ = run("peek", "jobs")
    assert (
        code == 0
        and f"id           {high}" in out
        and "deliveries   0" in out
        and 'payload      {"n":1}' in out
    )
    code, out, _ = run("get", "jobs", low)
    assert code == 0 and 'headers      {"h": "1"}' in out and "payload      low [b]markup[/b]" in out
    code, _, err = run("get", "jobs", "0" * 32)
    assert code == 1
    one_line_error(err, "no message")
    doc = json.loads(run("dequeue", "jobs", "--json")[1])
    assert doc["id"] == high and doc["payload"] == {"n": 1} and doc["payload_encoding"] == "json"
    assert doc["deliveries"] == 1 and doc["priority"] == 5
    assert run("dequeue", "jobs", "--payload-only")[:2] == (0, "low [b]markup[/b]")
    assert run("dequeue", "jobs") == (3, "", "queue 'jobs' has no message ready\n")
    assert run("dequeue", "jobs", "--json", "--timeout", "0.1")[:2] == (3, "null\n")
    assert run("peek", "jobs", "--json")[:2] == (3, "null\n")
    assert run("browse", "jobs")[:2] == (0, "queue 'jobs' has no message ready\n")


def test_sweep_purge_pause_resume(run: Run, db: fdbqueue.Database) -> None:
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, "later", delay=0.05)
    q.enqueue(db, "now")
    time.sleep(0.1)
    code, out, _ = run("sweep", "jobs", "--json")
    assert code == 0 and json.loads(out)["delayed"] == 1
    assert "leases" in run("sweep", "jobs")[1]
    assert run("pause", "jobs", "--dequeue")[1] == "queue 'jobs': enqueue running, dequeue paused\n"
    code, _, err = run("dequeue", "jobs")
    assert code == 1
    one_line_error(err, "dequeue is disabled")
    assert run("pause", "jobs")[1] == "queue 'jobs': enqueue paused, dequeue paused\n"
    assert run("resume", "jobs", "--enqueue")[1] == "queue 'jobs': enqueue running, dequeue paused\n"
    assert run("resume", "jobs")[1] == "queue 'jobs': enqueue running, dequeue running\n"
    code, _, err = run("purge", "jobs")
    assert code == 2
    one_line_error(err, "--yes")
    assert run("purge", "jobs", "--yes")[:2] == (0, "purged 2 message(s) from queue 'jobs'\n")
    assert fdbqueue.queue_stats(db, "jobs").ready == 0


# -- errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("bad_url", "fragment"),
    [
        ("bogus://x", "unknown engine"),
        ("sqlite://", "names no file"),
        ("nonsense", "malformed"),
        ("sqlite:///", "a directory"),
    ],
)
def test_bad_urls(bad_url: str, fragment: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--url", bad_url, "list"]) == 2
    one_line_error(capsys.readouterr().err, fragment)
    assert main(["stats", "jobs", "--url", bad_url]) == 2  # --url after the subcommand too
    one_line_error(capsys.readouterr().err, fragment)


def test_usage_errors_exit_2(run: Run) -> None:
    for argv in (
        ["frobnicate"],
        ["dequeue", "q", "--timeout", "soon"],
        ["browse", "q", "--limit", "-1"],
        ["stats"],
        ["worker", "q"],
        ["worker", "q", "--handler", "m:f", "--concurrency", "0"],
    ):
        code, out, err = run(*argv)
        assert code == 2 and out == "" and "Traceback" not in err, argv
        assert err.startswith("fdbqueue") and ": error: " in err and err.count("\n") == 1, (argv, err)


def test_a_ttl_of_zero_is_refused_in_cli_terms(run: Run) -> None:
    for argv in (["enqueue", "q", "x", "--ttl", "0"], ["create", "q", "--ttl", "0"]):
        code, _, err = run(*argv)
        assert code == 2 and "None" not in err and err.count("\n") == 1, err
    assert "omit --ttl for no expiry" in run("enqueue", "q", "x", "--ttl", "0")[2]
    assert "--ttl none for no expiry" in run("create", "q", "--ttl", "0")[2]


def test_raw_payload_errors_name_stdin(run: Run, db: fdbqueue.Database) -> None:
    fdbqueue.create_queue(db, "raw1", max_payload=10)
    code, _, err = run("enqueue", "raw1", "--raw", stdin=b"x" * 100)
    assert code == 2
    one_line_error(err, "stdin (--raw): payload of 100 bytes", "max_payload of queue 'raw1' (10 bytes)")
    assert "line 1" not in err and "''s" not in err


def test_worker_help_text() -> None:
    r = cli("worker", "--help")
    text = r.stdout.decode()
    assert r.returncode == 0
    for fragment in ("exactly-once", "f(tr, message)", "threads", "lease", "seconds a leased message"):
        assert fragment in text, fragment


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("no_colon", "module:function"),
        (":f", "module:function"),
        ("no_such_module_xyz:f", "cannot import handler module 'no_such_module_xyz'"),
        ("tests.support.cli_handlers:missing", "has no attribute 'missing'"),
        ("tests.support.cli_handlers:NOT_CALLABLE", "not callable"),
        ("tests.support.cli_broken_handler:f", "RuntimeError: this module is broken on purpose"),
    ],
)
def test_bad_handler_spec(run: Run, spec: str, fragment: str) -> None:
    code, out, err = run("worker", "jobs", "--handler", spec)
    assert code == 2 and out == ""
    one_line_error(err, fragment)


# -- worker and demo ---------------------------------------------------------------------------


def test_worker_in_process_until_empty(
    run: Run, db: fdbqueue.Database, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ids = [*fdbqueue.Queue("a").enqueue_many(db, [b"1", b"2", b"3"]), fdbqueue.Queue("b").enqueue(db, b"4")]
    code, out, _ = run(
        "worker",
        "a",
        "--handler",
        "tests.support.cli_handlers:in_transaction",
        "b",
        "--mode",
        "exactly-once",
        "--until-empty",
        "--json",
    )
    stats = json.loads(out)
    assert code == 0 and stats["processed"] == 4 and stats["per_queue"] == {"a": 3, "b": 1}
    assert all(db.get(b"cli_handlers/" + i.encode()) for i in ids)  # type: ignore[attr-defined]
    monkeypatch.setenv("CLI_HANDLER_LOG", str(tmp_path / "log"))
    fdbqueue.Queue("a").enqueue(db, "x")
    code, out, _ = run("worker", "a", "--handler", "tests.support.cli_handlers:record", "--max-messages", "1")
    assert code == 0 and "processed" in out and (tmp_path / "log").read_text().count("\n") == 1
    # One readable line: no raw floats or dicts.
    assert out.startswith("worker stopped: processed 1") and out.count("\n") == 1, out
    assert "{" not in out and "_rate" not in out and not re.search(r"\d\.\d{4,}", out), out


def test_demo(url: str) -> None:
    # A process of its own: a hang in the demo fails this test at the timeout, not the whole run.
    r = cli(
        "--url",
        url,
        "demo",
        "--messages",
        "20",
        "--producers",
        "1",
        "--workers",
        "1",
        "--no-spark",
        timeout=45,
    )
    assert r.returncode == 0, r.stderr.decode()
    assert b"OK: every message processed exactly once" in r.stdout and b"lost" in r.stdout


def test_demo_twice_on_one_store_passes_and_leaves_nothing(url: str, db: fdbqueue.Database) -> None:
    """An explicit --url: each run in queues of its own, removed at the end; the user's stay."""
    fdbqueue.Queue("mine").enqueue(db, "the user's message")
    before = db.get_range(b"", b"\xff")  # type: ignore[attr-defined]
    for _ in range(2):
        r = cli(
            "--url",
            url,
            "demo",
            "--messages",
            "20",
            "--producers",
            "1",
            "--workers",
            "1",
            "--no-spark",
            timeout=60,
        )
        assert r.returncode == 0, (r.stdout.decode(), r.stderr.decode())
        assert b"OK: every message processed exactly once" in r.stdout
    assert fdbqueue.list_queues(db) == ["mine"]
    assert db.get_range(b"", b"\xff") == before  # type: ignore[attr-defined]


def test_demo_never_uses_fdbqueue_url(tmp_path: Path) -> None:
    """$FDBQUEUE_URL names the user's store: the demo makes a temporary one and removes it."""
    store = tmp_path / "mine.db"
    env = {**os.environ, "FDBQUEUE_URL": f"sqlite://{store}", "TMPDIR": str(tmp_path)}
    r = cli(
        "demo", "--messages", "20", "--producers", "1", "--workers", "1", "--no-spark", env=env, timeout=60
    )
    assert r.returncode == 0, (r.stdout.decode(), r.stderr.decode())
    assert b"sync=full" in r.stdout and b"removed" in r.stdout
    assert not store.exists() and not list(tmp_path.glob("fdbqueue-demo-*"))  # its store is removed
    help_text = cli("demo", "--help").stdout.decode()
    assert "FDBQUEUE_URL" in help_text and "temporary" in help_text and "--keep" in help_text


def test_demo_result_shapes(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo's result is read defensively: an older shape without rows(), a failed run."""
    import fdbqueue.cli.demo

    old = SimpleNamespace(messages=10, processed_once=9, duplicates=0, missing=1, seconds=0.5, ok=False)
    seen: list[tuple[object, ...]] = []
    monkeypatch.setenv("FDBQUEUE_URL", "memory://")

    def fake_run_demo(*args: object, **kwargs: object) -> SimpleNamespace:
        seen.append((args, kwargs))
        return old

    monkeypatch.setattr(fdbqueue.cli.demo, "run_demo", fake_run_demo)
    assert main(["demo", "--messages", "10"]) == 1
    out = capsys.readouterr().out
    assert "processed exactly once  9" in out and "lost                    1" in out and "FAILED" in out
    # $FDBQUEUE_URL is the user's store, never the demo's: no URL, a temporary store.
    assert seen == [((None,), {"messages": 10, "producers": 2, "workers": 3, "keep": False, "spark": None})]


# -- real processes: the entry points ----------------------------------------------------------


def cli(
    *argv: str,
    env: dict[str, str] | None = None,
    script: bool = False,
    stdin: bytes = b"",
    timeout: float = 30,
) -> subprocess.CompletedProcess[bytes]:
    """Run ``python -m fdbqueue`` (or the ``fdbqueue`` console script) as a process of its own."""
    cmd = [str(BIN / "fdbqueue")] if script else [sys.executable, "-m", "fdbqueue"]
    return subprocess.run([*cmd, *argv], input=stdin, capture_output=True, cwd=ROOT, env=env, timeout=timeout)


def test_entry_points(tmp_path: Path) -> None:
    env = {**os.environ, "FDBQUEUE_URL": f"sqlite://{tmp_path / 'env.db'}"}
    r = cli("--version")
    assert r.returncode == 0 and b"fdbqueue" in r.stdout
    r = cli("enqueue", "jobs", "--json-lines", env=env, script=True, stdin=b'{"a": 1}\n')
    assert r.returncode == 0 and len(r.stdout.split()) == 1
    r = cli("dequeue", "jobs", "--json", env=env)
    assert r.returncode == 0 and json.loads(r.stdout)["payload"] == {"a": 1}
    r = cli("dequeue", "jobs", env=env, script=True)
    assert r.returncode == 3
    r = cli("--url", "bogus://x", "list", script=True)
    assert r.returncode == 2 and r.stderr.startswith(b"fdbqueue: error: unknown engine")
    assert b"Traceback" not in r.stderr and r.stderr.count(b"\n") == 1
    r = cli("stats", "missing", env=env)
    assert r.returncode == 1 and r.stderr == b"fdbqueue: error: no queue named 'missing'\n"


def test_worker_process_stops_on_sigterm_and_loses_nothing(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'w.db'}?sync=normal"
    log = tmp_path / "processed.log"
    env = {**os.environ, "FDBQUEUE_URL": url, "CLI_HANDLER_LOG": str(log), "CLI_HANDLER_SLEEP": "0.002"}
    first = cli("enqueue", "work", *[f"m{i}" for i in range(50)], env=env).stdout.decode().split()
    assert len(first) == 50
    proc = subprocess.Popen(
        [
            str(BIN / "fdbqueue"),
            "worker",
            "work",
            "--handler",
            "tests.support.cli_handlers:record",
            "--concurrency",
            "2",
            "--sweep-interval",
            "0.5",
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and (not log.exists() or len(log.read_text().split()) < 50):
            time.sleep(0.05)
        assert set(log.read_text().split()) == set(first)
        # More work arriving as the worker is told to stop: each is processed or still queued.
        second = cli("enqueue", "work", *[f"n{i}" for i in range(200)], env=env).stdout.decode().split()
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err.decode()
    assert b"worker stopped" in out and b"processed" in out
    processed = log.read_text().split()
    assert len(processed) == len(set(processed))  # and none twice
    db = fdbqueue.open(url)
    try:
        q = fdbqueue.Queue("work")
        still = {m.id for m in q.browse(db)} | {i for i in second if q.get(db, i) is not None}
        assert set(first) | set(second) <= set(processed) | still
        assert fdbqueue.queue_stats(db, "work").inflight == 0  # prefetched leases were released
    finally:
        db.close()


# -- reads show what a dequeue would do ------------------------------------------------------------


def test_list_stats_and_browse_classify_by_database_time(run: Run, db: fdbqueue.Database) -> None:
    """An expired message is not ready and a due delayed one is, before anything sweeps."""
    from fdbqueue.store.clock import fake_clock

    q = fdbqueue.Queue("t")
    with fake_clock() as clock:
        stays = q.enqueue(db, "stays", priority=1)
        q.enqueue(db, "expires", ttl=1.0)
        due = q.enqueue(db, "due", delay=1.0, priority=1)
        q.enqueue(db, "due but expired", delay=1.0, ttl=0.5)
        q.enqueue(db, "later", delay=60.0)
        after = q.enqueue(db, "after")
        clock.advance(2.0)
        code, out, _ = run("browse", "t", "--json")
        assert code == 0
        assert [json.loads(line)["id"] for line in out.splitlines()] == [stays, due, after]
        stats = json.loads(run("stats", "t", "--json")[1])
        assert (stats["ready"], stats["delayed"]) == (3, 1), stats
        (row,) = json.loads(run("list", "--json")[1])
        assert (row["ready"], row["delayed"]) == (3, 1), row
        # A dequeue agrees: the messages browse showed, in its order.
        assert [q.dequeue(db).id for _ in range(3)] == [stays, due, after]  # type: ignore[union-attr]
        assert q.dequeue(db) is None


def test_demo_keep_leaves_the_temporary_store_and_says_where(tmp_path: Path) -> None:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    env.pop("FDBQUEUE_URL", None)
    r = cli(
        "demo",
        "--messages",
        "10",
        "--producers",
        "1",
        "--workers",
        "1",
        "--keep",
        "--no-spark",
        env=env,
        timeout=60,
    )
    assert r.returncode == 0, (r.stdout.decode(), r.stderr.decode())
    (kept,) = tmp_path.glob("fdbqueue-demo-*")
    assert (kept / "demo.db").exists() and str(kept).encode() in r.stdout and b"list" in r.stdout


# -- names that go unnoticed (issue 29) --------------------------------------------------------


def test_forward_of_an_unknown_queue_is_exit_1(run: Run, tmp_path: Path) -> None:
    src, dst = f"sqlite://{tmp_path / 'src.db'}", f"sqlite://{tmp_path / 'dst.db'}"
    code, out, err = run("forward", "--from", src, "--queue", "nosuch", "--to", dst)
    assert code == 1 and out == ""
    one_line_error(err, "no queue named 'nosuch'", src)


def test_journal_of_an_unjournaled_or_unknown_queue_is_exit_1(run: Run, db: fdbqueue.Database) -> None:
    fdbqueue.create_queue(db, "jobs")
    code, out, err = run("journal", "jobs")
    assert code == 1 and out == ""
    one_line_error(err, "queue 'jobs' keeps no journal", "--journal")
    code, out, err = run("journal", "nosuch")
    assert code == 1 and out == ""
    one_line_error(err, "no queue named 'nosuch'")
    fdbqueue.create_queue(db, "audited", journal=True)
    code, out, _ = run("journal", "audited", "--json")
    assert code == 0 and json.loads(out.splitlines()[0])["op"] == "create"


def test_redrive_of_a_queue_that_is_no_error_queue_is_exit_1(run: Run, db: fdbqueue.Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    code, out, err = run("redrive", "jobs")
    assert code == 1 and out == ""
    one_line_error(err, "'jobs' is not an error queue", "jobs.error")
    fdbqueue.create_queue(db, "jobs.error")
    assert run("redrive", "jobs.error") == (
        0,
        "redrove 0 messages from jobs.error to their origin queues\n",
        "",
    )


def test_list_leaves_out_what_the_principal_may_not_browse_and_says_how_many(
    run: Run, db: fdbqueue.Database
) -> None:
    fdbqueue.create_queue(db, "open")
    assert run("--principal", "ops", "create", "audit", "--owner", "ops")[0] == 0
    assert run("--principal", "ops", "create", "secret", "--owner", "ops")[0] == 0
    code, out, err = run("list")  # as anonymous: may browse "open" only
    assert code == 0 and err == "", err
    assert "open" in out and "audit" not in out and "secret" not in out
    assert "2 queues not shown: principal 'anonymous' may not browse them" in out
    code, out, err = run("list", "--json")
    assert code == 0 and [row["name"] for row in json.loads(out)] == ["open"]
    assert "2 queues not shown" in err
    code, out, err = run("--principal", "ops", "list")  # the owner sees all three
    assert code == 0 and all(n in out for n in ("open", "audit", "secret")) and "not shown" not in out
    assert run("--principal", "ops", "grant", "audit", "anonymous", "browse")[0] == 0
    code, out, _ = run("list")
    assert "audit" in out and "1 queue not shown" in out


# -- smaller (issue 29) ------------------------------------------------------------------------


def test_metrics_listens_on_loopback_unless_told(db: fdbqueue.Database) -> None:
    from fdbqueue.cli import build_parser
    from fdbqueue.runtime.metrics import serve

    assert build_parser().parse_args(["metrics"]).addr == "127.0.0.1"
    assert build_parser().parse_args(["metrics", "--addr", "0.0.0.0"]).addr == "0.0.0.0"
    exporter = serve(db, 0)
    try:
        assert exporter._server.server_address[0] == "127.0.0.1"
    finally:
        exporter.close()


def test_browse_of_an_error_queue_shows_reason_and_origin(run: Run, db: fdbqueue.Database) -> None:
    fdbqueue.create_queue(db, "jobs", max_deliveries=1)
    q = fdbqueue.Queue("jobs")
    q.enqueue(db, "poison")
    m = q.lease(db)
    assert m is not None
    q.nack(db, m, reason="card declined")
    (dead,) = fdbqueue.Queue("jobs.error").browse(db)  # the Python API's Message holds both
    assert (dead.reason, dead.origin) == ("card declined", "jobs")
    code, out, _ = run("browse", "jobs.error")
    assert code == 0
    header, row = out.splitlines()[1], out.splitlines()[3]
    assert "reason" in header and "origin" in header
    assert "card declined" in row and " jobs " in row and "poison" in row
    code, out, _ = run("browse", "jobs.error", "--json")
    assert (json.loads(out)["reason"], json.loads(out)["origin"]) == ("card declined", "jobs")
    q.enqueue(db, "fine")
    header = run("browse", "jobs")[1].splitlines()[1]
    assert "reason" not in header  # a queue of no dead letters: no empty columns


# -- the demo's output (issue 29) --------------------------------------------------------------


def test_demo_output_is_short_summary_first_and_failures_one_line_each(url: str) -> None:
    argv = ["--url", url, "demo", "--messages", "80", "--producers", "1", "--workers", "2", "--no-spark"]
    r = cli(*argv, timeout=60)
    out, err = r.stdout.decode(), r.stderr.decode()
    assert r.returncode == 0, (out, err)
    assert "Traceback" not in out + err and err == "", err  # deliberate failures: no traceback
    lines = out.splitlines()
    assert len(lines) < 40, out
    assert lines[1] == "OK: every message processed exactly once", out  # the verdict, then the figures
    assert lines[2].startswith("engine") and any(line.startswith("lost") for line in lines[:14])
    failures = [line for line in lines if "handler failed" in line]
    assert failures and all("OrderFailed: order " in line for line in failures), out
    assert re.search(r"deliberate failures: \d+ ", out), out


def test_demo_workers_log_deliberate_failures_in_one_line_and_others_in_full(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    import logging

    from fdbqueue.cli.demo import OrderFailed, worker_logging
    from fdbqueue.runtime.handling import log_failure

    logger = logging.getLogger("fdbqueue.test-demo-logging")
    sink = tmp_path / "failures.log"
    worker_logging(sink, logger)
    q = fdbqueue.Queue("orders")
    m = fdbqueue.Message("r1", b"{}", "orders", 0, 0.0, 1, {}, fdbqueue.ContentType.JSON)
    for exc in (OrderFailed("order 7 is poison"), RuntimeError("a real bug")):
        try:
            raise exc
        except Exception as e:
            log_failure(logger, q, m, e)
    err = capfd.readouterr().err
    (line,) = sink.read_text().splitlines()  # the deliberate one: one line, no traceback
    assert "OrderFailed: order 7 is poison" in line and "(delivery 1)" in line
    assert "RuntimeError: a real bug" in err and "Traceback (most recent call last)" in err  # in full
    assert "order 7" not in err


def test_demo_spark_step_hides_only_the_jvms_start_up_notes(capfd: pytest.CaptureFixture[str]) -> None:
    from fdbqueue.cli.spark_step import jvm_output, show_jvm_output

    notes = (
        b"WARNING: Using incubator modules: jdk.incubator.vector\nUsing Spark's default log4j profile: x\n"
    )
    with jvm_output() as jvm:
        os.write(2, notes + b"26/01/01 ERROR Executor: a real failure\n")
    print("after", file=sys.stderr)  # stderr is back
    show_jvm_output(jvm)
    err = capfd.readouterr().err
    assert err == "after\n26/01/01 ERROR Executor: a real failure\n", err
    with pytest.raises(RuntimeError), jvm_output():
        os.write(2, notes + b"Error: JAVA_HOME is not set\n")
        raise RuntimeError("the JVM did not start")
    assert capfd.readouterr().err == "Error: JAVA_HOME is not set\n"  # why, shown at once


@pytest.mark.parametrize("messages", [0, 1, 3, 250])
def test_audit_plot_counts_messages_in_whole_numbers(messages: int, tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    from fdbqueue.spark.audit import QueueSummary, _figure, _plot

    fates = {"acked": messages} if messages else {}
    summaries = [QueueSummary("jobs", fates, 0, None)]
    fig = _figure(summaries, {})
    bars = fig.axes[0]
    low, high = bars.get_ylim()
    ticks = [t for t in bars.get_yticks() if low <= t <= high]
    assert low == 0 and high >= max(1, messages), (low, high)
    assert ticks and all(t == int(t) for t in ticks), ticks  # no 0.2 of a message
    assert 0 in ticks and len(ticks) >= 2, ticks
    if messages <= 1:
        assert ticks == [0, 1], ticks  # one message: a tick at it
    _plot(summaries, {}, tmp_path / "audit.png")
    assert (tmp_path / "audit.png").stat().st_size > 1000
