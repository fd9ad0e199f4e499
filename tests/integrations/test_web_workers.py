"""The dashboard's Workers page, in headless Chromium (the fixtures of test_web_browser.py):
a running worker is listed with its host, pid, queues and counts, its message in hand links
to the message's page, and it leaves the page when it stops; the API behind it answers only
the names the dashboard serves, and shows a principal only the workers of its queues."""

from __future__ import annotations

import http.client
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Database, Queue, Worker
from fdbqueue.web import Dashboard

from .test_web_browser import browser, page, shot

__all__ = ["browser", "page"]  # fixtures, used by name


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}?sync=normal")
    yield db
    db.close()


def test_the_workers_page_shows_a_running_worker_and_its_message(store: Database, page: Any) -> None:
    from playwright.sync_api import expect

    fdbqueue.create_queue(store, "jobs", max_deliveries=1)
    q = Queue("jobs")
    q.enqueue_many(store, [b"ok", b"ok", b"bad"])
    release = threading.Event()

    def handler(m: fdbqueue.Message) -> None:
        if m.payload == b"bad":
            raise ValueError("bad")
        if m.payload == b"slow":
            release.wait(30)

    w = Worker(store, "jobs", handler, registry_interval=0.5, settle_linger=0)  # alive: a beat 1.5 s late
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        with Dashboard(store, interval=0.3).start(port=0) as run:
            page.goto(run.url + "/")
            page.click("#nav-workers")
            expect(page.locator("#workers tbody tr[data-worker]")).to_have_count(1)
            row = page.locator("#workers tbody tr[data-worker]")
            me = fdbqueue.workers(store)[0]
            assert row.get_attribute("data-worker") == me.id
            expect(row.locator('[data-field="state"]')).to_have_text("alive")
            expect(row.locator('[data-field="host"]')).to_have_text(me.host)
            expect(row.locator('[data-field="pid"]')).to_have_text(str(me.pid))
            expect(row.locator('[data-field="queues"]')).to_have_text("jobs")
            expect(row.locator('[data-field="handled"]')).to_have_text("3")  # the page polls
            expect(row.locator('[data-field="failed"]')).to_have_text("1")
            slow = q.enqueue(store, b"slow")
            expect(row.locator('[data-field="current"]')).to_have_text(slow)
            shot(page, "workers")
            row.locator('[data-field="current"] a').click()  # to the message's own page
            expect(page.locator("#crumbs")).to_contain_text(slow)
            page.click("#nav-workers")
            release.set()
            expect(page.locator('#workers tbody [data-field="current"]')).to_have_text("\u2013")
            w.stop()
            t.join(30)
            expect(page.locator("#workers tbody tr[data-worker]")).to_have_count(0)
            expect(page.locator("#worker-count")).to_have_text("0 workers, 0 alive")
    finally:
        release.set()
        w.stop()
        t.join(30)


def test_the_workers_api_answers_only_its_names_and_a_principals_workers(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path / 'q.db'}?sync=normal"
    ops, eve = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="eve")
    fdbqueue.create_queue(ops, "vault", owner="ops")
    w = Worker(ops, "vault", lambda m: None, registry_interval=0.1)
    t = threading.Thread(target=w.run, daemon=True)
    t.start()
    try:
        while not fdbqueue.workers(ops):
            threading.Event().wait(0.02)

        def get(db: Database, host: str) -> tuple[int, Any]:
            with Dashboard(db, interval=0.3).start(port=0) as run:
                conn = http.client.HTTPConnection("127.0.0.1", run.port, timeout=10)
                conn.request("GET", "/api/workers", headers={"host": host.replace("PORT", str(run.port))})
                r = conn.getresponse()
                return r.status, json.loads(r.read() or b"null")

        status, got = get(ops, "localhost:PORT")
        assert status == 200 and [x["queues"] for x in got["workers"]] == [["vault"]]
        status, got = get(eve, "localhost:PORT")
        assert status == 200 and got["workers"] == []  # not eve's queue
        status, _ = get(ops, "rebound.example")  # DNS rebinding: a name it does not serve
        assert status in (400, 403, 421)
    finally:
        w.stop()
        t.join(30)
        ops.close()
        eve.close()
