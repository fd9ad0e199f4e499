"""The dashboard's JSON API over real HTTP (a uvicorn server in this process), on the embedded and
sim engines: the numbers of ``queue_stats``, browsing with a filter and a cursor, a message with
its history, the actions and their refusals (no admin right, read-only, not from the page), bad
input; the sampler's rates; ``fdbqueue web`` as a command. The page itself: test_web_browser.py.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Database, Queue
from fdbqueue.web import Dashboard, Running
from fdbqueue.web.sampler import Sampler, rated


@pytest.fixture(params=["sqlite", "sim"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}" if request.param == "sqlite" else "sim://")
    yield db
    db.close()


def call(run: Running, path: str, body: Any = None, *, header: bool = True) -> tuple[int, Any]:
    """GET ``path`` (or POST ``body`` as JSON, as the page does); the status and the JSON."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(run.url + path, data=data, method="GET" if body is None else "POST")
    if body is not None:
        req.add_header("content-type", "application/json")
        if header:
            req.add_header("x-fdbqueue", "1")
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def seed(db: Database) -> dict[str, Any]:
    """jobs (journaled, max 1 delivery): 10 ready over two tenants and two priorities, 2 dead
    letters, 1 leased, 1 delayed; emails: paused both ways."""
    fdbqueue.create_queue(db, "jobs", max_deliveries=1, journal=True)
    fdbqueue.create_queue(db, "jobs.error", journal=True)
    q = Queue("jobs")
    dead = []
    for i in range(2):
        dead.append(q.enqueue(db, {"n": -i}, headers={"tenant": "t0"}, priority=9))
        m = q.lease(db)
        assert m is not None and m.id == dead[-1]
        q.nack(db, m, reason=f"boom {i}")
    ready = [
        q.enqueue(db, {"n": i, "name": f"item-{i}"}, headers={"tenant": f"t{i % 2}"}, priority=i % 2)
        for i in range(11)
    ]
    leased = q.lease(db)
    assert leased is not None
    delayed = q.enqueue(db, "later", delay=600)
    Queue("emails").enqueue_many(db, ["hello"] * 3)
    fdbqueue.stop_queue(db, "emails")
    return {
        "dead": dead,
        "ready": [i for i in ready if i != leased.id],
        "leased": leased.id,
        "delayed": delayed,
    }


def test_the_overview_gives_the_numbers_of_queue_stats(store: Database) -> None:
    seed(store)
    with Dashboard(store, interval=0.2).start(port=0) as run:
        status, d = call(run, "/api/overview")
    assert status == 200 and d["principal"] == "anonymous" and d["read_only"] is False
    got = {q["name"]: q for q in d["queues"]}
    assert set(got) == {"jobs", "jobs.error", "emails"}
    for name, q in got.items():
        st = fdbqueue.queue_stats(store, name)
        assert (q["ready"], q["inflight"], q["delayed"], q["errors"], q["done"], q["dead"]) == (
            st.ready,
            st.inflight,
            st.delayed,
            st.errors,
            st.done,
            st.dead,
        )
        assert (q["enqueue_enabled"], q["dequeue_enabled"]) == (st.enqueue_enabled, st.dequeue_enabled)
    assert (got["jobs"]["ready"], got["jobs"]["errors"], got["emails"]["dequeue_enabled"]) == (10, 2, False)
    assert d["series"] and d["series"][-1]["ready"] == 10 + 2 + 3


