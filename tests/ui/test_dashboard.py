"""The dashboard at /ui/ through Django's test client, and its SVG charts (docs/ui.md, issue 7)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta
from html.parser import HTMLParser

import pytest
import time_machine
from django.contrib.auth.models import User
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.models import Channel, Message
from broker.ui.charts import Series, compact_number, nice_scale, stacked_bars
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, DeliveryStats, DispatcherHeartbeat, Job
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from jobs.stats import refresh_delivery_stats
from tests.helpers import make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db
SVG = "{http://www.w3.org/2000/svg}"


def job(consumer: Consumer, status=QUEUED, received_at=None) -> Job:
    message = Message.objects.create(
        channel_id=consumer.channel_id,
        producer_id="shop",
        public_id=f"m-{Message.objects.count()}",
        payload=b"{}",
        content_type="application/json",
        status=Message.Status.DISPATCHED,
        received_at=received_at or timezone.now(),
    )
    return Job.objects.create(message=message, consumer=consumer, status=status)


def attempt(consumer: Consumer, ago: timedelta, status_code: int | None, latency_ms=100.0):
    """An attempt that started `ago` and was answered `latency_ms` after its message came."""
    started_at = timezone.now() - ago
    received_at = started_at - timedelta(milliseconds=latency_ms)
    DeliveryAttempt.objects.create(
        job=job(consumer, DELIVERED, received_at),
        attempt_number=1,
        started_at=started_at,
        duration_ms=0.0,
        status_code=status_code,
        error_class="" if status_code == 200 else "http-status",
        dispatcher_id="d1",
    )


def heartbeat(dispatcher_id: str, ago: timedelta) -> None:
    now = timezone.now()
    DispatcherHeartbeat.objects.create(
        dispatcher_id=dispatcher_id,
        hostname="worker-1",
        pid=4242,
        started_at=now - timedelta(hours=1),
        last_beat_at=now - ago,
        in_flight=3,
        delivered=1200,
        failed=7,
    )


class Rows(HTMLParser):
    """The cells' text of each consumer row (<tr data-consumer="channel/consumer">)."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self._row: list[str] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs).get("data-consumer")
        if tag == "tr" and found:
            self._row = self.rows.setdefault(found, [])
        elif tag == "td" and self._row is not None:
            self._row.append("")

    def handle_endtag(self, tag: str) -> None:
        if tag == "tr":
            self._row = None

    def handle_data(self, data: str) -> None:
        if self._row:
            self._row[-1] = " ".join((self._row[-1] + " " + data).split())


def consumer_rows(response) -> dict[str, list[str]]:
    parser = Rows()
    parser.feed(response.content.decode())
    return parser.rows


def title_of(element: ET.Element) -> str:
    return element.findtext(f"{SVG}title", "")


def texts_of(svg: ET.Element) -> list[str]:
    return [text.text or "" for text in svg.iter(f"{SVG}text")]


def tiles(response) -> dict[str, str]:
    return {tile.label: tile.value for tile in response.context["tiles"]}


@pytest.fixture
def broker_state():
    """Two channels: billing (busy, failing now and then), audit (paused, circuit open), reader
    (pull, idle), ledger on another channel (circuit half-open); two dispatchers, one stale."""
    make_producer()
    orders = make_channel()
    billing = make_consumer(orders, "billing")
    audit = make_consumer(orders, "audit")
    Consumer.objects.filter(pk=audit.pk).update(
        paused=True, circuit_open_until=timezone.now() + timedelta(minutes=10)
    )
    make_consumer(orders, "reader", type=Consumer.Type.PULL)
    ledger = make_consumer(Channel.objects.create(id="refunds", name="Refunds"), "ledger")
    Consumer.objects.filter(pk=ledger.pk).update(
        circuit_open_until=timezone.now() - timedelta(seconds=5)
    )
    for status, count in ((QUEUED, 3), (INFLIGHT, 1), (DEAD, 2)):
        for _ in range(count):
            job(billing, status)
    for latency in (120.0, 120.0, 5000.0):
        attempt(billing, timedelta(minutes=5), 200, latency)
    attempt(billing, timedelta(minutes=4), 503)
    for _ in range(4):
        attempt(billing, timedelta(hours=3), None)  # outside the hour, inside the day
    refresh_delivery_stats()
    heartbeat("host-1:11:aa", timedelta(seconds=2))
    heartbeat("host-2:22:bb", timedelta(minutes=2))
    return billing


def test_the_dashboard_needs_a_staff_login(client):
    response = client.get("/ui/")
    assert response.status_code == 302
    assert response["Location"] == "/admin/login/?next=/ui/"

    client.force_login(User.objects.create_user("someone", password="pw"))  # not staff
    assert client.get("/ui/").status_code == 302


