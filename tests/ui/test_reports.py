"""Operator UI: the reports page over the `spark_etl report` table (docs/ui.md; docs/spark_etl.md),
through Django's test client and in headless Chromium."""

from __future__ import annotations

import itertools
import xml.etree.ElementTree as ET
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from broker.ui.charts import LABEL_GAP, SVG_NS, WIDTH, Series, label_width, line_chart, stacked_bars
from broker.ui.report_pages import MAX_PERIODS, STEP, label_spacing
from jobs.models import DeliveryReport
from tests.ui.browser import log_in, screenshot

TODAY = timezone.now().astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def report_row(consumer: str, period: datetime, grain: str = "day", **figures) -> DeliveryReport:
    values = {
        "messages": 10,
        "jobs": 10,
        "delivered": 8,
        "dead": 1,
        "success_rate": 8 / 9,
        "first_attempt_success_rate": 0.7,
        "mean_attempts": 1.5,
        "latency_p50_ms": 120.0,
        "latency_p95_ms": 900.0,
        "latency_p99_ms": 1500.0,
        "top_failures": "503:4,timeout:2",
    }
    values.update(figures)
    return DeliveryReport.objects.create(
        grain=grain, period_start=period, channel_id="orders", consumer_id=consumer, **values
    )


@pytest.mark.django_db
def test_the_page_needs_a_staff_login(client):
    response = client.get("/ui/reports")
    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]
    client.force_login(User.objects.create_user("someone", password="pw"))
    assert client.get("/ui/reports").status_code == 302


@pytest.mark.django_db
def test_consumer_totals_and_latest_rows(staff_client):
    report_row("billing", TODAY - timedelta(days=1), delivered=8, dead=2, mean_attempts=2.0)
    report_row("billing", TODAY, delivered=5, dead=0, mean_attempts=1.0, latency_p95_ms=2500.0)
    report_row("shipping", TODAY, jobs=3, delivered=0, dead=0, success_rate=None)
    report_row("billing", TODAY - timedelta(days=40))  # outside the default 30 days

    response = staff_client.get("/ui/reports")

    assert response.status_code == 200
    totals = {row.consumer_id: row for row in response.context["consumers"]}
    billing = totals["billing"]
    assert (billing.jobs, billing.delivered, billing.dead) == (20, 13, 2)
    assert billing.success_rate == pytest.approx(13 / 15)
    assert billing.mean_attempts == pytest.approx((2.0 * 10 + 1.0 * 5) / 15)  # exact mean
    assert billing.worst_p95_ms == 2500.0
    assert totals["shipping"].success_rate is None
    assert len(response.context["latest"]) == 3
    page = response.content.decode()
    assert "503:4,timeout:2" in page
    assert "86.6 %" in page  # billing: 13 of 15, rounded down
    assert page.count("<svg") == 3


@pytest.mark.django_db
def test_filters_by_consumer_and_grain(staff_client):
    report_row("billing", TODAY)
    report_row("shipping", TODAY)
    report_row("billing", TODAY + timedelta(hours=3), grain="hour")

    by_consumer = staff_client.get("/ui/reports", {"consumer": "shipping"})
    assert [row.consumer_id for row in by_consumer.context["consumers"]] == ["shipping"]
    hourly = staff_client.get("/ui/reports", {"grain": "hour", "until": TODAY + timedelta(hours=5)})
    assert [row.period_start for row, _, _ in hourly.context["latest"]] == [
        TODAY + timedelta(hours=3)
    ]
    assert hourly.context["until"] - hourly.context["since"] == timedelta(hours=48)


@pytest.mark.django_db
def test_a_range_is_capped(staff_client):
    response = staff_client.get("/ui/reports", {"grain": "hour", "since": "2020-01-01T00:00"})
    assert response.context["until"] - response.context["since"] == timedelta(days=14)


@pytest.mark.django_db
def test_queries_do_not_grow_with_rows(staff_client):
    def queries() -> int:
        with CaptureQueriesContext(connection) as captured:
            assert staff_client.get("/ui/reports").status_code == 200
        return len(captured)

    report_row("billing", TODAY)
    few = queries()
    DeliveryReport.objects.bulk_create(
        DeliveryReport(
            grain="day",
            period_start=TODAY - timedelta(days=day),
            channel_id="orders",
            consumer_id=f"c{number}",
            messages=1,
            jobs=1,
            delivered=1,
            dead=0,
        )
        for day in range(1, 25)
        for number in range(20)
    )
    assert queries() == few


