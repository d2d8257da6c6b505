"""Delivery statistics: a small per-consumer rollup of push attempts (the dashboard's rates,
success rates, latencies and charts; docs/ui-dashboard.md).

Counting `DeliveryAttempt` when a page is shown does not scale (a day at 2,000 deliveries/s is
170M rows), so `refresh_delivery_stats` keeps `DeliveryStats` rows: per consumer and minute, and
per consumer and hour, the attempts, how many were delivered (2xx) and failed, the failed ones
by status-code class (3xx, 4xx, 5xx, no answer: a consumer's page), and a histogram of the
delivered ones' publish-to-delivery latency in fixed log-spaced buckets, so that the percentiles
of any period can be estimated by adding histograms up.

The refresh recounts whole minutes from the attempts, by `started_at`: always the trailing few
minutes (attempts are recorded when their answer comes, up to a delivery timeout after they
started), and everything since the last counted minute when it has not run for a while. A
recount replaces the rows of its minutes, so re-running never counts twice; hours are then
re-added from their minutes. Refreshes take a lock, so two at once simply run one after the other.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import connection, transaction
from django.db.models import (
    Case,
    CharField,
    Count,
    F,
    FloatField,
    IntegerField,
    Max,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.expressions import Func
from django.db.models.functions import Cast, Coalesce, Floor, Greatest, Least, Ln, TruncMinute
from django.utils import timezone

# Tally, bucket_estimate_ms and latency_bucket are re-exported ("as"): the UI and the tests read
# them through this module, the rollup's owner.
from jobs.delivery_tally import BUCKETS_PER_LN, FAILURE_CLASSES, LAST_BUCKET, ROUNDING_EPSILON
from jobs.delivery_tally import Tally as Tally
from jobs.delivery_tally import bucket_estimate_ms as bucket_estimate_ms
from jobs.delivery_tally import latency_bucket as latency_bucket
from jobs.models import DeliveryAttempt, DeliveryStats
from jobs.queue.rules import lease_length

MINUTE = DeliveryStats.Span.MINUTE
HOUR = DeliveryStats.Span.HOUR
KEPT = {MINUTE: timedelta(days=2), HOUR: timedelta(days=8)}  # then deleted by the refresh
CHUNK = timedelta(hours=1)  # attempts recounted per transaction when catching up
LOCK_ID = 0x6272_6F6B_6572_5354  # pg_advisory_xact_lock key of the refresh ("brokerST")

# --- refresh ------------------------------------------------------------------------------------


def refresh_delivery_stats(now: datetime | None = None, since: datetime | None = None) -> int:
    """Bring the rollup up to date (or recount it from `since`); return the attempts counted.

    Run every minute (install_schedules) or by hand: `manage.py refresh_delivery_stats`.
    """
    now = now or timezone.now()
    start = _floor(since, MINUTE) if since else _resume_point(now)
    start = max(start, _oldest_recountable(now))
    counted = 0
    while (first := _first_attempt_minute(start)) is not None:
        start = max(start, first)  # over a stretch without attempts in one step
        end = start + CHUNK if start + CHUNK < now else None  # the last chunk is open-ended
        counted += _recount(start, end)
        if end is None:
            break
        start = end
    _delete_expired(now)
    return counted


def recount_window() -> timedelta:
    """How far back every refresh recounts: attempts are recorded when their answer comes, at
    most a delivery timeout (plus the lease's grace) after they started; a minute more for the
    batch that records them. Whole minutes."""
    seconds = (lease_length() + timedelta(minutes=1)).total_seconds()
    return timedelta(minutes=math.ceil(seconds / 60))


def _resume_point(now: datetime) -> datetime:
    """The recount window before now, or before the last counted minute if that is older."""
    last: datetime | None = DeliveryStats.objects.filter(span=MINUTE).aggregate(
        last=Max("period_start")
    )["last"]
    start = _floor(now, MINUTE) - recount_window()
    if last is None:
        return _oldest_recountable(now)  # first run: as far back as minute rows are kept
    return min(start, last - recount_window())


def _oldest_recountable(now: datetime) -> datetime:
    """Hours are added up from their minutes, so recounts start at the first whole hour whose
    minute rows are all still kept."""
    return _floor(now - KEPT[MINUTE], HOUR) + timedelta(hours=1)


def _first_attempt_minute(start: datetime) -> datetime | None:
    """The minute of the first attempt started at or after `start` (one index probe)."""
    first = (
        DeliveryAttempt.objects.filter(started_at__gte=start)
        .order_by("started_at")
        .values_list("started_at", flat=True)
        .first()
    )
    return None if first is None else _floor(first, MINUTE)


def _recount(start: datetime, end: datetime | None) -> int:
    """Replace the minute rows of [start, end) by a count of their attempts, and the hour rows
    of the hours they fall in by the sums of their minutes; one transaction, under the lock."""
    with transaction.atomic():
        _lock()
        minutes = _count_attempts(start, end)
        _replace(MINUTE, start, end, minutes)
        hour_start = _floor(start, HOUR)
        hour_end = None if end is None else _ceil_hour(end)
        _replace(HOUR, hour_start, hour_end, _add_up_hours(hour_start, hour_end))
    return sum(tally.attempts for tally in minutes.values())


def _lock() -> None:
    """Serialise refreshes: without it, two recounting the same minutes would both delete and
    then both insert them."""
    with connection.cursor() as cursor:
        # Waiting for the refresh that holds it is the point: no lock_timeout for this one
        # (docs/configuration.md, "Lock timeouts"); it lasts as long as that refresh.
        cursor.execute("SET LOCAL lock_timeout = 0")
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_ID])


Key = tuple[int, datetime]  # (consumer ID, period start)


def _count_attempts(start: datetime, end: datetime | None) -> dict[Key, Tally]:
    tallies: dict[Key, Tally] = {}
    for consumer_id, minute, status_class, bucket, n in attempt_counts(start, end):
        tally = tallies.setdefault((consumer_id, minute), Tally())
        tally.attempts += n
        if status_class == "2xx":
            tally.delivered += n
            tally.histogram[int(bucket)] += n
        else:
            tally.failed += n
            if status_class in FAILURE_CLASSES:
                tally.failures[status_class] += n
    return tallies


def attempt_counts(start: datetime, end: datetime | None) -> QuerySet[DeliveryAttempt, Any]:
    """(consumer ID, minute, status-code class, latency bucket or None if failed, attempts): one
    grouped query over the attempts started in [start, end), found through attempt_started_idx,
    joined to their jobs and messages by primary key."""
    attempts = DeliveryAttempt.objects.filter(started_at__gte=start)
    if end is not None:
        attempts = attempts.filter(started_at__lt=end)
    return (
        attempts.values(
            consumer=F("job__consumer_id"),
            minute=TruncMinute("started_at", tzinfo=UTC),
            status_class=_status_class_sql(),
            bucket=Case(When(_DELIVERED, then=_latency_bucket_sql()), default=None),
        )
        .annotate(n=Count("pk"))
        .values_list("consumer", "minute", "status_class", "bucket", "n")
    )


_DELIVERED = Q(status_code__gte=200, status_code__lt=300)


def _status_class_sql() -> Case:
    """ "2xx", a key of FAILURE_CLASSES, or "other" (a status outside 200..599)."""
    hundreds = [
        When(Q(status_code__gte=low, status_code__lt=low + 100), then=Value(f"{low // 100}xx"))
        for low in (200, 300, 400, 500)
    ]
    return Case(
        When(status_code__isnull=True, then=Value("no answer")),
        *hundreds,
        default=Value("other"),
        output_field=CharField(),
    )


class MillisecondsBetween(Func):
    """later - earlier, two datetimes, in milliseconds (a float)."""

    output_field = FloatField()
    arg_joiner = " - "
    template = "(CAST(EXTRACT(EPOCH FROM (%(expressions)s)) AS double precision) * 1000)"


def _latency_bucket_sql() -> Least:
    """latency_bucket() in SQL, of publish-to-delivery latency: the answer came at started_at
    plus duration; the message was published at received_at, or, if it was scheduled, became
    due at scheduled_for (as spark_etl's report counts it)."""
    published = Coalesce(F("job__message__scheduled_for"), F("job__message__received_at"))
    latency = MillisecondsBetween(F("started_at"), published) + F("duration_ms")
    scaled = Ln(Greatest(latency, Value(1.0))) * Value(BUCKETS_PER_LN) + Value(ROUNDING_EPSILON)
    return Least(Cast(Floor(scaled), IntegerField()), Value(LAST_BUCKET))


def _replace(
    span: DeliveryStats.Span, start: datetime, end: datetime | None, tallies: dict[Key, Tally]
) -> None:
    rows = DeliveryStats.objects.filter(span=span, period_start__gte=start)
    if end is not None:
        rows = rows.filter(period_start__lt=end)
    rows.delete()
    DeliveryStats.objects.bulk_create(
        DeliveryStats(
            consumer_id=consumer_id,
            span=span,
            period_start=period_start,
            attempts=tally.attempts,
            delivered=tally.delivered,
            failed=tally.failed,
            latency_histogram={str(k): n for k, n in sorted(tally.histogram.items())},
            **{column: tally.failures[name] for name, column in FAILURE_CLASSES.items()},
        )
        for (consumer_id, period_start), tally in tallies.items()
    )


def _add_up_hours(start: datetime, end: datetime | None) -> dict[Key, Tally]:
    minutes = DeliveryStats.objects.filter(span=MINUTE, period_start__gte=start)
    if end is not None:
        minutes = minutes.filter(period_start__lt=end)
    return add_up(minutes, HOUR)[0]


def _delete_expired(now: datetime) -> None:
    for span, kept in KEPT.items():
        DeliveryStats.objects.filter(span=span, period_start__lt=now - kept).delete()


def _ceil_hour(moment: datetime) -> datetime:
    floor = _floor(moment, HOUR)
    return floor if floor == moment else floor + timedelta(hours=1)


def _floor(moment: datetime, span: int) -> datetime:
    """The start of the minute or hour (UTC) that `moment` falls in."""
    moment = moment.astimezone(UTC)
    if span == HOUR:
        return moment.replace(minute=0, second=0, microsecond=0)
    return moment.replace(second=0, microsecond=0)


# --- reading ------------------------------------------------------------------------------------


def add_up(rows: Iterable[DeliveryStats], span: int) -> tuple[dict[Key, Tally], dict[int, Tally]]:
    """Rollup rows added up per (consumer, period of `span`), and per consumer overall."""
    per_period: dict[Key, Tally] = {}
    per_consumer: dict[int, Tally] = {}
    for row in rows:
        period = _floor(row.period_start, span)
        per_period.setdefault((row.consumer_id, period), Tally()).add(row)
        per_consumer.setdefault(row.consumer_id, Tally()).add(row)
    return per_period, per_consumer


@dataclass
class Recent:
    """One span's rollup rows since a time: per consumer, and per period over all consumers."""

    since: datetime
    until: datetime  # when it was read
    per_consumer: dict[int, Tally]
    per_period: dict[datetime, Tally]  # every period from `since`, empty ones included
    total: Tally

    def delivered_per_second(self, tally: Tally) -> float:
        """The rate of `tally`'s deliveries over the time it covers, from `since` to `until`."""
        return tally.delivered / max((self.until - self.since).total_seconds(), 1.0)


def recent(
    span: DeliveryStats.Span,
    periods: int,
    now: datetime | None = None,
    consumer_id: int | None = None,
) -> Recent:
    """The last `periods` minutes or hours, the current one included; of every consumer, or of
    the one `consumer_id` (its page: per period, its own figures).

    The counts are added up by the database, per consumer and per period; only the latency
    histograms come back row by row, each added to its consumer's alone (the total's is its
    consumers' added up once). A dashboard over 200 consumers covers 16,800 rows: read whole,
    their times alone cost it tens of milliseconds (docs/performance-history.md, fifth session).
    """
    now = now or timezone.now()
    since = _floor(now, span) - timedelta(seconds=span * (periods - 1))
    rows = DeliveryStats.objects.filter(span=span, period_start__gte=since).order_by()
    if consumer_id is not None:  # through delivery_stats_unique (consumer, span, period_start)
        rows = rows.filter(consumer_id=consumer_id)
    per_consumer = dict(_sums_by(rows, "consumer_id"))
    for row_consumer, histogram in rows.values_list("consumer_id", "latency_histogram"):
        per_consumer[row_consumer].count(0, 0, 0, histogram)
    per_period = {since + timedelta(seconds=span * i): Tally() for i in range(periods)}
    for start, tally in _sums_by(rows, "period_start"):
        per_period.setdefault(_floor(start, span), Tally()).add(tally)
    total = Tally()
    for tally in per_consumer.values():
        total.add(tally)
    return Recent(since, now, per_consumer, per_period, total)


_SUMMED = ["attempts", "delivered", "failed", *FAILURE_CLASSES.values()]


def _sums_by(rows: QuerySet[DeliveryStats], column: str) -> list[tuple[Any, Tally]]:
    """The rows' attempts, deliveries and failures (per class too) added up per value of
    `column`; no histograms."""
    sums = rows.values(column).annotate(**{f"sum_{name}": Sum(name) for name in _SUMMED})
    return [
        (
            values[column],
            Tally(
                values["sum_attempts"],
                values["sum_delivered"],
                values["sum_failed"],
                failures=Counter({name: values[f"sum_{c}"] for name, c in FAILURE_CLASSES.items()}),
            ),
        )
        for values in sums
    ]


def last_counted_minute() -> datetime | None:
    """The newest minute the rollup holds (to tell when the refresh has stopped running)."""
    rows = DeliveryStats.objects.filter(span=MINUTE)
    last: datetime | None = rows.aggregate(last=Max("period_start"))["last"]
    return last


def last_attempt_at() -> datetime | None:
    """When the newest recorded attempt started (one probe of the started_at index)."""
    last: datetime | None = DeliveryAttempt.objects.aggregate(last=Max("started_at"))["last"]
    return last


@dataclass(frozen=True)
class RefreshLag:
    """The rollup is behind the attempts (its refresh has stopped, or never ran)."""

    last_counted: datetime | None  # the rollup's newest minute
    last_attempt: datetime


def refresh_lag() -> RefreshLag | None:
    """Set when attempts are newer than the rollup's newest minute by more than a running
    refresh lets happen (the dashboard's warning)."""
    last_attempt, last_counted = last_attempt_at(), last_counted_minute()
    if last_attempt is None:
        return None
    allowance = recount_window() + timedelta(minutes=3)  # a refresh runs every minute
    if last_counted is None or last_attempt - last_counted > allowance:
        return RefreshLag(last_counted, last_attempt)
    return None
