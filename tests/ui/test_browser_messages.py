"""Message search and replay end to end in headless Chromium (docs/ui.md): find a delivered message
by its ID, see its jobs and attempts, replay it to one consumer, and see the dispatcher deliver
it again to a real receiver.

Set UI_SCREENSHOTS=1 to refresh docs/screenshots/messages.png and message.png.
"""

from __future__ import annotations

from broker import publish
from jobs.models import Job
from jobs.states import DELIVERED, QUEUED
from tests.helpers import make_channel, make_consumer, make_producer
from tests.ui.browser import browser_test, dispatch_once, log_in, screenshot

pytestmark = browser_test


def delivered_to_billing_and_audit(receiver) -> None:
    make_producer()
    channel = make_channel()
    for consumer_id in ["billing", "audit"]:
        consumer = make_consumer(channel, consumer_id)
        consumer.callback_url = receiver.url(f"/{consumer_id}")
        consumer.save()
    for number in range(1, 4):  # some other traffic in the recent list
        publish(channel, {"order": number}, producer="shop", message_id=f"order-{number}")
    publish(
        channel,
        {"order": 42, "total": "19.90"},
        producer="shop",
        message_id="order-42",
        headers={"X-Request-Id": "req-7f3a"},
        ordering_key="customer-7",
    )
    results = dispatch_once()
    assert [result.status_code for result in results] == [200] * 8


def test_search_a_message_and_replay_it(page, live_server, receiver):
    delivered_to_billing_and_audit(receiver)

    log_in(page, live_server, "/ui/messages")
    assert page.locator("h1").inner_text() == "Messages"
    assert page.locator("table.message-list tbody tr").count() == 4
    screenshot(page, "messages.png")

    page.fill("input[name=q]", "order-42")
    page.click("text=Search")
    page.wait_for_url("**/ui/messages/*")
    assert "order-42" in page.locator("h1").inner_text()
    jobs = page.locator("table.jobs tbody tr")
    assert jobs.count() == 2
    assert all("DELIVERED" in jobs.nth(n).inner_text() for n in range(2))
    assert page.locator("table.attempts tbody tr").count() == 2

    page.once("dialog", lambda dialog: dialog.accept())
    page.click("text=Replay to billing")
    assert "replayed to billing" in page.locator(".messages").inner_text()
    of_42 = Job.objects.filter(message__public_id="order-42")
    statuses = dict(of_42.values_list("consumer__public_id", "status"))
    assert (statuses["billing"], statuses["audit"]) == (QUEUED, DELIVERED)

    results = dispatch_once()
    assert [result.status_code for result in results] == [200]
    assert receiver.paths().count("/billing") == 5  # four messages, and order-42 again
    assert receiver.received[-1].body == b'{"order": 42, "total": "19.90"}'

    page.reload()
    billing = page.locator("table.jobs tbody tr", has_text="billing")
    assert "DELIVERED" in billing.inner_text()
    attempts = page.locator("table.attempts tbody tr")
    assert attempts.count() == 3
    assert "billing" in attempts.nth(2).inner_text()
    screenshot(page, "message.png")  # both deliveries to billing in the history


def test_a_dismissed_confirmation_replays_nothing(page, live_server, receiver):
    delivered_to_billing_and_audit(receiver)
    log_in(page, live_server, "/ui/messages")
    page.goto(f"{live_server.url}/ui/messages?q=order-42")
    page.wait_for_url("**/ui/messages/*")

    page.once("dialog", lambda dialog: dialog.dismiss())
    page.click("text=Replay to all consumers")

    assert page.locator(".messages").count() == 0
    assert set(Job.objects.values_list("status", flat=True)) == {DELIVERED}
