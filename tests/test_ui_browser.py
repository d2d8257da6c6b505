"""Operator UI end to end in headless Chromium: log in, find a dead job, requeue it, and see the
dispatcher deliver it to a real receiver (SPEC §7).

Playwright drives Debian's /usr/bin/chromium (never a downloaded browser). Set UI_SCREENSHOTS=1
to refresh the screenshots in docs/screenshots/.
"""

from __future__ import annotations

import asyncio
import os
import threading
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.utils import timezone

from jobs.delivery import AttemptResult, DeliveryRequest, deliver
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD
from tests.helpers import make_channel, make_consumer, make_job, make_producer

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium keeps trying to reach Google's hosts, which this network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = Path(__file__).resolve().parent.parent / "docs" / "screenshots"

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium"
    ),
]


@pytest.fixture
def page(monkeypatch):
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        page.set_default_timeout(10_000)
        yield page
        browser.close()
        # The ORM work of the test ran in the context Playwright's sync API set up; its
        # connection would outlive the test and block the test database's teardown.
        connection.close()


def screenshot(page, name: str) -> None:
    if os.environ.get("UI_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / name, full_page=True)


def dispatch_once() -> list[AttemptResult]:
    """One dispatcher step (claim, deliver, record) in a thread of its own: asyncio.run cannot
    start inside the event loop that Playwright keeps in the test's thread."""
    results: list[AttemptResult] = []

    async def deliver_all(requests: list[DeliveryRequest]) -> None:
        async with aiohttp.ClientSession() as session:
            results.extend(await asyncio.gather(*(deliver(session, r, 2.0) for r in requests)))

    def step() -> None:
        dispatcher = Dispatcher(DispatcherConfig(dispatcher_id="ui-test-dispatcher"))
        try:
            asyncio.run(deliver_all(dispatcher.claim(10)))
            dispatcher.complete(results)
        finally:
            connection.close()

    thread = threading.Thread(target=step)
    thread.start()
    thread.join(timeout=30)
    return results


def dead_job_with_two_attempts(callback_url: str) -> Job:
    make_producer()
    consumer = make_consumer(make_channel(), "billing")
    consumer.callback_url = callback_url
    consumer.save()
    job = make_job(DEAD, attempts=2)
    job.last_error = "HTTP 503 from the callback"
    job.save()
    job.message.payload = b'{"order": 42, "total": "19.90"}'
    job.message.headers = {"X-Request-Id": "req-7f3a"}
    job.message.save()
    started = timezone.now() - timedelta(minutes=10)
    for number, (status_code, error_class, excerpt) in enumerate(
        [(503, "http-status", "Service Unavailable"), (None, "timeout", "")], start=1
    ):
        DeliveryAttempt.objects.create(
            job=job,
            attempt_number=number,
            started_at=started + timedelta(minutes=number),
            duration_ms=2000.0 if status_code is None else 87.4,
            status_code=status_code,
            error_class=error_class,
            response_excerpt=excerpt,
            dispatcher_id="host-1:4242:ab12cd34",
        )
    return job


def test_requeue_a_dead_job_and_see_it_delivered(page, live_server, receiver):
    User.objects.create_user("ops", password="ops-password", is_staff=True)
    job = dead_job_with_two_attempts(receiver.url("/hook"))

    page.goto(f"{live_server.url}/admin/login/?next=/ui/dead-jobs")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    page.wait_for_url("**/ui/dead-jobs")
    assert page.locator("h1").inner_text() == "Dead jobs"
    assert page.evaluate("getComputedStyle(document.querySelector('header')).display") == "flex"
    screenshot(page, "dead-jobs.png")

    page.click(f"a[href='/ui/jobs/{job.pk}']")
    page.wait_for_url(f"**/ui/jobs/{job.pk}")
    attempts = page.locator("table.attempts tbody tr")
    assert attempts.count() == 2
    assert "503" in attempts.nth(0).inner_text()
    assert "timeout" in attempts.nth(1).inner_text()
    screenshot(page, "job.png")

    page.click("text=Requeue this job")
    assert "was requeued" in page.locator(".messages").inner_text()
    assert page.locator(".status").inner_text() == "QUEUED"

    results = dispatch_once()
    assert [result.status_code for result in results] == [200]
    assert receiver.paths() == ["/hook"]

    page.reload()
    assert page.locator(".status").inner_text() == "DELIVERED"
    assert page.locator("table.attempts tbody tr").count() == 3
