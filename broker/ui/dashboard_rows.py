"""The dashboard's consumers (issue 38): each one's row of figures, their order (the most broken
first, or the slowest first) and the views the tiles link to (only those with dead jobs, an open
circuit, a pause). All of it from what the dashboard has already read: no query of its own, so
the page's query count stays fixed whatever is shown.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlencode

from django.http import QueryDict
from django.urls import reverse

from broker.templatetags.ui_format import NOT_APPLICABLE, estimated_duration
from broker.ui.delivery_state import DeliveryState
from consumers.models import Consumer
from jobs.queue import circuit
from jobs.queue_depth import QueueDepth
from jobs.stats import Recent, Tally

# A consumer failing more than this share of its attempts in the last hour needs an operator
# (one in twenty: a receiver that is down fails nearly all, a healthy one a few in ten thousand).
FAILING_ABOVE = 0.05
ATTENTION_SHOWN = 6  # cards at the top of the page; the rest are one click away (show=attention)
CIRCUIT_RANK = {circuit.OPEN: 2, circuit.HALF_OPEN: 1, circuit.CLOSED: 0}


@dataclass
class ConsumerRow:
    consumer: Consumer
    depth: QueueDepth
    circuit: str  # one of circuit.STATES
    state: DeliveryState  # its last attempt and failure, its next attempt, its badges
    hour: Tally
    day: Tally
    last_hour: Recent

    @property
    def key(self) -> str:
        return f"{self.consumer.channel_id}/{self.consumer.public_id}"

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

    # Percentiles read from histogram buckets are estimates, and look like it ("≈ 365 ms").
    @property
    def p50(self) -> str:
        return estimated_duration(self.hour.latency_ms(0.5))

    @property
    def p95(self) -> str:
        return estimated_duration(self.hour.latency_ms(0.95))

    @property
    def failure_rate(self) -> float:
        """The share of its attempts that failed in the last hour; 0 without attempts."""
        rate = self.hour.success_rate
        return 0.0 if rate is None else 1 - rate

    @property
    def has_dead_jobs(self) -> bool:
        return self.depth.dead.value > 0

    @property
    def held(self) -> bool:
        """Kept from receiving on purpose: paused, or held by a 429 it answered."""
        return self.consumer.paused or any(badge.kind == "throttled" for badge in self.state.badges)

    @property
    def needs_attention(self) -> bool:
        return (
            self.has_dead_jobs
            or self.circuit != circuit.CLOSED
            or self.failure_rate > FAILING_ABOVE
            or self.held
        )

    def severity(self) -> tuple[bool, int, float, bool, int, int]:
        """Larger is worse. Dead jobs first (they wait for an operator), then an open circuit
        (the consumer is down now), then the share of failed attempts in the last hour; then a
        pause or a 429's hold (asked for, not failing); then more dead jobs, more queued ones."""
        return (
            self.has_dead_jobs,
            CIRCUIT_RANK[self.circuit],
            self.failure_rate,
            self.held,
            self.depth.dead.value,
            self.depth.queued.value,
        )

    def slowness(self) -> float:
        """Its p95 latency of the last hour; -1 without deliveries (last when slowest first)."""
        p95 = self.hour.latency_ms(0.95)
        return -1.0 if p95 is None else p95


@dataclass(frozen=True)
class Filter:
    label: str  # what the consumers it keeps are: "Consumers with dead jobs"
    keeps: Callable[[ConsumerRow], bool]


# What the consumer table can be cut down to (?show=); the tiles link to these (dashboard.tiles).
FILTERS = {
    "attention": Filter("needing attention", lambda row: row.needs_attention),
    "dead": Filter("with dead jobs", lambda row: row.has_dead_jobs),
    "circuit-open": Filter("with an open circuit", lambda row: row.circuit == circuit.OPEN),
    "paused": Filter("paused", lambda row: row.consumer.paused),
}
ORDERS = {"severity": "most broken first", "latency": "slowest first"}


@dataclass(frozen=True)
class TableView:
    """What the consumer table shows (?show=) and in which order (?order=); unknown values are
    ignored: every consumer, most broken first."""

    show: str = ""
    order: str = "severity"

    @classmethod
    def of(cls, query: QueryDict) -> TableView:
        show, order = query.get("show", ""), query.get("order", "")
        return cls(show if show in FILTERS else "", order if order in ORDERS else "severity")

    def url(self, **change: str) -> str:
        """The dashboard's URL showing this view with `change`, at the consumer table."""
        wanted = {"show": self.show, "order": self.order, **change}
        if wanted["order"] == "severity":
            del wanted["order"]  # the default: the plain /ui/ stays the plain /ui/
        query = urlencode({name: value for name, value in wanted.items() if value})
        return f"{reverse('ui:dashboard')}{'?' if query else ''}{query}#consumers"

    @property
    def description(self) -> str:
        return FILTERS[self.show].label if self.show else ""

    def rows(self, most_broken_first: list[ConsumerRow]) -> list[ConsumerRow]:
        """The rows it shows, from all the rows, ranked (`ranked`)."""
        shown = most_broken_first
        if self.show:
            shown = [row for row in shown if FILTERS[self.show].keeps(row)]
        if self.order == "latency":
            # Stable: equally slow ones (those without deliveries) stay most broken first.
            shown = sorted(shown, key=ConsumerRow.slowness, reverse=True)
        return shown


@dataclass(frozen=True)
class ViewLink:
    label: str
    url: str
    selected: bool


def view_links(view: TableView, rows: list[ConsumerRow]) -> dict[str, list[ViewLink]]:
    """The consumer table's choices: what to show (every consumer, or one of FILTERS, each with
    how many consumers it keeps) and in which order (ORDERS)."""
    show = [ViewLink(f"all ({len(rows):,})", view.url(show=""), not view.show)]
    for name, kept in FILTERS.items():
        label = f"{kept.label} ({sum(map(kept.keeps, rows)):,})"
        show.append(ViewLink(label, view.url(show=name), view.show == name))
    order = [
        ViewLink(label, view.url(order=name), view.order == name) for name, label in ORDERS.items()
    ]
    return {"show": show, "order": order}


def ranked(rows: list[ConsumerRow]) -> list[ConsumerRow]:
    """The rows most broken first; equals by channel and ID."""
    by_name = sorted(rows, key=lambda row: (row.consumer.channel_id, row.consumer.public_id))
    return sorted(by_name, key=ConsumerRow.severity, reverse=True)  # stable: names stay in order


def format_percent(rate: float | None) -> str:
    if rate is None:
        return NOT_APPLICABLE
    if rate == 1:
        return "100%"
    text = f"{rate:.1%}"
    return ">99.9%" if text == "100.0%" else text  # a few failures in 10,000 still show


def format_rate(per_second: float) -> str:
    return f"{per_second:,.1f}/s" if per_second >= 1 else f"{per_second * 60:,.1f}/min"
