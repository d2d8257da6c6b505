"""Scheduled and periodic message pages end to end in headless Chromium (docs/ui.md): create a
periodic message, disable and re-enable it; schedule a message and cancel it.

Set UI_SCREENSHOTS=1 to refresh docs/screenshots/periodic.png and scheduled.png.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from broker import publish
from broker.models import Channel, Message, PeriodicMessage
from broker.periodic import run_due_ticks
from broker.periodic_edits import create_periodic
from tests.helpers import make_channel, make_consumer, make_producer
from tests.ui.browser import browser_test, log_in, screenshot

pytestmark = browser_test


def accept_confirm(page) -> None:
    page.once("dialog", lambda dialog: dialog.accept())


def test_create_disable_and_enable_a_periodic_message(page, live_server):
    make_consumer(make_channel("reports"), "warehouse")
    make_producer("scheduler")
    log_in(page, live_server, "/ui/periodic")

    page.click("text=New periodic message")
    page.fill("input[name=channel]", "reports")
    page.fill("input[name=id]", "nightly-stock")
    page.fill("input[name=cron]", "0 2 * * *")
    page.fill("input[name=timeZone]", "Europe/Berlin")
    page.fill("input[name=producer]", "scheduler")
    page.fill("input[name=contentType]", "application/json")
    page.fill("textarea[name=payload]", '{"report": "stock"}')
    page.click("button:text('Create')")

    page.wait_for_url("**/ui/periodic/reports/nightly-stock")
    assert "was created" in page.locator(".messages").inner_text()
    assert page.locator("h1 .status").inner_text() == "enabled"
    created = PeriodicMessage.objects.get()
    assert (created.cron, created.timezone) == ("0 2 * * *", "Europe/Berlin")
    assert created.next_run_at is not None

    screenshot(page, "periodic-message.png")

    page.click("button:text('Disable')")
    assert "is disabled" in page.locator(".messages").inner_text()
    assert page.locator("h1 .status").inner_text() == "disabled"
    assert PeriodicMessage.objects.get().next_run_at is None

    page.click("button:text('Enable')")
    assert "is enabled; next run" in page.locator(".messages").inner_text()
    assert page.locator("h1 .status").inner_text() == "enabled"
    assert PeriodicMessage.objects.get().next_run_at == created.next_run_at

    more_schedules(make_channel("orders"))
    page.click("text=← Periodic messages")
    rows = page.locator("table.periodic tbody tr")
    assert rows.count() == 1
    assert "0 2 * * *" in rows.nth(0).inner_text()

    page.click("text=Clear")
    assert page.locator("table.periodic tbody tr").count() == 3
    screenshot(page, "periodic.png")


def more_schedules(channel: Channel) -> None:
    """Two more, for a list worth looking at: one that has ticked, one disabled."""
    form = {"producer": "scheduler", "payload": b'{"ping": true}'}
    every_5_minutes = {"intervalSeconds": 300, "skipWhilePending": True}
    heartbeat = create_periodic(channel, "heartbeat", {**form, **every_5_minutes})
    assert heartbeat.next_run_at is not None
    run_due_ticks(now=heartbeat.next_run_at + timedelta(minutes=12))  # two ticks missed
    create_periodic(channel, "month-end", {**form, "cron": "0 0 L * *", "enabled": False})


def test_schedule_a_message_and_cancel_it(page, live_server):
    make_consumer(make_channel("orders"), "billing")
    make_producer("shop")
    soon = timezone.now() + timedelta(hours=1)
    for number, minutes in enumerate([5, 90]):  # a list worth looking at in the screenshot
        publish(
            "orders",
            b'{"reminder": %d}' % number,
            producer="shop",
            message_id=f"reminder-{number}",
            scheduled_for=timezone.now() + timedelta(minutes=minutes),
            content_type="application/json",
        )
    log_in(page, live_server, "/ui/scheduled")

    page.click("text=Schedule a message")
    page.fill("input[name=channel]", "orders")
    page.fill("input[name=producer]", "shop")
    page.fill("input[name=message_id]", "invoice-42")
    page.fill("textarea[name=payload]", '{"invoice": 42}')
    screenshot(page, "scheduled-new.png")
    page.fill("input[name=scheduled_for]", soon.strftime("%Y-%m-%dT%H:%M"))
    page.click("button:text('Schedule')")

    page.wait_for_url("**/ui/scheduled?channel=orders")
    assert "Message invoice-42 is scheduled for" in page.locator(".messages").inner_text()
    rows = page.locator("table.scheduled tbody tr")
    assert rows.count() == 3
    assert "invoice-42" in rows.nth(1).inner_text()  # soonest first: 5 min, 1 h, 90 min
    message = Message.objects.get(public_id="invoice-42")
    assert message.status == Message.Status.SCHEDULED
    assert message.scheduled_for == soon.replace(second=0, microsecond=0)
    screenshot(page, "scheduled.png")

    accept_confirm(page)
    with page.expect_navigation():
        rows.nth(1).locator("button:text('Cancel')").click()
    assert "invoice-42 was cancelled" in page.locator(".messages").inner_text()
    assert page.locator("table.scheduled tbody tr").count() == 2
    assert not Message.objects.filter(public_id="invoice-42").exists()
