"""Operator UI end to end in headless Chromium: log in, find a dead job, requeue it, and see the
dispatcher deliver it to a real receiver (docs/ui.md).

Playwright drives Debian's /usr/bin/chromium (never a downloaded browser). Set UI_SCREENSHOTS=1
to refresh the screenshots in docs/screenshots/.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD
from tests.helpers import make_channel, make_consumer, make_job, make_producer
from tests.ui.browser import browser_test, dispatch_once, log_in, screenshot

pytestmark = browser_test


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
    job = dead_job_with_two_attempts(receiver.url("/hook"))

    log_in(page, live_server, "/ui/dead-jobs")
    assert page.locator("h1").inner_text() == "Dead jobs"
    assert page.evaluate("getComputedStyle(document.querySelector('header')).display") == "flex"
    screenshot(page, "dead-jobs.png")

    page.click(f"a[href='/ui/jobs/{job.public_id}']")
    page.wait_for_url(f"**/ui/jobs/{job.public_id}")
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
