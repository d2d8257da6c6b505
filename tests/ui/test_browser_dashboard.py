"""The dashboard end to end in headless Chromium: real deliveries to a loopback receiver, counted
by the statistics refresh, shown per consumer with an open circuit, a paused consumer and the
charts (docs/ui.md, issue 7). UI_SCREENSHOTS=1 refreshes docs/screenshots/dashboard.png."""

from __future__ import annotations

import re
from datetime import timedelta

from django.utils import timezone

from broker import publish
from consumers.models import Consumer
from jobs.models import DispatcherHeartbeat
from jobs.stats import refresh_delivery_stats
from tests.helpers import make_channel, make_consumer, make_producer
from tests.receiver import Reply
from tests.ui.browser import browser_test, dispatch_once, log_in, screenshot

pytestmark = browser_test


def consumers_of_orders(receiver) -> None:
    """billing answers 200, audit 503, ledger is paused; refunds/ledger has its own channel."""
    orders = make_channel()
    for consumer_id, path in (("billing", "/billing"), ("audit", "/audit"), ("ledger", "/x")):
        consumer = make_consumer(orders, consumer_id)
        Consumer.objects.filter(pk=consumer.pk).update(callback_url=receiver.url(path))
    Consumer.objects.filter(public_id="ledger").update(paused=True)
    receiver.replies["/audit"] = Reply(status=503, body=b"down for maintenance")


def test_the_dashboard_shows_deliveries_circuits_and_pauses(page, live_server, receiver):
    make_producer()
    consumers_of_orders(receiver)
    for number in range(4):
        publish("orders", {"order": number}, producer="shop")
    results = dispatch_once()
    assert sorted(result.status_code or 0 for result in results) == [200] * 4 + [503] * 4
    Consumer.objects.filter(public_id="audit").update(
        circuit_open_until=timezone.now() + timedelta(minutes=5)
    )
    assert refresh_delivery_stats() == 8
    now = timezone.now()
    DispatcherHeartbeat.objects.create(
        dispatcher_id="host-1:4242:ab12cd34",
        hostname="host-1",
        pid=4242,
        started_at=now - timedelta(hours=2),
        last_beat_at=now,
        delivered=4,
        failed=4,
    )

    log_in(page, live_server, "/ui/")

    assert page.locator("h1").inner_text().startswith("Dashboard")
    billing = page.locator("tr[data-consumer='orders/billing']")
    assert billing.locator("td.success-hour").inner_text() == "100%"
    assert re.fullmatch(r"≈ \d+(\.\d)? (ms|s)", billing.locator("td.p50").inner_text())
    assert billing.locator("td.queued").inner_text() == "0"
    audit = page.locator("tr[data-consumer='orders/audit']")
    assert audit.locator(".badge").all_inner_texts() == ["Circuit open"]
    assert audit.locator("td.success-hour").inner_text() == "0.0%"
    ledger = page.locator("tr[data-consumer='orders/ledger']")
    assert ledger.locator(".badge-paused").inner_text() == "Paused"
    assert ledger.locator("td.queued").inner_text() == "4"
    assert (
        page.locator(".tile.alert", has_text="Open circuits").locator(".tile-value").inner_text()
        == "1"
    )
    charts = page.locator("section.charts svg.chart")
    assert charts.count() == 2
    assert charts.first.locator("rect[fill='#2e7d32']").count() >= 1  # the delivered bar
    assert charts.first.bounding_box()["height"] > 150  # drawn at a readable size
    assert page.locator("table.dispatchers .badge-active").inner_text() == "alive"
    # Why audit fails, on its row: its last answer, what it said, and what holds it now.
    why = page.locator("tr[data-why='orders/audit']")
    assert "HTTP 503" in why.locator(".last-attempt").inner_text()
    assert "down for maintenance" in why.locator(".last-failure").inner_text()
    assert "held back: circuit open until" in why.locator(".next-attempt").inner_text()
    next_of_billing = page.locator("tr[data-why='orders/billing'] .next-attempt").inner_text()
    assert next_of_billing.endswith("nothing queued")
    screenshot(page, "dashboard.png")

    audit.locator("a", has_text="audit").click()  # the second click: its page says the same
    assert "down for maintenance" in page.locator("#last-failure").inner_text()