def test_each_consumer_row_shows_its_figures(staff_client, broker_state):
    response = staff_client.get("/ui/")

    assert response.status_code == 200
    rows = consumer_rows(response)
    # Most broken first: dead jobs, then an open circuit, then a half-open one, then the rest.
    assert list(rows) == ["orders/billing", "orders/audit", "refunds/ledger", "orders/reader"]
    _name, kind, state, queued, in_flight, dead, rate, hour, day, p50, p95 = rows["orders/billing"]
    assert (kind, state, queued, in_flight, dead) == ("push", "Active", "3", "1", "2")
    assert rate == "0.1/min"  # 3 delivered in the last hour
    assert (hour, day) == ("75.0%", "37.5%")  # 3 of 4; 3 of 8 with the 4 failures of 3 h ago
    # The middles of the 120 ms and 5 s buckets: estimates, and shown as such.
    assert (p50, p95) == ("≈ 115 ms", "≈ 4.9 s")
    assert rows["orders/audit"][2] == "Paused Circuit open"  # and never "Active" beside them
    assert rows["orders/reader"][1:] == ["pull", "Active", "0", "0", "0", *["—"] * 5]
    assert rows["refunds/ledger"][2] == "Circuit half-open"
    assert rows["orders/billing"][0].startswith("orders / billing")  # its channel on its row
    assert 'href="/ui/dead-jobs?channel=orders&amp;consumer=billing"' in response.content.decode()


def test_the_tiles_add_up_the_consumers(staff_client, broker_state):
    response = staff_client.get("/ui/")

    assert tiles(response) == {
        "Queued": "3",
        "In flight": "1",
        "Dead": "2",
        "Delivered, last hour": "3",
        "Success rate, last hour": "75.0%",
        "p95 latency, last hour": "≈ 4.9 s",
        "Open circuits": "1",
        "Paused consumers": "1",
        "Dispatchers": "1 of 2",
    }
    alerts = {tile.label for tile in response.context["tiles"] if tile.alert}
    # One live dispatcher is enough: the stale one is flagged in the table, not as an alert.
    assert alerts == {"Dead", "Open circuits", "Paused consumers"}


def test_stale_dispatchers_are_flagged(staff_client, broker_state):
    response = staff_client.get("/ui/")

    beats = {beat.heartbeat.dispatcher_id: beat.stale for beat in response.context["beats"]}
    assert beats == {"host-1:11:aa": False, "host-2:22:bb": True}
    html = response.content.decode()
    assert re.search(r'<tr class="stale">\s*<td[^>]*><code>host-2:22:bb</code>', html)
    assert ">stale</span>" in html


def test_counts_past_the_bound_show_as_a_lower_bound(staff_client, broker_state, monkeypatch):
    monkeypatch.setattr("broker.ui.dashboard.COUNT_LIMIT", 2)

    response = staff_client.get("/ui/")

    assert consumer_rows(response)["orders/billing"][3:6] == ["≥ 2", "1", "2"]
    # The tiles count every consumer's jobs on their own: exact, not a sum of capped counts.
    queued, dead = (Job.objects.filter(status=status).count() for status in (QUEUED, DEAD))
    assert queued > 2
    assert tiles(response)["Queued"] == f"{queued:,}"
    assert tiles(response)["Dead"] == f"{dead:,}"


def test_tiles_past_their_own_bound_show_as_a_lower_bound(staff_client, broker_state, monkeypatch):
    monkeypatch.setattr("broker.ui.dashboard.TOTAL_LIMIT", 2)

    assert tiles(staff_client.get("/ui/"))["Queued"] == "≥ 2"


def test_each_tile_links_to_what_it_counts(staff_client, broker_state):
    links = {tile.label: tile.link for tile in staff_client.get("/ui/").context["tiles"]}

    # The tiles of broken things cut the consumer table down to the consumers they count.
    assert links["Dead"] == "/ui/?show=dead#consumers"
    assert links["Open circuits"] == "/ui/?show=circuit-open#consumers"
    assert links["Paused consumers"] == "/ui/?show=paused#consumers"
    assert links["Queued"] == "/ui/#consumers"
    # Latency: the live figures behind it, the consumers slowest first.
    assert links["p95 latency, last hour"] == "/ui/?order=latency#consumers"
    assert links["Dispatchers"] == "#dispatchers"
    assert links["Success rate, last hour"] == "/ui/reports"