def test_browse_filters_by_header_and_text_and_pages_with_a_cursor(store: Database) -> None:
    ids = seed(store)
    with Dashboard(store).start(port=0) as run:
        _, d = call(run, "/api/messages?queue=jobs")
        assert [m["id"] for m in d["messages"]] == [m.id for m in Queue("jobs").browse(store)]
        assert d["next"] is None and d["scanned"] == 10
        _, d = call(run, "/api/messages?queue=jobs&filter=tenant%3Dt1")
        assert {m["headers"]["tenant"] for m in d["messages"]} == {"t1"} and len(
            d["messages"]
        ) == 4  # 5, 1 leased
        _, d = call(run, "/api/messages?queue=jobs&filter=ITEM-7")  # a word: in the id or the payload
        assert [json.loads(m["preview"])["n"] for m in d["messages"]] == [7]
        _, d = call(run, "/api/messages?queue=jobs&filter=item-7+tenant%3Dt0")  # both must match
        assert d["messages"] == []
        pages: list[str] = []
        after = ""
        while True:
            _, d = call(run, f"/api/messages?queue=jobs&limit=3&after={after}")
            pages += [m["id"] for m in d["messages"]]
            if d["next"] is None:
                break
            after = d["next"]
        assert pages == [m.id for m in Queue("jobs").browse(store)]
        _, d = call(run, "/api/messages?queue=jobs&state=leased")
        assert [m["id"] for m in d["messages"]] == [ids["leased"]] and d["messages"][0]["lease_until"]
        _, d = call(run, "/api/messages?queue=jobs&state=delayed")
        assert [(m["id"], m["preview"]) for m in d["messages"]] == [(ids["delayed"], "later")]
        _, d = call(run, "/api/messages?queue=jobs.error")
        dead = d["messages"]
        assert [m["id"] for m in dead] == ids["dead"]
        assert [(m["origin"], m["reason"], m["priority"], m["deliveries"]) for m in dead] == [
            ("jobs", "boom 0", 9, 1),
            ("jobs", "boom 1", 9, 1),
        ]


def test_a_message_with_its_journal_history(store: Database) -> None:
    ids = seed(store)
    big = Queue("jobs").enqueue(store, b"\x00\x01" * 100_000)  # in chunks, 200 kB
    with Dashboard(store).start(port=0) as run:
        status, d = call(run, f"/api/message?queue=jobs.error&id={ids['dead'][0]}")
        assert status == 200 and d["state"] == "ready" and d["origin"] == "jobs"
        assert json.loads(d["preview"]) == {"n": 0}
        assert [e["op"] for e in d["history"]] == [e.op for e in fdbqueue.history(store, ids["dead"][0])]
        assert [e["op"] for e in d["history"]] == ["enqueue", "lease", "dead", "dead"]
        status, d = call(run, f"/api/message?queue=jobs&id={big}")
        assert status == 200 and d["size"] == 200_000 and d["truncated"] is True
        assert len(d["preview"]) == 3 * 65_536 - 1  # hex with spaces, the first 64 KiB
        _, listed = call(run, "/api/messages?queue=jobs&filter=" + big)
        assert listed["messages"][0]["preview"] is None  # in chunks: not read for a list
        Queue("jobs").delete(store, big)
        status, d = call(run, f"/api/message?queue=jobs&id={big}")
        assert status == 404 and d["state"] is None and "no message" in d["error"]
        assert [e["op"] for e in d["history"]] == ["enqueue", "delete"]


def test_actions_pause_redrive_and_delete(store: Database) -> None:
    ids = seed(store)
    with Dashboard(store).start(port=0) as run:
        status, d = call(run, "/api/pause", {"queue": "jobs", "direction": "dequeue", "paused": True})
        assert status == 200 and d["paused"] == {"enqueue": False, "dequeue": True}
        st = fdbqueue.queue_stats(store, "jobs")
        assert (st.enqueue_enabled, st.dequeue_enabled) == (True, False)
        assert call(run, "/api/pause", {"queue": "jobs", "direction": "both", "paused": False})[0] == 200
        assert fdbqueue.queue_stats(store, "jobs").dequeue_enabled
        assert call(run, "/api/redrive", {"queue": "jobs.error", "ids": [ids["dead"][1]]}) == (
            200,
            {"redriven": 1},
        )
        assert Queue("jobs").get(store, ids["dead"][1]) is not None
        assert call(run, "/api/delete", {"queue": "jobs", "ids": [ids["delayed"], "nope"]}) == (
            200,
            {"deleted": 1},
        )
        assert Queue("jobs").get(store, ids["delayed"]) is None
        assert call(run, "/api/redrive", {"queue": "jobs.error", "filter": "tenant=t0"}) == (
            200,
            {"redriven": 1},
        )
        assert fdbqueue.queue_stats(store, "jobs.error").ready == 0


