"""Failing consumers first (issue 38), in headless Chromium on a desktop screen (1440 by 900) and
on a phone (390 by 844): among 200 consumers the three broken ones (one paused by a 410, one
with its circuit open, one with dead jobs), broken by real answers of a loopback receiver, are
on the first screen; the tiles cut the consumer table down to what they count and the latency
tile orders it; the page fits the phone without sideways scrolling; and the state badges say the
same on the dashboard and on each consumer's page."""

from __future__ import annotations

from datetime import timedelta

from django.utils import timezone

from broker import publish
from consumers.models import Consumer
from tests.delivery import push_consumer
from tests.helpers import make_channel, make_producer
from tests.receiver import Reply
from tests.ui.browser import browser_test, dispatch_once, log_in

pytestmark = browser_test
HEALTHY = 197
BROKEN = ["zulu/gone", "zulu/rejects", "zulu/down"]  # most broken first: see below


def two_hundred_consumers(receiver) -> None:
    """197 healthy consumers in four channels that sort first, and three on "zulu", which sorts
    last, broken by what their endpoints answer to one message: 410 Gone (the broker pauses it),
    422 that it does not retry (a dead job), 503 (and its circuit is open)."""
    make_producer()
    now = timezone.now()
    channels = [make_channel(name) for name in ("alpha", "bravo", "charlie", "delta")]
    Consumer.objects.bulk_create(
        Consumer(
            channel=channels[number % 4],
            public_id=f"consumer-{number:03}",
            name=f"Consumer {number:03}",
            callback_url="http://127.0.0.1:9/hook",
            changed_at=now,
        )
        for number in range(HEALTHY)
    )
    zulu = make_channel("zulu")
    push_consumer(zulu, receiver, "gone", "/gone")
    push_consumer(zulu, receiver, "rejects", "/rejects", non_retryable_statuses=[422])
    push_consumer(zulu, receiver, "down", "/down")
    receiver.replies["/gone"] = Reply(410, body=b"this endpoint was removed")
    receiver.replies["/rejects"] = Reply(422, body=b"unknown order schema")
    receiver.replies["/down"] = Reply(503, body=b"down for maintenance")
    publish("zulu", {"order": 1}, producer="shop")
    assert sorted(result.status_code or 0 for result in dispatch_once()) == [410, 422, 503]
    Consumer.objects.filter(public_id="down").update(
        circuit_open_until=timezone.now() + timedelta(minutes=5)
    )
    assert Consumer.objects.count() == 200
    assert Consumer.objects.get(public_id="gone").paused  # the dispatcher paused it


def within_first_screen(page, selector: str) -> bool:
    box = page.locator(selector).bounding_box()
    assert box is not None, selector
    return bool(box["y"] >= 0 and box["y"] + box["height"] <= page.viewport_size["height"])


def badges_of(page, selector: str) -> list[str]:
    return list(page.locator(f"{selector} .badge").all_inner_texts())


def test_the_broken_consumers_are_on_the_first_screen(screen, live_server, receiver):
    page = screen
    two_hundred_consumers(receiver)

    log_in(page, live_server, "/ui/")

    # Dead jobs first (gone's 410 and rejects' 422 each left one; gone is also paused), then
    # the open circuit.
    cards = page.locator("[data-attention]")
    assert [cards.nth(n).get_attribute("data-attention") for n in range(cards.count())] == BROKEN
    for key in BROKEN:
        assert within_first_screen(page, f"[data-attention='{key}']"), key
    table = page.locator("#consumer-table tr.consumer")
    assert [table.nth(n).get_attribute("data-consumer") for n in range(3)] == BROKEN
    assert table.count() == 200
    # The badges: a 410's pause says so, an open circuit never sits beside "Active".
    assert badges_of(page, "[data-attention='zulu/gone']") == ["Paused: 410 Gone"]
    assert badges_of(page, "[data-attention='zulu/down']") == ["Circuit open"]
    assert badges_of(page, "tr[data-consumer='zulu/down']") == ["Circuit open"]
    assert badges_of(page, "tr[data-consumer='zulu/rejects']") == ["Active"]
    # No sideways scrolling, on the phone too: the consumers are cards there, not a clipped table.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_the_tiles_filter_the_consumer_table(screen, live_server, receiver):
    page = screen
    two_hundred_consumers(receiver)
    log_in(page, live_server, "/ui/")

    page.locator("a.tile", has_text="Open circuits").click()
    page.wait_for_url("**/ui/?show=circuit-open#consumers")
    rows = page.locator("#consumer-table tr.consumer")
    assert rows.count() == 1
    assert rows.first.get_attribute("data-consumer") == "zulu/down"
    assert within_first_screen(page, "tr[data-consumer='zulu/down']")  # the page went to it
    assert page.locator("a.tile.selected").inner_text().startswith("Open circuits")

    page.locator("a.tile", has_text="Dead").click()
    page.wait_for_url("**/ui/?show=dead#consumers")
    rows = page.locator("#consumer-table tr.consumer")
    assert [rows.nth(n).get_attribute("data-consumer") for n in range(rows.count())] == BROKEN[:2]

    page.locator("a.tile", has_text="Paused consumers").click()
    page.wait_for_url("**/ui/?show=paused#consumers")
    assert page.locator("#consumer-table tr.consumer").count() == 1

    # The latency tile: the consumers slowest first (those that delivered; here none did, so
    # still most broken first), live from the per-minute statistics.
    page.locator("a.tile", has_text="p95 latency").click()
    page.wait_for_url("**/ui/?show=paused&order=latency#consumers")
    page.locator(".table-views a", has_text="all (200)").click()
    page.wait_for_url("**/ui/?order=latency#consumers")
    assert page.locator("#consumer-table tr.consumer").count() == 200
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_a_phone_shows_each_consumer_as_a_card(phone_page, live_server, receiver):
    page = phone_page
    two_hundred_consumers(receiver)
    log_in(page, live_server, "/ui/?show=dead")

    row = page.locator("tr[data-consumer='zulu/rejects']")
    assert row.evaluate("tr => getComputedStyle(tr).display") == "grid"
    box = row.bounding_box()
    assert box is not None
    assert box["x"] >= 0
    assert box["x"] + box["width"] <= 390
    # Each figure carries its label, the table's header being hidden.
    dead = row.locator("td.dead")
    label = dead.evaluate("td => getComputedStyle(td, '::before').content")
    assert label == '"Dead"'
    assert dead.inner_text() == "1"
    table = page.locator("#consumer-table")
    assert table.evaluate("t => t.scrollWidth <= t.clientWidth")


def test_the_consumer_page_says_what_the_dashboard_says(screen, live_server, receiver):
    page = screen
    two_hundred_consumers(receiver)
    log_in(page, live_server, "/ui/")

    for consumer in ("gone", "down"):
        page.goto(f"{live_server.url}/ui/")
        on_dashboard = badges_of(page, f"tr[data-consumer='zulu/{consumer}']")
        page.locator(f"tr[data-consumer='zulu/{consumer}'] a", has_text=consumer).click()
        page.wait_for_url(f"**/ui/consumers/zulu/{consumer}")

        assert badges_of(page, "h1") == on_dashboard, consumer
        assert "Active" not in page.locator("h1").inner_text()
