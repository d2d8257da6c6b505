"""Dashboard: queue depth, rates, latency, circuits, heartbeats, charts (served at /ui/).

A fixed number of queries whatever the number of jobs and attempts: the consumers, their bounded
queue counts (jobs/queue_depth.py), the last hour's minute rows and the last day's hour rows
of the delivery statistics rollup (jobs/stats.py, the one source of the UI's delivery figures),
the dispatcher heartbeats, two index probes that tell whether the rollup is being refreshed, and
a bounded count of the rows no time partition covers (jobs/partitions/default_rows.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from broker.templatetags.ui_format import duration
from broker.ui.access import VIEW_JOBS, operator_view
from broker.ui.charts import Series, stacked_bars
from broker.ui.delivery_state import DeliveryState, delivery_states
from consumers.models import Consumer
from jobs.models import DispatcherHeartbeat
from jobs.partitions import default_partition_rows
from jobs.queue import circuit
from jobs.queue.dispatchers import FROZEN_SECONDS
from jobs.queue_depth import (
    TOTAL_LIMIT,
    BoundedCount,
    QueueDepth,
    queue_depths,
    status_totals,
)
from jobs.stats import HOUR, MINUTE, Recent, Tally, recent, refresh_lag

# Dispatchers beat every second; one silent for as long as the queue takes it for frozen (and
# gives its jobs to others) is flagged as stale.
STALE_AFTER = timedelta(seconds=FROZEN_SECONDS)
HEARTBEATS_SHOWN = 50  # a crashed dispatcher leaves its row; the newest ones matter
DELIVERED_COLOUR, FAILED_COLOUR = "#2e7d32", "#c62828"
NOT_APPLICABLE = "—"
# Each row's counts stop here (its page counts to 10,000): 200 consumers with big backlogs would
# otherwise read millions of index entries per view; past it a row shows "≥ 1,000".
COUNT_LIMIT = 1_000


@dataclass
class ConsumerRow:
    consumer: Consumer
    depth: QueueDepth
    circuit: str  # one of circuit.STATES
    state: DeliveryState  # its last attempt and failure, its next attempt
    hour: Tally
    day: Tally
    last_hour: Recent

    @property
    def delivery_rate(self) -> str:
        if not self.hour.attempts:
            return NOT_APPLICABLE
        return format_rate(self.last_hour.delivered_per_second(self.hour))

    @property
    def success_hour(self) -> str:
        return format_percent(self.hour.success_rate)

    @property
    def success_day(self) -> str:
        return format_percent(self.day.success_rate)

    @property
    def p50(self) -> str:
        return duration(self.hour.latency_ms(0.5))

    @property
    def p95(self) -> str:
        return duration(self.hour.latency_ms(0.95))


@dataclass
class ChannelGroup:
    channel_id: str
    name: str
    rows: list[ConsumerRow] = field(default_factory=list)


@dataclass
class Beat:
    heartbeat: DispatcherHeartbeat
    age: timedelta

    @property
    def stale(self) -> bool:
        return self.age > STALE_AFTER


@operator_view(get=VIEW_JOBS)
def dashboard(request: HttpRequest) -> HttpResponse:
    now = timezone.now()
    last_hour, last_day = recent(MINUTE, 60, now), recent(HOUR, 24, now)
    consumers = list(consumers_in_order())
    groups = channel_groups(
        consumers,
        queue_depths(COUNT_LIMIT),
        delivery_states(consumers, now),
        last_hour,
        last_day,
        now,
    )
    rows = [row for group in groups for row in group.rows]
    beats = [
        Beat(beat, now - beat.last_beat_at)
        for beat in DispatcherHeartbeat.objects.order_by("-last_beat_at")[:HEARTBEATS_SHOWN]
    ]
    context = {
        "groups": groups,
        "tiles": tiles(rows, status_totals(TOTAL_LIMIT), last_hour, beats),
        "beats": beats,
        "stale_after": int(STALE_AFTER.total_seconds()),
        "minute_chart": deliveries_chart(
            "Deliveries per minute, last hour", last_hour, "minute", 10
        ),
        "hour_chart": deliveries_chart("Deliveries per hour, last 24 hours", last_day, "hour", 3),
        "stats_behind": refresh_lag(),
        "default_partition_rows": default_partition_rows(),  # retention behind: a warning
        "count_limit": f"{COUNT_LIMIT:,}",
        "total_limit": f"{TOTAL_LIMIT:,}",
        "now": now,
    }
    return render(request, "ui/dashboard.html", context)


def consumers_in_order() -> QuerySet[Consumer]:
    """Every consumer with its channel, without the encrypted token and secrets."""
    fields = [
        *("public_id", "name", "type", "paused", "circuit_open_until", "throttled_until"),
        *("last_failure_at", "last_failure", "channel__name"),
    ]
    return (
        Consumer.objects.select_related("channel").only(*fields).order_by("channel_id", "public_id")
    )


def channel_groups(
    consumers: list[Consumer],
    depths: dict[int, QueueDepth],
    states: dict[int, DeliveryState],
    last_hour: Recent,
    last_day: Recent,
    now: datetime,
) -> list[ChannelGroup]:
    groups: dict[str, ChannelGroup] = {}
    none = BoundedCount(0, COUNT_LIMIT)
    for consumer in consumers:
        group = groups.setdefault(
            consumer.channel_id, ChannelGroup(consumer.channel_id, consumer.channel.name)
        )
        row = ConsumerRow(
            consumer=consumer,
            depth=depths.get(consumer.pk, QueueDepth(none, none, none)),  # one created meanwhile
            circuit=circuit.state(consumer, now),
            state=states[consumer.pk],
            hour=last_hour.per_consumer.get(consumer.pk, Tally()),
            day=last_day.per_consumer.get(consumer.pk, Tally()),
            last_hour=last_hour,
        )
        group.rows.append(row)
    return list(groups.values())


@dataclass(frozen=True)
class Tile:
    label: str
    value: str
    link: str  # what the tile counts
    alert: bool = False  # drawn in red: something needs an operator
    note: str = ""


def tiles(
    rows: list[ConsumerRow], totals: QueueDepth, hour: Recent, beats: list[Beat]
) -> list[Tile]:
    open_circuits = sum(row.circuit == circuit.OPEN for row in rows)
    paused = sum(row.consumer.paused for row in rows)
    alive = sum(not beat.stale for beat in beats)
    consumers, reports = "#consumers", reverse("ui:reports")
    return [
        Tile("Queued", str(totals.queued), consumers),
        Tile("In flight", str(totals.in_flight), consumers),
        Tile("Dead", str(totals.dead), reverse("ui:dead-jobs"), alert=totals.dead.value > 0),
        Tile(
            "Delivered, last hour",
            f"{hour.total.delivered:,}",
            reports,
            note=format_rate(hour.delivered_per_second(hour.total)) if hour.total.attempts else "",
        ),
        Tile("Success rate, last hour", format_percent(hour.total.success_rate), reports),
        Tile("p95 latency, last hour", duration(hour.total.latency_ms(0.95)), reports),
        Tile("Open circuits", str(open_circuits), consumers, alert=open_circuits > 0),
        Tile("Paused consumers", str(paused), consumers, alert=paused > 0),
        # Only no live dispatcher at all is an alert: a killed one leaves a stale row behind.
        Tile("Dispatchers", f"{alive} of {len(beats)}", "#dispatchers", alert=alive == 0),
    ]


def deliveries_chart(title: str, recent: Recent, unit: str, label_every: int) -> SafeString:
    """Delivered and failed attempts per period; x labels every `label_every` units ("minute"
    or "hour") on the clock: 14:10, 14:20, ... rather than 14:07, 14:17, ..."""
    periods = sorted(recent.per_period)
    tallies = [recent.per_period[period] for period in periods]
    series = [
        Series("delivered", [tally.delivered for tally in tallies], DELIVERED_COLOUR),
        Series("failed", [tally.failed for tally in tallies], FAILED_COLOUR),
    ]
    labels = [period.strftime("%H:%M") for period in periods]
    on_the_clock = (i for i, p in enumerate(periods) if getattr(p, unit) % label_every == 0)
    first = next(on_the_clock, 0)
    return stacked_bars(
        f"{title} (UTC)", labels, series, label_every=label_every, first_label=first
    )


def format_percent(rate: float | None) -> str:
    if rate is None:
        return NOT_APPLICABLE
    if rate == 1:
        return "100%"
    text = f"{rate:.1%}"
    return ">99.9%" if text == "100.0%" else text  # a few failures in 10,000 still show


def format_rate(per_second: float) -> str:
    return f"{per_second:,.1f}/s" if per_second >= 1 else f"{per_second * 60:,.1f}/min"


urlpatterns: list[URLPattern] = [path("", dashboard, name="dashboard")]