def test_bad_requests_get_clear_errors_and_change_nothing(store: Database) -> None:
    seed(store)
    before = fdbqueue.queue_stats(store, "jobs")
    with Dashboard(store).start(port=0) as run:
        for path, status, text in (
            ("/api/queue?name=nope", 404, "no queue named 'nope'"),
            ("/api/queue", 400, "a queue name is needed"),
            ("/api/messages?queue=jobs&state=gone", 400, "state must be one of"),
            ("/api/messages?queue=jobs&limit=0", 400, "limit must be an int"),
            ("/api/messages?queue=jobs&limit=x", 400, "limit must be a number"),
            ("/api/messages?queue=jobs&after=zz", 400, "cursor"),
            ("/api/messages?queue=jobs&after=00", 400, "cursor of this queue"),
            ("/api/message?queue=jobs", 400, "a message id is needed"),
        ):
            got = call(run, path)
            assert got[0] == status and text in got[1]["error"], (path, got)
        for body, status, text in (
            ({"queue": "jobs", "direction": "sideways", "paused": True}, 400, "direction must be"),
            ({"queue": "jobs", "direction": "both", "paused": "yes"}, 400, "paused must be"),
            ({"queue": "jobs", "ids": []}, 400, "ids must be"),
            ({"queue": "jobs", "ids": "abc"}, 400, "ids must be"),
            (b"not json", 400, "must be JSON"),
            (b"[1]", 400, "JSON object"),
            ({"queue": "nope", "ids": ["x"]}, 404, "no queue named 'nope'"),
        ):
            path = "/api/pause" if "direction" in (body if isinstance(body, dict) else {}) else "/api/delete"
            got = call(run, path, body)
            assert got[0] == status and text in got[1]["error"], (body, got)
        # An action without the page's header (a form another site posts) is refused.
        got = call(run, "/api/pause", {"queue": "jobs", "direction": "both", "paused": True}, header=False)
        assert got[0] == 403 and "X-Fdbqueue" in got[1]["error"]
    after = fdbqueue.queue_stats(store, "jobs")
    assert dataclasses.replace(after, oldest_age=None) == dataclasses.replace(before, oldest_age=None)


def test_actions_need_the_admin_right_and_read_only_refuses_them(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    ops, viewer = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="viewer")
    try:
        fdbqueue.create_queue(ops, "jobs", owner="ops", max_deliveries=1)
        fdbqueue.create_queue(ops, "jobs.error", owner="ops")
        fdbqueue.create_queue(ops, "hidden", owner="ops")
        for name in ("jobs", "jobs.error"):
            fdbqueue.grant(ops, name, "viewer", ["browse"])
        q = Queue("jobs")
        mid = q.enqueue(ops, b"x")
        q.nack(ops, q.lease(ops), reason="bad")  # type: ignore[arg-type]
        with Dashboard(viewer).start(port=0) as run:
            _, d = call(run, "/api/overview")
            assert sorted(q["name"] for q in d["queues"]) == ["jobs", "jobs.error"]  # not "hidden"
            assert call(run, "/api/queue?name=jobs")[1]["admin"] is False
            assert call(run, "/api/queue?name=hidden")[0] == 403
            got = call(run, "/api/pause", {"queue": "jobs", "direction": "both", "paused": True})
            assert got == (
                403,
                {
                    "error": "principal 'viewer' lacks right 'admin' on queue 'jobs'",
                    "kind": "AccessDeniedError",
                },
            )
            assert call(run, "/api/redrive", {"queue": "jobs.error", "ids": [mid]})[0] == 403
            assert call(run, "/api/delete", {"queue": "jobs.error", "ids": [mid]})[0] == 403
        with Dashboard(ops, read_only=True).start(port=0) as run:
            assert call(run, "/api/queue?name=jobs")[1]["admin"] is True
            got = call(run, "/api/redrive", {"queue": "jobs.error", "ids": [mid]})
            assert got[0] == 403 and "read-only" in got[1]["error"]
        assert fdbqueue.queue_stats(ops, "jobs").dequeue_enabled
        assert Queue("jobs.error").get(ops, mid) is not None
    finally:
        ops.close()
        viewer.close()


