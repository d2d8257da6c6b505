"""The reports page (/ui/reports): charts and tables of the `spark_etl report` (docs/spark_etl.md).

Read-only. Three queries whatever the size of the report table, each bounded by the period range
(at most MAX_PERIODS periods) through the (grain, period_start) index.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django import forms
from django.db.models import F, Max, QuerySet, Sum
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, path
from django.utils import timezone
from django.utils.safestring import SafeString

from broker.templatetags.ui_format import time_unit
from broker.ui import inputs
from broker.ui.access import VIEW_REPORTS, operator_view
from broker.ui.charts import Line, Series, fewest_between_labels, line_chart, stacked_bars
from jobs.models import DeliveryReport

MAX_PERIODS = {"day": 366, "hour": 24 * 14}  # the widest range one page charts
DEFAULT_PERIODS = {"day": 30, "hour": 48}
STEP = {"day": timedelta(days=1), "hour": timedelta(hours=1)}
# How many periods apart the x labels may be, fewest first: hours that divide a day, so that the
# labels fall on the same hours every day (00:00, 06:00, ...), and days by the week.
LABEL_STEPS = {"hour": (1, 2, 3, 4, 6, 12, 24, 48, 96, 168), "day": (1, 2, 7, 14, 28, 56, 91)}
LATEST_ROWS = 100
MAX_CONSUMERS = 200


class ReportFilters(forms.Form):
    grain = forms.ChoiceField(choices=DeliveryReport.Grain.choices, required=False)
    channel = inputs.IdField()
    consumer = inputs.IdField()
    # Bounded well inside Python's years 1 to 9999: the window below adds and takes periods.
    since = inputs.MomentField()
    until = inputs.MomentField()

    def window(self, now: datetime) -> tuple[str, datetime, datetime]:
        """The grain and the [since, until) range, whole periods, at most MAX_PERIODS long."""
        grain = self.cleaned_data.get("grain") or "day"
        step = STEP[grain]
        until = _floor(self.cleaned_data.get("until") or now, grain) + step
        since = _floor(
            self.cleaned_data.get("since") or until - DEFAULT_PERIODS[grain] * step, grain
        )
        since = max(since, until - MAX_PERIODS[grain] * step)
        return grain, min(since, until - step), until

    def rows(self, grain: str, since: datetime, until: datetime) -> QuerySet[DeliveryReport]:
        rows = DeliveryReport.objects.filter(
            grain=grain, period_start__gte=since, period_start__lt=until
        )
        if channel := self.cleaned_data.get("channel"):
            rows = rows.filter(channel_id=channel)
        if consumer := self.cleaned_data.get("consumer"):
            rows = rows.filter(consumer_id=consumer)
        return rows


def percent(rate: float | None) -> str:
    """0.9952 -> "99.5 %", rounded down so that only a perfect rate reads 100 %."""
    return "—" if rate is None else f"{math.floor(rate * 1000) / 10:.1f} %"


def _floor(moment: datetime, grain: str) -> datetime:
    moment = moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)
    return moment.replace(hour=0) if grain == "day" else moment


@dataclass(frozen=True)
class ConsumerSummary:
    channel_id: str
    consumer_id: str
    jobs: int
    delivered: int
    dead: int
    mean_attempts: float | None
    worst_p95_ms: float | None

    @property
    def success_rate(self) -> float | None:
        finished = self.delivered + self.dead
        return self.delivered / finished if finished else None

    @property
    def success_percent(self) -> str:
        return percent(self.success_rate)


def consumer_summaries(rows: QuerySet[DeliveryReport]) -> list[ConsumerSummary]:
    """Totals per consumer over the range. Mean attempts is over finished jobs in every row, so
    weighting each row's mean by its finished jobs gives the exact mean of the range."""
    totals = (
        rows.values("channel_id", "consumer_id")
        .annotate(
            jobs_total=Sum("jobs"),
            delivered_total=Sum("delivered"),
            dead_total=Sum("dead"),
            attempts_total=Sum(F("mean_attempts") * (F("delivered") + F("dead"))),
            worst_p95=Max("latency_p95_ms"),
        )
        .order_by("channel_id", "consumer_id")[:MAX_CONSUMERS]
    )
    summaries = []
    for row in totals:
        finished = row["delivered_total"] + row["dead_total"]
        attempts = row["attempts_total"]
        summaries.append(
            ConsumerSummary(
                channel_id=row["channel_id"],
                consumer_id=row["consumer_id"],
                jobs=row["jobs_total"],
                delivered=row["delivered_total"],
                dead=row["dead_total"],
                mean_attempts=attempts / finished if finished and attempts is not None else None,
                worst_p95_ms=row["worst_p95"],
            )
        )
    return summaries


