"""Dashboard: queue depth, rates, latency, circuits, heartbeats, charts (served at /ui/).

A fixed number of queries whatever the number of jobs and attempts: the consumers, their bounded
queue counts (jobs/queue_depth.py), the last hour's minute rows and the last day's hour rows
of the delivery statistics rollup (jobs/stats.py, the one source of the UI's delivery figures),
the dispatcher heartbeats, two index probes that tell whether the rollup is being refreshed, and
a bounded count of the rows no time partition covers (jobs/partitions/default_rows.py).
The consumers' rows, their order (most broken first) and the views the tiles lead to are
broker/ui/dashboard_rows.py's, from what this reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.urls import URLPattern, path, reverse
from django.utils import timezone
from django.utils.safestring import SafeString

from broker.templatetags.ui_format import estimated_duration
from broker.ui.access import VIEW_JOBS, operator_view
from broker.ui.charts import Series, stacked_bars
from broker.ui.dashboard_rows import (
    ATTENTION_SHOWN,
    ConsumerRow,
    TableView,
    format_percent,
    format_rate,
    ranked,
    view_links,
)
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
# Each row's counts stop here (its page counts to 10,000): 200 consumers with big backlogs would
# otherwise read millions of index entries per view; past it a row shows "≥ 1,000".
COUNT_LIMIT = 1_000


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
    rows = ranked(
        consumer_rows(
            consumers,
            queue_depths(COUNT_LIMIT),
            delivery_states(consumers, now),
            last_hour,
            last_day,
            now,
        )
    )
    view = TableView.of(request.GET)
    shown = view.rows(rows)
    attention = [row for row in rows if row.needs_attention]
    beats = [
        Beat(beat, now - beat.last_beat_at)
        for beat in DispatcherHeartbeat.objects.order_by("-last_beat_at")[:HEARTBEATS_SHOWN]
    ]
    context = {
        "rows": shown,
        "consumer_count": len(rows),
        "view": view,
        "view_links": view_links(view, rows),
        "attention": attention[:ATTENTION_SHOWN],
        "attention_count": len(attention),
        "tiles": tiles(rows, status_totals(TOTAL_LIMIT), last_hour, beats, view),
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
    """Every consumer, without the encrypted token and secrets; what its state badges read
    (delivery_state.state_badges) included."""
    fields = [
        *("channel", "public_id", "name", "type", "paused", "circuit_open_until"),
        *("throttled_until", "last_failure_at", "last_failure", "changed_at"),
    ]
    return Consumer.objects.only(*fields).order_by("channel_id", "public_id")


def consumer_rows(
    consumers: list[Consumer],
    depths: dict[int, QueueDepth],
    states: dict[int, DeliveryState],
    last_hour: Recent,
    last_day: Recent,
    now: datetime,
) -> list[ConsumerRow]:
    none = BoundedCount(0, COUNT_LIMIT)
    return [
        ConsumerRow(
            consumer=consumer,
            depth=depths.get(consumer.pk, QueueDepth(none, none, none)),  # one created meanwhile
            circuit=circuit.state(consumer, now),
            state=states[consumer.pk],
            hour=last_hour.per_consumer.get(consumer.pk, Tally()),
            day=last_day.per_consumer.get(consumer.pk, Tally()),
            last_hour=last_hour,
        )
        for consumer in consumers
    ]


@dataclass(frozen=True)
class Tile:
    label: str
    value: str
    link: str  # what the tile counts
    alert: bool = False  # drawn in red: something needs an operator
    note: str = ""
    selected: bool = False  # the consumer table shows what it links to


def tiles(
    rows: list[ConsumerRow], totals: QueueDepth, hour: Recent, beats: list[Beat], view: TableView
) -> list[Tile]:
    """The totals. The tiles of broken things (dead jobs, open circuits, pauses) cut the consumer
    table down to the consumers they count, and the latency tile orders it slowest first:
    figures an operator can follow to the consumers behind them, live (issue 38)."""
    open_circuits = sum(row.circuit == circuit.OPEN for row in rows)
    paused = sum(row.consumer.paused for row in rows)
    alive = sum(not beat.stale for beat in beats)
    everyone, reports = view.url(show=""), reverse("ui:reports")

    def showing(label: str, count: int, show: str) -> Tile:
        link = view.url(show=show)
        return Tile(label, f"{count:,}", link, alert=count > 0, selected=view.show == show)

    return [
        Tile("Queued", str(totals.queued), everyone),
        Tile("In flight", str(totals.in_flight), everyone),
        Tile(
            "Dead",
            str(totals.dead),
            view.url(show="dead"),
            alert=totals.dead.value > 0,
            selected=view.show == "dead",
        ),
        Tile(
            "Delivered, last hour",
            f"{hour.total.delivered:,}",
            reports,
            note=format_rate(hour.delivered_per_second(hour.total)) if hour.total.attempts else "",
        ),
        Tile("Success rate, last hour", format_percent(hour.total.success_rate), reports),
        Tile(
            "p95 latency, last hour",
            estimated_duration(hour.total.latency_ms(0.95)),
            view.url(order="latency"),
            note="consumers slowest first",
            selected=view.order == "latency",
        ),
        showing("Open circuits", open_circuits, "circuit-open"),
        showing("Paused consumers", paused, "paused"),
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


urlpatterns: list[URLPattern] = [path("", dashboard, name="dashboard")]