@pytest.mark.parametrize(
    ("show", "shown"),
    [
        ("dead", ["orders/billing"]),
        ("circuit-open", ["orders/audit"]),
        ("paused", ["orders/audit"]),
        ("attention", ["orders/billing", "orders/audit", "refunds/ledger"]),
        ("no-such-view", ["orders/billing", "orders/audit", "refunds/ledger", "orders/reader"]),
    ],
)
def test_the_tiles_filter_the_consumer_table(staff_client, broker_state, show, shown):
    response = staff_client.get("/ui/", {"show": show})

    assert list(consumer_rows(response)) == shown
    selected = [tile.label for tile in response.context["tiles"] if tile.selected]
    tile_of = {"dead": "Dead", "circuit-open": "Open circuits", "paused": "Paused consumers"}
    assert selected == ([tile_of[show]] if show in tile_of else [])
    # The tiles still count every consumer.
    assert tiles(response)["Open circuits"] == "1"


def test_a_view_that_keeps_nobody_says_so(staff_client, broker_state):
    Consumer.objects.update(paused=False)

    html = staff_client.get("/ui/?show=paused").content.decode()

    assert "No consumers paused." in html
    assert 'aria-current="true">paused (0)</a>' in html


def test_the_latency_view_shows_the_slowest_first(staff_client, broker_state):
    slow = make_consumer(Channel.objects.get(pk="orders"), "slow")
    attempt(slow, timedelta(minutes=3), 200, latency_ms=60_000.0)
    refresh_delivery_stats()

    response = staff_client.get("/ui/?order=latency")

    # By p95; those without deliveries after them, most broken first.
    assert list(consumer_rows(response)) == [
        "orders/slow",
        "orders/billing",
        "orders/audit",
        "refunds/ledger",
        "orders/reader",
    ]
    assert [tile.label for tile in response.context["tiles"] if tile.selected] == [
        "p95 latency, last hour"
    ]


def test_the_consumers_that_need_attention_come_first_as_cards(staff_client, broker_state):
    html = staff_client.get("/ui/").content.decode()

    cards = re.findall(r'data-attention="([^"]+)"', html)
    assert cards == ["orders/billing", "orders/audit", "refunds/ledger"]
    # First on the page: above the tiles, the charts and the consumer table.
    assert html.index('id="attention"') < html.index('id="tiles"') < html.index('id="consumers"')
    card = html.split('data-attention="orders/audit"')[1].split("</li>")[0]
    assert '>Paused</span> <span class="badge badge-circuit-open"' in card


def test_a_healthy_broker_says_nothing_needs_attention(staff_client):
    make_consumer(make_channel(), "billing")

    html = staff_client.get("/ui/").content.decode()

    assert "data-attention" not in html
    assert "No consumer needs attention" in html


def test_a_heartbeat_ahead_of_the_clock_reads_just_now(staff_client):
    heartbeat("host-1:11:aa", -timedelta(seconds=2))  # its host's clock runs 2 s fast
    heartbeat("host-2:22:bb", timedelta(minutes=3, seconds=5))

    html = staff_client.get("/ui/").content.decode()

    assert "(just now)" in html
    assert "(3 min ago)" in html
    assert not re.search(r"\(-\d", html)  # never "(-2 s ago)"


@pytest.fixture
def half_past_twelve():
    """The clock at 12:34:30 UTC, moving: where the charts' axes start decides which labels fit
    on the canvas (one at its very edge is left out), so the test does not read the real time."""
    with time_machine.travel(datetime(2026, 3, 2, 12, 34, 30, tzinfo=UTC), tick=True):
        yield


def test_the_charts_are_well_formed_svg_with_the_deliveries(
    half_past_twelve, staff_client, broker_state
):
    html = staff_client.get("/ui/").content.decode()

    found = re.findall(r"<svg.*?</svg>", html, re.DOTALL)
    charts = [ET.fromstring(svg) for svg in found]  # noqa: S314 (our own page)

    assert [title_of(chart) for chart in charts] == [
        "Deliveries per minute, last hour (UTC)",
        "Deliveries per hour, last 24 hours (UTC)",
    ]
    minute_bars, hour_bars = (chart.findall(f"{SVG}g[@class='bar']") for chart in charts)
    assert (len(minute_bars), len(hour_bars)) == (60, 24)
    tooltips = [title_of(bar) for bar in minute_bars]
    assert sum("delivered 3, failed 0" in text for text in tooltips) == 1
    assert sum("delivered 0, failed 1" in text for text in tooltips) == 1
    assert any("delivered 0, failed 4" in title_of(bar) for bar in hour_bars)
    minute_labels = [text for text in texts_of(charts[0]) if ":" in text]
    hour_labels = [text for text in texts_of(charts[1]) if ":" in text]
    assert len(minute_labels) == 6
    assert all(label.endswith("0") for label in minute_labels)  # on round ten minutes
    assert len(hour_labels) == 8
    assert all(int(label[:2]) % 3 == 0 and label.endswith(":00") for label in hour_labels)


