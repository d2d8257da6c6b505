"""Prometheus metrics (docs/api.md /metrics, issue 4).

Two sources, because deliveries happen in dispatcher processes and the API in web processes:
- each dispatcher counts its own deliveries and times them, served on its `--metrics-port`;
- the web app's `/metrics` reports the state of the queue, read from the database at scrape time
  (queued, in flight and dead jobs per consumer, counted as /job-status counts them:
  jobs/status_summary.py; each dispatcher's heartbeat totals; the rows of the DEFAULT
  partitions).
"""

from __future__ import annotations

from collections.abc import Iterator

from django.utils import timezone
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from consumers.models import Consumer
from jobs.models import DispatcherHeartbeat
from jobs.partitions import ATTEMPTS, JOBS, default_partition_rows
from jobs.queue import circuit as circuit_breaker
from jobs.states import DEAD, INFLIGHT, QUEUED
from jobs.status_summary import JobCounts, status_counts

# --- in each dispatcher process -----------------------------------------------------------------
DELIVERIES = Counter(
    "broker_deliveries_total",
    "Push delivery attempts by outcome (delivered, retry, dead).",
    ["outcome"],
)
DELIVERY_SECONDS = Histogram(
    "broker_delivery_duration_seconds",
    "Time from sending a webhook to its answer (or failure).",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)


# --- in the web app: the queue as the database sees it -----------------------------------------
class QueueCollector(Collector):
    STATES = {"queued": QUEUED, "in_flight": INFLIGHT, "dead": DEAD}

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        consumers = list(Consumer.objects.only("channel_id", "public_id", *CONSUMER_STATE))
        names = {consumer.pk: (consumer.channel_id, consumer.public_id) for consumer in consumers}
        yield from _consumer_states(consumers)
        counted = status_counts(self.STATES.values(), times=False)
        counts = _counts_per_consumer(counted)
        for name, status in self.STATES.items():
            family = GaugeMetricFamily(
                f"broker_jobs_{name}",
                f"Jobs {status} per consumer.",
                labels=["channel", "consumer"],
            )
            for consumer_id, count in counts[status].items():
                if consumer_id in names:
                    family.add_metric(list(names[consumer_id]), count)
            yield family
        yield from _upstream_names(names, counts[QUEUED], counts[DEAD])
        yield from _summary_age(counted)
        yield from self._dispatchers()
        yield _default_partition_rows()

    def _dispatchers(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        beats = list(DispatcherHeartbeat.objects.all())
        in_flight = GaugeMetricFamily(
            "broker_dispatcher_in_flight", "Deliveries in flight.", labels=["dispatcher"]
        )
        seen = GaugeMetricFamily(
            "broker_dispatcher_last_beat_timestamp_seconds",
            "When the dispatcher last reported.",
            labels=["dispatcher"],
        )
        outcomes = CounterMetricFamily(
            "broker_dispatcher_attempts",
            "Attempts since the dispatcher started, by result.",
            labels=["dispatcher", "result"],
        )
        for beat in beats:
            in_flight.add_metric([beat.dispatcher_id], beat.in_flight)
            seen.add_metric([beat.dispatcher_id], beat.last_beat_at.timestamp())
            outcomes.add_metric([beat.dispatcher_id, "delivered"], beat.delivered)
            outcomes.add_metric([beat.dispatcher_id, "failed"], beat.failed)
        yield from (in_flight, seen, outcomes)


def _default_partition_rows() -> GaugeMetricFamily:
    """Rows no time partition covers (jobs/partitions/default_rows.py): above 0, retention was
    behind; an alert on it catches what the hourly partition maintenance could not place."""
    rows = default_partition_rows()
    family = GaugeMetricFamily(
        "broker_default_partition_rows",
        f"Rows in the table's DEFAULT partition (no time partition covers them), counted up to"
        f" {rows.limit}.",
        labels=["table"],
    )
    family.add_metric([JOBS.name], rows.jobs)
    family.add_metric([ATTEMPTS.name], rows.attempts)
    return family


def _counts_per_consumer(counted: JobCounts) -> dict[str, dict[int, int]]:
    """Status -> consumer key -> its jobs in that status."""
    counts: dict[str, dict[int, int]] = {status: {} for status in QueueCollector.STATES.values()}
    for count in counted.counts:
        counts[count.status][count.consumer_id] = count.count
    return counts


def _summary_age(counted: JobCounts) -> Iterator[GaugeMetricFamily]:
    """When the job status summary was refreshed, once it has been: the gauges above come from it
    for the statuses too large to count at each scrape (docs/api.md), so an alert on its age
    catches a housekeeping cluster that stopped."""
    if counted.refreshed_at is None:
        return
    refreshed = GaugeMetricFamily(
        "broker_job_status_summary_refreshed_timestamp_seconds",
        "When the job status summary last counted the jobs.",
    )
    refreshed.add_metric([], counted.refreshed_at.timestamp())
    yield refreshed
    summarised = GaugeMetricFamily(
        "broker_job_status_summary_in_use",
        "1 for a status whose counts come from the summary, 0 for one counted at the scrape.",
        labels=["status"],
    )
    for status in QueueCollector.STATES.values():
        summarised.add_metric([status], float(status in counted.summarised))
    yield summarised


def _upstream_names(
    names: dict[int, tuple[str, str]], queued: dict[int, int], dead: dict[int, int]
) -> Iterator[GaugeMetricFamily]:
    """webhook-broker's two gauges, so that its dashboards and alerts work unchanged
    (docs/compatibility.md): the queue's length, and dead jobs per consumer (0 included)."""
    queue = GaugeMetricFamily("queued_job_count", "The current number of jobs in the queue.")
    queue.add_metric([], sum(queued.values()))
    yield queue
    dead_jobs = GaugeMetricFamily(
        "dead_job_count", "Number of dead jobs per consumer.", labels=["channel", "consumer"]
    )
    for consumer_id, name in names.items():
        dead_jobs.add_metric(list(name), dead.get(consumer_id, 0))
    yield dead_jobs


CONSUMER_STATE = ["paused", "circuit_open_until", "circuit_failures"]


def _consumer_states(consumers: list[Consumer]) -> Iterator[GaugeMetricFamily]:
    """Per consumer: paused or not, its circuit (0 closed, 1 open, 0.5 half-open), failures."""
    labels = ["channel", "consumer"]
    paused = GaugeMetricFamily("broker_consumer_paused", "1 while paused.", labels=labels)
    circuit = GaugeMetricFamily(
        "broker_consumer_circuit_open",
        "Circuit breaker: 0 closed, 1 open, 0.5 half-open (the next claim sends a probe).",
        labels=labels,
    )
    failures = GaugeMetricFamily(
        "broker_consumer_consecutive_failures",
        "Attempts in a row without a usable answer.",
        labels=labels,
    )
    now = timezone.now()
    for consumer in consumers:
        name = [consumer.channel_id, consumer.public_id]
        paused.add_metric(name, float(consumer.paused))
        circuit.add_metric(name, CIRCUIT_VALUES[circuit_breaker.state(consumer, now)])
        failures.add_metric(name, consumer.circuit_failures)
    yield from (paused, circuit, failures)


CIRCUIT_VALUES = {
    circuit_breaker.CLOSED: 0.0,
    circuit_breaker.HALF_OPEN: 0.5,
    circuit_breaker.OPEN: 1.0,
}


def queue_registry() -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(QueueCollector())
    return registry