@pytest.mark.django_db(transaction=True)
@pytest.mark.needs_tool("chromium")
def test_reports_page_in_a_browser(page, live_server):
    for day in range(14):
        for consumer, dead in (("billing", day % 3), ("shipping", 4 if day == 9 else 0)):
            report_row(
                consumer,
                TODAY - timedelta(days=day),
                jobs=120 + 7 * day,
                delivered=118 + 7 * day - dead,
                dead=dead,
                success_rate=(118 + 7 * day - dead) / (118 + 7 * day),
                latency_p50_ms=80.0 + 5 * (day % 4),
                latency_p95_ms=600.0 + 90 * (day % 5),
                latency_p99_ms=1500.0 + 200 * (day % 3),
            )

    log_in(page, live_server, "/ui/reports")

    assert page.locator("h1").inner_text().startswith("Delivery reports")
    assert page.locator(".report-charts svg").count() == 3
    assert page.locator("table.report-consumers tbody tr").count() == 2
    screenshot(page, "reports.png")
    page.click("table.report-consumers >> text=shipping")
    page.wait_for_url("**consumer=shipping**")
    assert page.locator("table.report-consumers tbody tr").count() == 1
    assert page.locator("table.report-rows tbody tr").count() == 14


# --- x labels that never overlap (issue 38) ---------------------------------------------------


def x_labels(svg: str) -> list[tuple[float, str]]:
    """The x axis's labels of a chart: (x, text), left to right."""
    tree = ET.fromstring(svg)  # noqa: S314 (our own output)
    axis = tree.find(f"{{{SVG_NS}}}g[@class='x-axis']")
    assert axis is not None
    return [(float(text.get("x", "")), text.text or "") for text in axis.iter(f"{{{SVG_NS}}}text")]


@pytest.mark.parametrize("grain", ["hour", "day"])
def test_x_labels_are_at_least_a_label_apart_however_many_periods(grain):
    start = datetime(2026, 11, 1, 0, 0, tzinfo=UTC)
    for count in range(1, MAX_PERIODS[grain] + 1):
        periods = [start + i * STEP[grain] for i in range(count)]
        labels = [p.strftime("%m-%d" if grain == "day" else "%d %H:00") for p in periods]
        every, first = label_spacing(periods, labels, grain)
        shown = x_labels(line_chart("t", labels, [], label_every=every, first_label=first))

        assert shown, count
        for (left, text), (right, _) in itertools.pairwise(shown):
            assert right - left >= label_width(text) + LABEL_GAP, (count, text)
        for x, text in shown:  # within the canvas
            assert label_width(text) / 2 <= x <= WIDTH - label_width(text) / 2
        if grain == "hour" and every <= 24:  # on round hours
            assert {int(text[-5:-3]) % every for _, text in shown} == {0}, count


def test_a_chart_thins_labels_given_too_close_on_a_multiple_of_their_step():
    labels = [f"11-{day:02} {hour:02}:00" for day in (1, 2) for hour in range(24)]  # 48 long ones
    shown = x_labels(stacked_bars("t", labels, [Series("s", [1] * 48, "red")], label_every=2))

    positions = [x for x, _ in shown]
    assert all(
        b - a >= label_width(labels[0]) + LABEL_GAP for a, b in itertools.pairwise(positions)
    )
    assert all(int(text[-5:-3]) % 2 == 0 for _, text in shown)  # still every 2nd hour's


@pytest.mark.django_db
def test_the_hourly_report_labels_round_hours(staff_client):
    report_row("billing", TODAY - timedelta(hours=5), grain="hour")

    page = staff_client.get("/ui/reports", {"grain": "hour"}).content.decode()

    labels = x_labels(page[page.index("<svg") : page.index("</svg>") + 6])
    assert 4 <= len(labels) <= 12
    assert all(text.endswith(("00:00", "06:00", "12:00", "18:00")) for _, text in labels)
