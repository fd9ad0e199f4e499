"""The README's picture of the dashboard (docs/dashboard.png): a few queues under a live load
(a producer and a lease-mode worker that fails one message in twenty), shown in headless
Chromium after a minute of it.

    python scripts/dashboard_screenshot.py [--seconds 60] [--out docs/dashboard.png]
"""

from __future__ import annotations

import argparse
import logging
import random
import shutil
import tempfile
import threading
import time

import fdbqueue
from fdbqueue import Message, Queue, Worker
from fdbqueue.web import Dashboard


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--out", default="docs/dashboard.png")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "chromium")
    args = ap.parse_args()
    logging.getLogger("fdbqueue").setLevel(logging.CRITICAL)  # the failures are on purpose
    folder = tempfile.mkdtemp(prefix="dashboard-")
    db = fdbqueue.open(f"sqlite://{folder}/q.db")
    try:
        fdbqueue.create_queue(db, "orders", max_deliveries=2, journal=True)
        fdbqueue.create_queue(db, "emails", lease_seconds=10)
        fdbqueue.create_queue(db, "reports")
        Queue("reports").enqueue_many(db, [f"report {i}" for i in range(40)])
        fdbqueue.stop_queue(db, "reports")
        stop = threading.Event()

        def produce() -> None:
            rnd = random.Random(7)
            while not stop.is_set():
                n = rnd.randint(5, 25)
                Queue("orders").enqueue_many(db, [{"order": rnd.randint(1, 10**6)} for _ in range(n)])
                Queue("emails").enqueue(db, "welcome", headers={"tenant": rnd.choice("abc")})
                time.sleep(0.1)

        def handle(m: Message) -> None:
            time.sleep(0.004)
            if m.json()["order"] % 20 == 0:
                raise ValueError("card declined")

        worker = Worker(db, "orders", handle, concurrency=2)
        threads = [threading.Thread(target=produce), threading.Thread(target=worker.run)]
        for t in threads:
            t.start()
        from playwright.sync_api import sync_playwright

        with Dashboard(db, interval=1.0).start(port=0) as run:
            time.sleep(args.seconds)
            with sync_playwright() as p:
                b = p.chromium.launch(
                    executable_path=args.chromium,
                    args=["--no-sandbox", "--disable-gpu", "--disable-background-networking"],
                )
                page = b.new_page(viewport={"width": 1200, "height": 560})
                page.goto(run.url + "/")
                page.wait_for_selector('#queues tr[data-queue="orders"]')
                page.screenshot(path=args.out)
                b.close()
            stop.set()
            worker.stop()
            for t in threads:
                t.join()
        print(f"wrote {args.out}")
    finally:
        db.close()
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
