"""A consumer's delivery figures on its page: delivered and failed per minute over the last hour
and per hour over the last day, the latency percentiles and the answers by status-code class.

From the delivery statistics rollup (jobs/stats.py, `recent` narrowed to the consumer), the one
source of the dashboard's figures too, never from the attempts themselves: six queries, whatever
the number of attempts. Not from the nightly Spark report either, which is a day behind.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils.safestring import SafeString

from broker.templatetags.ui_format import NOT_APPLICABLE, estimated_duration
from broker.ui.dashboard import deliveries_chart
from broker.ui.dashboard_rows import format_percent
from consumers.models import Consumer
from jobs.stats import HOUR, MINUTE, Tally, recent

# What each status-code class stands for on the page (Tally.status_classes' keys).
CLASS_LABELS = {
    "2xx": "2xx (delivered)",
    "3xx": "3xx",
    "4xx": "4xx",
    "5xx": "5xx",
    "no answer": "No answer (timeout, connection)",
    "other": "Other (a status outside 200 to 599, or counted before classes were kept)",
}


@dataclass(frozen=True)
class FigureRow:
    label: str
    values: list[str]  # one per period: last hour, last 24 hours
    name: str  # a stable class for tests and styles


@dataclass(frozen=True)
class ConsumerFigures:
    minute_chart: SafeString
    hour_chart: SafeString
    rows: list[FigureRow]


def consumer_figures(consumer: Consumer, now: datetime) -> ConsumerFigures:
    last_hour = recent(MINUTE, 60, now, consumer_id=consumer.pk)
    last_day = recent(HOUR, 24, now, consumer_id=consumer.pk)
    tallies = [
        last_hour.per_consumer.get(consumer.pk, Tally()),
        last_day.per_consumer.get(consumer.pk, Tally()),
    ]
    return ConsumerFigures(
        minute_chart=deliveries_chart(
            "Delivered and failed per minute, last hour", last_hour, "minute", 10
        ),
        hour_chart=deliveries_chart(
            "Delivered and failed per hour, last 24 hours", last_day, "hour", 3
        ),
        rows=figure_rows(tallies),
    )


def figure_rows(tallies: list[Tally]) -> list[FigureRow]:
    """Attempts, then each status-code class (count and share of the attempts), then the
    latency percentiles, one value per tally. "Other" shows only when some period has one."""
    rows = [FigureRow("Attempts", [f"{tally.attempts:,}" for tally in tallies], "attempts")]
    classes = [tally.status_classes() for tally in tallies]
    for key, label in CLASS_LABELS.items():
        counts = [per_class.get(key, 0) for per_class in classes]
        if any(counts) or key != "other":
            values = [
                _share(count, tally.attempts) for count, tally in zip(counts, tallies, strict=True)
            ]
            rows.append(FigureRow(label, values, "class-" + key.replace(" ", "-")))
    for quantile, name in ((0.5, "p50"), (0.95, "p95")):
        values = [estimated_duration(tally.latency_ms(quantile)) for tally in tallies]
        rows.append(FigureRow(f"Latency {name}, publish to answer", values, name))
    return rows


def _share(count: int, attempts: int) -> str:
    if not attempts:
        return NOT_APPLICABLE
    return f"{count:,} ({format_percent(count / attempts)})"