def charts(
    rows: QuerySet[DeliveryReport], grain: str, since: datetime, until: datetime
) -> dict[str, Any]:
    """The three charts over every period of the range (periods without rows show as gaps)."""
    per_period = {
        row["period_start"]: row
        for row in rows.values("period_start")
        .annotate(
            jobs_total=Sum("jobs"),
            delivered_total=Sum("delivered"),
            dead_total=Sum("dead"),
            p50=Max("latency_p50_ms"),
            p95=Max("latency_p95_ms"),
            p99=Max("latency_p99_ms"),
        )
        .order_by("period_start")
    }
    periods = []
    moment = since
    while moment < until:
        periods.append(moment)
        moment += STEP[grain]
    labels = [p.strftime("%m-%d" if grain == "day" else "%d %H:00") for p in periods]
    every, first = label_spacing(periods, labels, grain)
    found = [per_period.get(p) for p in periods]

    def total(row: dict[str, Any] | None, name: str) -> float:
        return float(row[name]) if row else 0.0

    def rate(row: dict[str, Any] | None) -> float | None:
        finished = total(row, "delivered_total") + total(row, "dead_total")
        return 100 * total(row, "delivered_total") / finished if finished else None

    def figure(row: dict[str, Any] | None, name: str) -> float | None:
        return row[name] if row else None

    pending = [
        total(r, "jobs_total") - total(r, "delivered_total") - total(r, "dead_total") for r in found
    ]
    return {
        "jobs_chart": stacked_bars(
            "Jobs by outcome (by publish time)",
            labels,
            [
                Series("delivered", [total(r, "delivered_total") for r in found], "#1e7b34"),
                Series("dead", [total(r, "dead_total") for r in found], "#b42318"),
                Series("not finished", pending, "#9ca3af"),
            ],
            label_every=every,
            first_label=first,
        ),
        "success_chart": line_chart(
            "Success rate (delivered of finished)",
            labels,
            [Line("success", [rate(r) for r in found], "#1f3a5f")],
            unit="%",
            top=100,
            label_every=every,
            first_label=first,
        ),
        "latency_chart": latency_chart(
            labels,
            {name: [figure(r, name) for r in found] for name in LATENCY_LINES},
            every,
            first,
        ),
    }


def label_spacing(periods: list[datetime], labels: list[str], grain: str) -> tuple[int, int]:
    """Every how many periods an x label goes, and the first one labelled: the fewest of
    LABEL_STEPS that keeps the labels apart on the chart (charts.fewest_between_labels), from
    the first period on a multiple of it (hours) or from the first (days)."""
    needed = fewest_between_labels(labels)
    every = next((step for step in LABEL_STEPS[grain] if step >= needed), needed)
    if grain == "hour" and 24 % every == 0:
        on_the_clock = (i for i, period in enumerate(periods) if period.hour % every == 0)
        return every, next(on_the_clock, 0)
    return every, 0


# The latency chart's lines: percentile and colour.
LATENCY_LINES = {"p50": "#60a5fa", "p95": "#1f3a5f", "p99": "#b42318"}


def latency_chart(
    labels: list[str], values: dict[str, list[float | None]], every: int, first: int = 0
) -> SafeString:
    """The percentiles' lines in the unit that suits the largest (ms, s, min or h), so that the
    axis reads "40 min", not "3M ms"."""
    largest = max((v for line in values.values() for v in line if v is not None), default=0)
    size, symbol = time_unit(largest)
    lines = [
        Line(name, [None if v is None else v / size for v in values[name]], colour)
        for name, colour in LATENCY_LINES.items()
    ]
    title = "Publish → delivery latency, slowest consumer"
    return line_chart(title, labels, lines, unit=f" {symbol}", label_every=every, first_label=first)


@operator_view(get=VIEW_REPORTS)
def reports(request: HttpRequest) -> HttpResponse:
    filters = ReportFilters(request.GET)
    if not filters.is_valid():  # the form as typed, its problems named, and no report
        return render(request, "ui/reports.html", {"filters": filters}, status=400)
    grain, since, until = filters.window(timezone.now())
    rows = filters.rows(grain, since, until)
    context = {
        "filters": filters,
        "grain": grain,
        "since": since,
        "until": until,
        "consumers": consumer_summaries(rows),
        "latest": [
            (row, percent(row.success_rate), percent(row.first_attempt_success_rate))
            for row in rows.order_by("-period_start", "channel_id", "consumer_id")[:LATEST_ROWS]
        ],
        "latest_limit": LATEST_ROWS,
        **charts(rows, grain, since, until),
    }
    return render(request, "ui/reports.html", context)


urlpatterns: list[URLPattern] = [path("reports", reports, name="reports")]
