"""Consumer pages end to end in headless Chromium: log in, open the list and a consumer, pause
and resume it, send a test event to a real receiver and see its answer (docs/ui.md).

Set UI_SCREENSHOTS=1 to refresh docs/screenshots/consumers.png and consumer.png.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from consumers.models import Consumer
from jobs.states import DEAD, QUEUED
from tests.helpers import make_channel, make_consumer, make_job, make_producer
from tests.ui.browser import browser_test, log_in, screenshot

pytestmark = browser_test


def some_consumers(callback_url: str) -> Consumer:
    """A few consumers in two channels, as an operator would find them; returns orders/billing."""
    make_producer()
    orders, refunds = make_channel("orders"), make_channel("refunds")
    billing = make_consumer(orders, "billing")
    billing.callback_url = callback_url
    billing.retry_delays = [10, 60, 600]
    billing.non_retryable_statuses = [400, 422]
    billing.save()
    make_job(QUEUED)
    make_job(DEAD, attempts=4)
    make_consumer(orders, "warehouse", type=Consumer.Type.PULL)
    Consumer.objects.filter(pk=make_consumer(orders, "analytics").pk).update(paused=True)
    flaky = make_consumer(refunds, "ledger")
    Consumer.objects.filter(pk=flaky.pk).update(
        circuit_failures=5, circuit_open_until=timezone.now() + timedelta(minutes=2)
    )
    return billing


def test_pause_and_resume_a_consumer_and_send_a_test_event(page, live_server, receiver):
    billing = some_consumers(receiver.url("/hooks/billing"))

    log_in(page, live_server, "/ui/consumers")
    assert page.locator("h1").inner_text() == "Consumers"
    assert page.locator("tr.channel-row").count() == 2
    assert page.evaluate("getComputedStyle(document.querySelector('.badge')).borderRadius") == "3px"
    screenshot(page, "consumers.png")

    page.click("a[href='/ui/consumers/orders/billing']")
    page.wait_for_url("**/ui/consumers/orders/billing")
    assert page.locator("#delivery-state").inner_text() == "Active"

    page.click("button:text('Pause')")
    page.wait_for_selector("#delivery-state:text('Paused')")
    assert "Paused billing" in page.locator(".messages").inner_text()
    assert Consumer.objects.get(pk=billing.pk).paused

    page.click("button:text('Resume')")
    page.wait_for_selector("#delivery-state:text('Active')")
    assert not Consumer.objects.get(pk=billing.pk).paused

    page.click("button:text('Send test event')")
    page.wait_for_selector(".test-event")
    assert page.locator(".test-status").inner_text() == "200"
    assert "Test event delivered: HTTP 200." in page.locator(".messages").inner_text()
    assert receiver.paths() == ["/hooks/billing"]
    screenshot(page, "consumer.png")