def test_the_sampler_rates_come_from_the_durable_totals(store: Database) -> None:
    now = [1000.0]
    sampler = Sampler(store, interval=1.0, window=3.0, clock=lambda: now[0])
    q = Queue("jobs")
    q.enqueue_many(store, [b"x"] * 4)
    sampler.sample()
    now[0] += 2.0
    q.enqueue_many(store, [b"x"] * 6)
    for _ in range(3):
        q.dequeue(store)
    s = sampler.sample()
    assert s.rates["jobs"] == (3.0, 1.5)  # 6 made ready and 3 consumed in 2 s
    for _ in range(4):
        now[0] += 1.0
        sampler.sample()
    assert len(sampler.history("jobs")) == 4  # the window: 3 s at 1 s
    points = rated(sampler.history(None))
    assert points[-1]["ready"] == 7 and points[-1]["in_rate"] == 0.0
    fdbqueue.destroy_queue(store, "jobs")
    sampler.sample()
    assert sampler.history("jobs") == [] and sampler.latest.stats == []


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.slow
def test_the_web_command_serves_until_sigterm_and_says_why_it_cannot(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}"
    db = fdbqueue.open(url)
    Queue("jobs").enqueue(db, b"x")
    db.close()
    port = _free_port()
    cmd = [sys.executable, "-m", "fdbqueue", "--url", url, "web", "--port", str(port), "--read-only"]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/overview", timeout=5) as r:
                    d = json.loads(r.read())
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline
                time.sleep(0.1)
        assert d["read_only"] is True and [q["ready"] for q in d["queues"]] == [1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as r:
            assert b"<title>fdbqueue</title>" in r.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/static/app.js", timeout=5) as r:
            assert b"function chart" in r.read()
        # The port is taken now: a second dashboard says so.
        taken = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert taken.returncode == 1 and f"cannot listen on 127.0.0.1:{port}" in taken.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "fdbqueue web on" in (proc.stderr.read() if proc.stderr else "")
    bad = subprocess.run(
        [sys.executable, "-m", "fdbqueue", "--url", url, "web", "--port", "70000"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "--port must be 0..65535" in bad.stderr


def test_a_damaged_record_is_shown_as_damaged_not_as_an_error(store: Database) -> None:
    from fdbqueue.store.layout import QueueKeys
    from tests.layer.test_corruption import damage

    q = Queue("jobs")
    good = q.enqueue(store, b"fine")
    bad = q.enqueue(store, b"to be damaged")
    key = QueueKeys.make("jobs").home_key(bad)
    assert key is not None
    damage(store, key, 200)
    with Dashboard(store).start(port=0) as run:
        status, d = call(run, "/api/messages?queue=jobs")
        assert status == 200 and [m["id"] for m in d["messages"]] == [good, None]
        assert "damaged" in d["messages"][1] and d["messages"][1]["key"] == key.hex()
        status, one = call(run, f"/api/message?queue=jobs&id={bad}")
        assert status == 200 and one["state"] == "ready" and one["damaged"]
        got = call(run, "/api/delete", {"queue": "jobs", "ids": [bad]})
        assert got[0] == 400 and "damaged" in got[1]["error"]


# -- DNS rebinding: the Host and Origin the dashboard answers (issue 26) --------------------------


def raw(run: Running, method: str, path: str, headers: dict[str, str], body: Any = None) -> tuple[int, Any]:
    """A request with these headers exactly (Host included), as a rebinding page's would be."""
    import http.client

    conn = http.client.HTTPConnection(str(run.sock.getsockname()[0]), run.port, timeout=30)
    try:
        data = None if body is None else json.dumps(body).encode()
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for k, v in {**headers, **({"content-type": "application/json"} if data else {})}.items():
            conn.putheader(k, v)
        conn.putheader("content-length", str(len(data or b"")))
        conn.endheaders(data)
        r = conn.getresponse()
        text = r.read()
        try:
            return r.status, json.loads(text)
        except ValueError:
            return r.status, text
    finally:
        conn.close()


def test_a_request_for_another_host_is_refused_on_every_route(store: Database) -> None:
    """DNS rebinding: attacker.example resolves to 127.0.0.1 after the page loaded; the
    browser then sends the dashboard that name as Host, with the page's own origin."""
    ids = seed(store)
    with Dashboard(store).start(port=0) as run:
        evil = {"host": f"attacker.example:{run.port}"}
        for path in (
            "/",
            "/static/app.js",
            "/api/overview",
            "/api/queue?name=jobs",
            "/api/messages?queue=jobs",
            f"/api/message?queue=jobs&id={ids['ready'][0]}",
        ):
            status, got = raw(run, "GET", path, evil)
            assert status == 400 and "attacker.example" in got["error"], (path, status, got)
        for path, body in (
            ("/api/delete", {"queue": "jobs", "ids": [ids["delayed"]]}),
            ("/api/pause", {"queue": "jobs", "direction": "both", "paused": True}),
            ("/api/redrive", {"queue": "jobs.error", "ids": ids["dead"]}),
        ):
            status, got = raw(run, "POST", path, {**evil, "x-fdbqueue": "1"}, body)
            assert status == 400, (path, status, got)
        for host in ("", "attacker.example", f"127.0.0.1:{run.port + 1}", f"127.0.0.2:{run.port}"):
            assert raw(run, "GET", "/api/overview", {"host": host} if host else {})[0] == 400, host
        # The names it serves, with its port.
        for host in (
            f"127.0.0.1:{run.port}",
            f"localhost:{run.port}",
            f"LOCALHOST:{run.port}",
            f"[::1]:{run.port}",
        ):
            assert raw(run, "GET", "/api/overview", {"host": host})[0] == 200, host
    assert Queue("jobs").get(store, ids["delayed"]) is not None
    assert fdbqueue.queue_stats(store, "jobs").dequeue_enabled
    assert fdbqueue.queue_stats(store, "jobs.error").ready == 2


def test_an_action_from_another_origin_is_refused(store: Database) -> None:
    ids = seed(store)
    with Dashboard(store).start(port=0) as run:
        here = {"host": f"127.0.0.1:{run.port}", "x-fdbqueue": "1"}
        body = {"queue": "jobs", "ids": [ids["delayed"]]}
        for origin in (
            "http://attacker.example",
            f"http://attacker.example:{run.port}",
            f"http://127.0.0.1:{run.port + 1}",
            "null",
            "not a url",
        ):
            status, got = raw(run, "POST", "/api/delete", {**here, "origin": origin}, body)
            assert status == 403 and "origin" in got["error"].lower(), (origin, status, got)
        assert Queue("jobs").get(store, ids["delayed"]) is not None
        # Reads are not refused for an Origin: a cross-origin page cannot read them anyway.
        assert (
            raw(run, "GET", "/api/overview", {"host": here["host"], "origin": "http://x.example"})[0] == 200
        )
        # Its own origin, by any name it serves, or none (a tool, not a browser): done.
        status, got = raw(
            run, "POST", "/api/delete", {**here, "origin": f"http://localhost:{run.port}"}, body
        )
        assert (status, got) == (200, {"deleted": 1})
        assert raw(run, "POST", "/api/delete", here, {"queue": "jobs", "ids": [ids["ready"][0]]}) == (
            200,
            {"deleted": 1},
        )


def test_allowed_hosts_add_the_names_of_a_reverse_proxy(store: Database) -> None:
    seed(store)
    with Dashboard(store, allowed_hosts=["dash.example", "other.example:8443"]).start(port=0) as run:
        for host, status in (
            ("dash.example", 200),  # a bare name: at any port
            ("dash.example:443", 200),
            ("Dash.Example:9000", 200),
            ("other.example:8443", 200),
            ("other.example", 400),
            ("other.example:443", 400),
            ("evil.example", 400),
            (f"127.0.0.1:{run.port}", 200),  # the defaults stay
        ):
            assert raw(run, "GET", "/api/overview", {"host": host})[0] == status, host
        here = {"host": "127.0.0.1:9", "x-fdbqueue": "1"}  # as the proxy passes it on
        pause = {"queue": "jobs", "direction": "both", "paused": True}
        assert (
            raw(
                run,
                "POST",
                "/api/pause",
                {**here, "host": "dash.example", "origin": "https://dash.example"},
                pause,
            )[0]
            == 200
        )
        got = raw(
            run,
            "POST",
            "/api/pause",
            {"host": "dash.example", "origin": "https://evil.example", "x-fdbqueue": "1"},
            pause,
        )
        assert got[0] == 403
    for bad in ("", "http://dash.example", "dash.example/x", "a b", "dash.example:x", "dash.example:70000"):
        with pytest.raises(fdbqueue.QueueError, match="allowed host"):
            Dashboard(store, allowed_hosts=[bad])


def test_the_address_it_listens_on_is_a_name_it_serves(store: Database) -> None:
    with Dashboard(store).start(port=0, addr="127.0.0.2") as run:
        assert raw(run, "GET", "/api/overview", {"host": f"127.0.0.2:{run.port}"})[0] == 200
        assert raw(run, "GET", "/api/overview", {"host": f"localhost:{run.port}"})[0] == 200
        assert raw(run, "GET", "/api/overview", {"host": f"127.0.0.3:{run.port}"})[0] == 400


def test_health_answers_any_host(store: Database) -> None:
    """A probe (Kubernetes sends the pod's address as Host) learns only ok or not."""
    with Dashboard(store, interval=0.2).start(port=0) as run:
        status, got = raw(run, "GET", "/healthz", {"host": "10.1.2.3:8080"})
        assert status == 200 and set(got) == {"ok", "error"}


def test_the_web_command_takes_allowed_hosts(tmp_path: Path) -> None:
    """--allowed-host (repeatable) reaches the dashboard; a bad one is a usage error."""
    from fdbqueue.cli import main

    url = f"sqlite://{tmp_path / 'q.db'}"
    seen: dict[str, Any] = {}

    def serve(self: Dashboard, port: int, addr: str, **_: Any) -> None:
        seen["hosts"] = self.hosts.extra

    import unittest.mock

    with unittest.mock.patch.object(Dashboard, "serve", serve):
        assert (
            main(["--url", url, "web", "--allowed-host", "a.example", "--allowed-host", "b.example:8443"])
            == 0
        )
    assert seen["hosts"] == ("a.example", "b.example:8443")
    assert main(["--url", url, "web", "--allowed-host", "http://a.example"]) == 2


# -- whatever a store holds is shown, never a 500 -----------------------------------------------


def test_headers_json_cannot_carry_are_shown_escaped_not_a_500(store: Database) -> None:
    """Stored by an older version (now refused at enqueue): a lone surrogate in a header's
    name, value or a reason, and NaN and infinities."""
    from fdbqueue.ops.enqueuing import enqueue_items
    from fdbqueue.store.entropy import new_rand
    from fdbqueue.types import ContentType, Item

    fdbqueue.create_queue(store, "jobs", journal=True, max_deliveries=1)
    q = Queue("jobs")
    headers = {"k\ud800": "v\udfff", "n": float("nan"), "i": float("-inf")}
    item = Item("", new_rand(), b"x", ContentType.BYTES, 0, headers, 0.0, None, None)
    mid = enqueue_items(q.keys, store, [item], None)[0]
    other = q.enqueue(store, "ok")
    m = q.lease(store)
    assert m is not None and m.id == mid
    q.nack(store, m, reason="bad \udc80 byte")
    with Dashboard(store).start(port=0) as run:
        for path in (
            "/api/messages?queue=jobs.error",
            f"/api/message?queue=jobs.error&id={mid}",
            "/api/overview",
            "/api/queue?name=jobs",
            "/api/messages?queue=jobs",
        ):
            status, d = call(run, path)
            assert status == 200, (path, d)
        _, d = call(run, "/api/messages?queue=jobs.error")
        (shown,) = d["messages"]
        assert shown["headers"] == {"k\\ud800": "v\\udfff", "n": "NaN", "i": "-Infinity"}
        assert shown["reason"] == "bad \\udc80 byte"
        _, d = call(run, f"/api/message?queue=jobs.error&id={mid}")
        assert d["headers"]["k\\ud800"] == "v\\udfff" and d["history"]
        assert call(run, f"/api/message?queue=jobs&id={other}")[0] == 200
