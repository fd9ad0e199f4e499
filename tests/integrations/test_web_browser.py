"""The dashboard in a real browser: headless Chromium (Debian's ``chromium``) driven by
Playwright with its executable path set. Pages load, their numbers match the API, they update
live, browsing filters, a message shows its journal, redrive, delete and pause work from the
page and are refused without the admin right or in read-only mode. A screenshot of each page
is kept in build/test-artifacts/web/ (or $FDBQUEUE_ARTIFACTS).

Skipped, saying why, where Chromium or Playwright is missing; scripts/test.sh installs both
and sets FDBQUEUE_REQUIRE_BROWSER=1, which turns that skip into a failure.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import fdbqueue
from fdbqueue import Database, Queue
from fdbqueue.web import Dashboard, Running
from tests.support import ROOT

from .test_web import seed

ARTIFACTS = Path(os.environ.get("FDBQUEUE_ARTIFACTS", ROOT / "build" / "test-artifacts")) / "web"
# The flags a headless Chromium needs as root in a container with no network beyond loopback:
# no sandbox (root), and none of its background connections to Google's hosts.
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _chromium() -> str | None:
    return os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    why = None
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        why = "playwright is not installed (pip install -e '.[dev]')"
    exe = _chromium()
    if why is None and exe is None:
        why = "no chromium on PATH (Debian: apt-get install chromium; or set $CHROMIUM)"
    if why is not None:
        if os.environ.get("FDBQUEUE_REQUIRE_BROWSER") == "1":
            pytest.fail(f"FDBQUEUE_REQUIRE_BROWSER=1 but {why}")
        pytest.skip(why)
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=exe, args=FLAGS)
        yield b
        b.close()


@pytest.fixture
def page(browser: Any, request: pytest.FixtureRequest) -> Iterator[Any]:
    ctx = browser.new_context(viewport={"width": 1280, "height": 860})
    pg = ctx.new_page()
    pg.set_default_timeout(15_000)
    errors: list[str] = []
    pg.on("pageerror", lambda e: errors.append(str(e)))
    pg.on("dialog", lambda d: d.accept())  # the page confirms deletes and bulk redrives
    yield pg
    ctx.close()
    assert not errors, f"the page's script failed: {errors}"


def shot(page: Any, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Database]:
    db = fdbqueue.open(f"sqlite://{tmp_path / 'q.db'}")
    yield db
    db.close()


def cell(page: Any, queue: str, field: str) -> Any:
    return page.locator(f'#queues tr[data-queue="{queue}"] td[data-field="{field}"]')


def test_the_queue_list_matches_the_api_and_updates_live(store: Database, page: Any) -> None:
    from playwright.sync_api import expect

    seed(store)
    with Dashboard(store, interval=0.3).start(port=0) as run:
        page.goto(run.url + "/")
        expect(page.locator("#queues tbody tr")).to_have_count(3)
        for name in ("jobs", "jobs.error", "emails"):
            st = fdbqueue.queue_stats(store, name)
            for field in ("ready", "inflight", "delayed", "errors"):
                expect(cell(page, name, field)).to_have_text(f"{getattr(st, field):,}")
        expect(cell(page, "emails", "state").locator("[data-paused]")).to_have_count(2)
        expect(cell(page, "jobs", "state")).to_have_text("active")
        Queue("jobs").enqueue_many(store, [b"more"] * 1234)  # no reload: the page polls
        expect(cell(page, "jobs", "ready")).to_have_text("1,244")
        expect(cell(page, "jobs", "ready_rate")).not_to_have_text("0.0")
        # The chart of the totals has points, and a line per depth.
        assert int(page.locator("#chart-depth").get_attribute("data-points")) >= 2
        expect(page.locator("#chart-depth polyline")).to_have_count(4)
        page.fill("#queue-filter", "error")
        expect(page.locator("#queues tbody tr")).to_have_count(1)
        page.fill("#queue-filter", "")
        shot(page, "overview")


def test_a_queue_page_browses_with_a_filter_and_a_message_shows_its_journal(
    store: Database, page: Any
) -> None:
    from playwright.sync_api import expect

    ids = seed(store)
    with Dashboard(store, interval=0.3).start(port=0) as run:
        page.goto(run.url + "/")
        page.click('#queues tr[data-queue="jobs"] a')
        expect(page.locator("#message-list tbody tr")).to_have_count(10)
        shown = page.locator("#message-list tbody tr").evaluate_all("rows => rows.map(r => r.dataset.id)")
        assert shown == [m.id for m in Queue("jobs").browse(store)]
        expect(page.locator('[data-card="ready"] .v')).to_have_text("10")
        expect(page.locator('[data-card="dead letters"] .v')).to_have_text("2")
        page.fill("#message-filter", "tenant=t0")
        page.click("#apply-filter")
        expect(page.locator("#message-list tbody tr")).to_have_count(6)  # the even ones
        shot(page, "queue")
        page.click('button[data-state="leased"]')
        expect(page.locator("#message-list tbody tr")).to_have_count(0)  # the filter holds: t1 is leased
        page.fill("#message-filter", "")
        page.click("#apply-filter")
        expect(page.locator(f'#message-list tr[data-id="{ids["leased"]}"]')).to_have_count(1)
        page.click('button[data-state="delayed"]')
        page.click(f'#message-list tr[data-id="{ids["delayed"]}"] a')
        expect(page.locator("#payload")).to_have_text("later")
        expect(page.locator('#message-fields dd[data-field="state"]')).to_have_text("delayed")
        # A dead letter's page: its fields and its history, as the journal has it.
        page.goto(f"{run.url}/#/queue/jobs.error/message/{ids['dead'][0]}")
        expect(page.locator('#message-fields dd[data-field="origin"]')).to_have_text("jobs")
        ops = [e.op for e in fdbqueue.history(store, ids["dead"][0])]
        expect(page.locator("#history tbody tr")).to_have_count(len(ops))
        assert page.locator("#history tbody tr").evaluate_all("rows => rows.map(r => r.dataset.op)") == ops
        shot(page, "message")


def test_dead_letters_are_redriven_and_deleted_and_queues_paused_from_the_page(
    store: Database, page: Any
) -> None:
    from playwright.sync_api import expect

    ids = seed(store)
    Queue("jobs").nack(store, Queue("jobs").lease(store), reason="third")  # type: ignore[arg-type]
    with Dashboard(store, interval=0.3).start(port=0) as run:
        page.goto(run.url + "/#/queue/jobs.error")
        expect(page.locator("#message-list tbody tr")).to_have_count(3)
        shot(page, "dead-letters")
        page.click(f'#message-list tr[data-id="{ids["dead"][0]}"] button[data-action="redrive"]')
        expect(page.locator("#message-list tbody tr")).to_have_count(2)
        assert Queue("jobs").get(store, ids["dead"][0]) is not None  # back in its origin
        page.click(f'#message-list tr[data-id="{ids["dead"][1]}"] button[data-action="delete"]')
        expect(page.locator("#message-list tbody tr")).to_have_count(1)
        assert Queue("jobs.error").get(store, ids["dead"][1]) is None
        assert Queue("jobs").get(store, ids["dead"][1]) is None
        page.click("#redrive-all")
        expect(page.locator("#no-messages")).to_be_visible()
        assert fdbqueue.queue_stats(store, "jobs.error").ready == 0
        # Pause and resume.
        page.goto(run.url + "/#/queue/jobs")
        page.click("#pause-dequeue")
        expect(page.locator("#resume-dequeue")).to_be_visible()
        expect(page.locator('#queue-state [data-paused="dequeue"]')).to_be_visible()
        st = fdbqueue.queue_stats(store, "jobs")
        assert (st.enqueue_enabled, st.dequeue_enabled) == (True, False)
        shot(page, "paused")
        page.click("#resume-dequeue")
        expect(page.locator("#pause-dequeue")).to_be_visible()
        assert fdbqueue.queue_stats(store, "jobs").dequeue_enabled


def test_a_click_survives_a_refresh_between_press_and_release(store: Database, page: Any) -> None:
    """The page refreshes every few hundred ms; a button rebuilt between mousedown and mouseup
    would lose the click (CI saw "Pause dequeue" ignored once). A refresh that changes
    nothing keeps the buttons: the click lands."""
    from playwright.sync_api import expect

    seed(store)
    with Dashboard(store, interval=0.3).start(port=0) as run:
        page.goto(run.url + "/#/queue/jobs")
        for button, after in (("#pause-dequeue", "#resume-dequeue"), ('button[data-action="delete"]', None)):
            target = page.locator(button).first
            expect(target).to_be_visible()
            box = target.bounding_box()
            assert box is not None
            rows = page.locator("#message-list tbody tr").count()
            page.once("dialog", lambda d: d.accept())  # Delete asks first
            page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
            page.mouse.down()
            page.evaluate("refresh(false)")  # the whole page drawn again, the button held down
            page.mouse.up()
            if after is not None:
                expect(page.locator(after)).to_be_visible()
            else:
                expect(page.locator("#message-list tbody tr")).to_have_count(rows - 1)
        assert not fdbqueue.queue_stats(store, "jobs").dequeue_enabled


def test_the_previous_queues_buttons_go_as_soon_as_another_page_is_asked_for(
    store: Database, page: Any
) -> None:
    """Until a new page's data came back, the previous page stayed, buttons and all: a click
    in between acted on the previous queue (CI: "Pause dequeue" on jobs paused jobs.error)."""
    from playwright.sync_api import expect

    seed(store)
    with Dashboard(store, interval=0.3).start(port=0) as run:
        page.goto(run.url + "/#/queue/jobs.error")
        expect(page.locator("#pause-dequeue")).to_be_visible()
        # Right after the hash changes (the new page's requests are still out): whose controls?
        left = page.evaluate(
            """() => new Promise((done) => {
                window.addEventListener("hashchange", () => setTimeout(() => {
                    const b = document.getElementById("pause-dequeue");
                    done(b ? document.querySelector("h1").textContent : null);
                }, 0), { once: true });
                location.hash = "#/queue/jobs";
            })"""
        )
        assert left is None, f"the buttons of {left!r} were still there"
        expect(page.locator("h1")).to_have_text(re.compile(r"^jobs(?!\.error)"))
        page.click("#pause-dequeue")
        expect(page.locator("#resume-dequeue")).to_be_visible()
        assert not fdbqueue.queue_stats(store, "jobs").dequeue_enabled
        assert fdbqueue.queue_stats(store, "jobs.error").dequeue_enabled


def _refused(page: Any, run: Running, body: dict[str, Any]) -> tuple[int, str]:
    """POST an action from the page's own context (as its buttons would)."""
    got: dict[str, Any] = page.evaluate(
        """async ([url, body]) => {
            const r = await fetch(url, {method: "POST", body: JSON.stringify(body),
                headers: {"content-type": "application/json", "x-fdbqueue": "1"}});
            return {status: r.status, error: (await r.json()).error};
        }""",
        [run.url + "/api/pause", body],
    )
    return got["status"], got["error"]