def test_a_stopped_refresh_is_reported(staff_client, broker_state):
    assert response_says_behind(staff_client) is False
    billing = broker_state
    # The refresh last ran half an hour ago; attempts have been recorded since.
    DeliveryStats.objects.update(period_start=F("period_start") - timedelta(minutes=30))
    attempt(billing, timedelta(seconds=5), 200)

    assert response_says_behind(staff_client) is True


def response_says_behind(client) -> bool:
    return "Delivery statistics are behind" in client.get("/ui/").content.decode()


def test_the_query_count_grows_neither_with_jobs_nor_with_consumers(staff_client):
    make_producer()
    billing = make_consumer(make_channel(), "billing")
    job(billing, DEAD)
    attempt(billing, timedelta(minutes=2), 200)
    refresh_delivery_stats()
    with CaptureQueriesContext(connection) as few:
        assert staff_client.get("/ui/").status_code == 200

    others = [make_consumer(Channel.objects.get(), f"c{n}") for n in range(5)]
    for consumer in [billing, *others]:
        for status in (QUEUED, INFLIGHT, DEAD):
            job(consumer, status)
        for minutes in range(1, 30, 3):
            attempt(consumer, timedelta(minutes=minutes), 200 if minutes % 2 else 500)
    refresh_delivery_stats()
    with CaptureQueriesContext(connection) as many:
        assert staff_client.get("/ui/").status_code == 200
    for view in ("?show=dead", "?show=attention", "?order=latency"):
        with CaptureQueriesContext(connection) as filtered:
            assert staff_client.get(f"/ui/{view}").status_code == 200
        assert len(filtered) == len(few), view

    assert len(many) == len(few)
    counts = [q["sql"] for q in many if "COUNT(" in q["sql"].upper()]
    assert counts, "the bounded queue counts"
    assert all("LIMIT" in sql.upper() for sql in counts)  # never an unbounded COUNT


def test_an_empty_broker_shows_an_empty_dashboard(staff_client):
    response = staff_client.get("/ui/")

    html = response.content.decode()
    assert "No consumers yet." in html
    assert "No dispatcher has reported" in html
    assert tiles(response)["Success rate, last hour"] == "—"
    assert html.count("Nothing yet") == 2  # both charts


# --- broker/ui/charts.py
# -------------------------------------------------------------------------------


def test_stacked_bars_scale_to_the_tallest_bar():
    svg = ET.fromstring(  # noqa: S314 (our own output)
        stacked_bars(
            "Deliveries <per minute>",
            ["10:00", "10:01", "10:02"],
            [Series("delivered", [6, 0, 2], "green"), Series("failed", [2, 4, 0], "red")],
        )
    )

    assert title_of(svg) == "Deliveries <per minute>"
    bars = svg.findall(f"{SVG}g[@class='bar']")
    heights = [
        [
            (rect.get("fill", ""), float(rect.get("height", "")))
            for rect in bar.findall(f"{SVG}rect")
        ]
        for bar in bars
    ]
    unit = heights[0][0][1] / 6  # the axis tops at 8: the tallest stack, 6 + 2, fills it
    assert [[fill for fill, _ in bar] for bar in heights] == [["green", "red"], ["red"], ["green"]]
    assert [[round(height / unit, 2) for _, height in bar] for bar in heights] == [[6, 2], [4], [2]]
    assert 8 * unit == pytest.approx(240 - 44 - 30)  # the plot's height
    labels = texts_of(svg)
    assert {"10:00", "10:01", "10:02", "delivered", "failed", "0", "8"} <= set(labels)


def test_x_labels_can_be_thinned_out():
    labels = [f"{minute:02}" for minute in range(60)]
    bars = [Series("delivered", [1] * 60, "green")]
    svg = ET.fromstring(stacked_bars("t", labels, bars, label_every=10))  # noqa: S314
    texts = set(texts_of(svg))
    assert {"00", "10", "50"} <= texts
    assert "05" not in texts
    svg = ET.fromstring(stacked_bars("t", labels, bars, label_every=10, first_label=3))  # noqa: S314
    texts = set(texts_of(svg))
    assert {"03", "13", "53"} <= texts
    assert "10" not in texts


def test_a_series_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="one value per label"):
        stacked_bars("t", ["a", "b"], [Series("delivered", [1], "green")])


@pytest.mark.parametrize(
    ("largest", "scale"),
    [
        (0, (1, 0.25)),
        (7, (8, 2)),
        (8, (8, 2)),
        (9, (10, 5)),
        (1234, (1500, 500)),
        (0.3, (0.3, 0.1)),
    ],
)
def test_nice_scale(largest, scale):
    top, step = nice_scale(largest)
    assert (top, step) == pytest.approx(scale)


def test_compact_number():
    assert [compact_number(n) for n in (0, 12, 1500, 2_000_000, 0.25)] == [
        "0",
        "12",
        "1.5k",
        "2M",
        "0.25",
    ]
