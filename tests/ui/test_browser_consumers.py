"""Consumer pages end to end in headless Chromium: log in, open the list and a consumer, pause
and resume it, send a test event to a real receiver and see its answer (docs/ui.md).

Set UI_SCREENSHOTS=1 to refresh docs/screenshots/consumers.png and consumer.png.
"""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from broker.models import Channel
from consumers.models import Consumer
from jobs.states import DEAD, QUEUED
from jobs.stats import refresh_delivery_stats
from tests.helpers import make_channel, make_consumer, make_job, make_producer
from tests.ui.browser import browser_test, log_in, screenshot
from tests.ui.test_consumers import stats_attempt

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


# Issue 38: the consumer page's figures before its settings, on a desktop and a phone; the new
# consumer form's groups, catalogue and copy buttons.

DESKTOP = {"width": 1440, "height": 900}
# Elements that scroll sideways inside the page: wider content than their box, overflow-x on.
SCROLLING_SIDEWAYS = """() => [...document.body.querySelectorAll("*")]
  .filter((el) => ["auto", "scroll"].includes(getComputedStyle(el).overflowX)
    && el.scrollWidth > el.clientWidth + 1)
  .map((el) => el.tagName + "." + el.className)"""


def with_figures() -> Consumer:
    """orders/billing with attempts of the last hour and day, counted by the statistics."""
    billing = some_consumers("http://127.0.0.1:9/a-rather-long-callback-path/that-goes/on-and-on")
    for status in (200, 200, 404, 503, None):
        stats_attempt(billing, timedelta(minutes=4), status)
    stats_attempt(billing, timedelta(hours=5), 500)
    refresh_delivery_stats()
    return billing


def top_of(page, selector: str) -> float:
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    return float(box["y"])


def test_the_consumer_page_shows_its_figures_before_its_settings_at_1440(page, live_server):
    with_figures()
    page.set_viewport_size(DESKTOP)
    log_in(page, live_server, "/ui/consumers/orders/billing")

    assert top_of(page, "#delivery") < top_of(page, "#figures") < top_of(page, "#settings")
    assert top_of(page, "#recent-attempts") < top_of(page, "#settings")
    assert page.locator("#figure-table tr.attempts td").all_inner_texts() == ["5", "6"]
    assert page.locator("#figure-table tr.class-5xx td").all_inner_texts() == [
        "1 (20.0%)",
        "2 (33.3%)",
    ]
    assert page.locator("#figure-table tr.p95 td").first.inner_text().startswith("≈ ")
    charts = page.locator("#figures svg.chart")
    assert charts.count() == 2
    first, second = (charts.nth(i).bounding_box() for i in range(2))
    assert first is not None
    assert second is not None
    assert first["y"] == second["y"]  # side by side on a wide screen
    row = page.locator("#attempt-table tbody tr").first
    assert row.evaluate("tr => getComputedStyle(tr).display") == "table-row"


def test_the_consumer_page_reads_as_cards_at_390(phone_page, live_server):
    with_figures()
    log_in(phone_page, live_server, "/ui/consumers/orders/billing")

    assert phone_page.evaluate("document.documentElement.scrollWidth") <= 390
    assert phone_page.evaluate(SCROLLING_SIDEWAYS) == []
    assert top_of(phone_page, "#delivery") < top_of(phone_page, "#settings")
    assert top_of(phone_page, "#figures") < top_of(phone_page, "#settings")
    cards = phone_page.locator("#attempt-table tbody tr")
    assert cards.count() == 6  # the five of the last hour, the one of five hours ago
    assert cards.first.evaluate("tr => getComputedStyle(tr).display") == "block"
    # The column heads stay for screen readers, out of sight: each card labels its values.
    for head in phone_page.locator("#attempt-table thead th").all():
        box = head.bounding_box()
        assert box is not None
        assert box["width"] <= 1
        assert box["x"] + box["width"] <= 390
    assert cards.first.locator("td[data-label='Outcome']").is_visible()
    for index in range(2):
        chart = phone_page.locator("#figures svg.chart").nth(index).bounding_box()
        assert chart is not None
        assert chart["x"] + chart["width"] <= 390


def catalogue() -> None:
    from broker.models import EventType

    make_channel("orders")
    make_channel("refunds")
    EventType.objects.create(channel_id="orders", name="order.created", description="Placed.")
    EventType.objects.create(channel_id="orders", name="order.paid")
    EventType.objects.create(channel_id="refunds", name="refund.issued")


def test_a_new_consumer_from_the_grouped_form_and_its_copied_token_at_1440(page, live_server):
    catalogue()
    page.set_viewport_size(DESKTOP)
    page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    log_in(page, live_server, "/ui/consumers/new")

    legends = page.locator("fieldset.group > legend").all_inner_texts()
    assert legends == ["Where", "What", "How fast", "How safe"]
    assert page.locator("#channel-suggestions option").count() == 2
    assert page.locator(".catalogue-group").count() == 2
    assert page.locator(".catalogue-group:visible").count() == 0  # none typed: none offered
    page.fill("#id_channel", "orders")
    assert page.locator(".catalogue-group:visible").count() == 1
    assert page.locator("[data-channel='refunds']").is_hidden()
    assert "Blank: 100." in page.locator("#id_max_in_flight ~ .help").inner_text()
    page.check("input[value='orders/order.created']")
    page.fill("#id_consumer_id", "billing")
    page.fill("#id_callback_url", "http://127.0.0.1:9/billing")
    page.click("button:text('Create consumer')")
    page.wait_for_selector("#consumer-token")

    consumer = Consumer.objects.get(public_id="billing")
    assert consumer.event_types == ["order.created"]
    token = page.locator("#consumer-token").inner_text()
    assert consumer.check_token(token)
    page.click("button:text('Copy token')")
    page.wait_for_selector("button:text('Copied')")
    assert page.evaluate("navigator.clipboard.readText()") == token


def test_the_form_and_the_secret_fit_a_phone_and_the_secret_copies_at_390(phone_page, live_server):
    catalogue()
    billing = make_consumer(Channel.objects.get(pk="orders"), "billing")
    phone_page.context.grant_permissions(["clipboard-read", "clipboard-write"])
    log_in(phone_page, live_server, "/ui/consumers/new")

    phone_page.fill("#id_channel", "refunds")
    assert phone_page.locator(".catalogue-group:visible").count() == 1
    assert phone_page.evaluate("document.documentElement.scrollWidth") <= 390
    assert phone_page.evaluate(SCROLLING_SIDEWAYS) == []

    phone_page.goto(f"{live_server.url}/ui/consumers/orders/billing/secret/reveal")
    phone_page.click("button:text('Reveal the secret')")
    phone_page.wait_for_selector("#signing-secret")
    assert phone_page.evaluate("document.documentElement.scrollWidth") <= 390
    phone_page.click("button:text('Copy secret')")
    phone_page.wait_for_selector("button:text('Copied')")
    assert phone_page.evaluate("navigator.clipboard.readText()") == billing.signing_secret