def test_without_admin_or_read_only_the_actions_are_refused(tmp_path: Path, page: Any) -> None:
    from playwright.sync_api import expect

    url = f"sqlite://{tmp_path / 'q.db'}"
    ops, viewer = fdbqueue.open(url, principal="ops"), fdbqueue.open(url, principal="viewer")
    try:
        fdbqueue.create_queue(ops, "jobs", owner="ops")
        fdbqueue.grant(ops, "jobs", "viewer", ["browse"])
        Queue("jobs").enqueue(ops, b"x")
        pause = {"queue": "jobs", "direction": "both", "paused": True}
        with Dashboard(viewer).start(port=0) as run:
            page.goto(run.url + "/#/queue/jobs")
            expect(page.locator("#why-disabled")).to_have_text("needs the admin right on this queue")
            expect(page.locator("#pause-dequeue")).to_be_disabled()
            expect(page.locator('button[data-action="delete"]')).to_be_disabled()
            shot(page, "no-admin")
            assert _refused(page, run, pause) == (
                403,
                "principal 'viewer' lacks right 'admin' on queue 'jobs'",
            )
        with Dashboard(ops, read_only=True).start(port=0) as run:
            page.goto(run.url + "/")
            expect(page.locator("#read-only")).to_be_visible()
            page.goto(run.url + "/#/queue/jobs")
            expect(page.locator("#why-disabled")).to_have_text("the dashboard is read-only")
            expect(page.locator("#pause-enqueue")).to_be_disabled()
            status, error = _refused(page, run, pause)
            assert status == 403 and "read-only" in error
        st = fdbqueue.queue_stats(ops, "jobs")
        assert (st.enqueue_enabled, st.dequeue_enabled, st.ready) == (True, True, 1)
    finally:
        ops.close()
        viewer.close()


def test_an_action_refused_by_the_server_shows_its_reason(store: Database, page: Any) -> None:
    from playwright.sync_api import expect

    seed(store)
    with Dashboard(store).start(port=0) as run:
        page.goto(run.url + "/#/queue/jobs")
        expect(page.locator("#pause-enqueue")).to_be_enabled()
        fdbqueue.destroy_queue(store, "jobs")  # gone between the page's load and the click
        page.click("#pause-enqueue")
        expect(page.locator("#error")).to_contain_text("no queue named 'jobs'")
