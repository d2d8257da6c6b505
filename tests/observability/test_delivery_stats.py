"""The delivery statistics rollup (jobs/stats.py) against an independent count of a known
attempt
history: late-recorded attempts, re-runs, hour buckets, catch-up, retention, concurrent refreshes,
and the index that keeps the refresh reading only its window."""

from __future__ import annotations

import math
import random
import threading
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import pytest
import time_machine
from django.core.management import call_command
from django.db import connection, connections

from broker.models import Channel, Message
from consumers.models import Consumer
from jobs.delivery_tally import FAILURE_CLASSES
from jobs.models import DeliveryAttempt, DeliveryStats, Job
from jobs.queue_depth import BoundedCount, queue_depths, status_totals
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from jobs.stats import (
    HOUR,
    LOCK_ID,
    MINUTE,
    Tally,
    attempt_counts,
    bucket_estimate_ms,
    latency_bucket,
    recent,
    refresh_delivery_stats,
)
from tests.helpers import make_channel, make_consumer, make_producer, scans_a_table

pytestmark = pytest.mark.django_db

# Fixed "now"s keep the minute and hour boundaries where the tests put them: 12:40:30 UTC.
NOW = datetime(2026, 11, 20, 12, 40, 30, tzinfo=UTC)


@dataclass(frozen=True)
class Sent:
    """An attempt as the test made it, for the independent count."""

    consumer_id: int
    started_at: datetime
    status_code: int | None
    latency_ms: float  # publish to answer


class History:
    """Builds messages, jobs and attempts with known times and outcomes."""

    def __init__(self) -> None:
        make_producer()
        self.channel: Channel = make_channel()
        self.sent: list[Sent] = []

    def consumer(self, consumer_id: str) -> Consumer:
        return make_consumer(self.channel, consumer_id)

    def job(self, consumer: Consumer, received_at: datetime, status=DELIVERED) -> Job:
        message = Message.objects.create(
            channel=self.channel,
            producer_id="shop",
            public_id=f"m-{Message.objects.count()}",
            payload=b"{}",
            content_type="application/json",
            status=Message.Status.DISPATCHED,
            received_at=received_at,
        )
        return Job.objects.create(message=message, consumer=consumer, status=status)

    def attempt(
        self,
        consumer: Consumer,
        started_at: datetime,
        status_code: int | None = 200,
        *,
        waited_ms: float = 1500.0,  # between publish and the attempt's start
        duration_ms: float = 40.0,
    ) -> Sent:
        job = self.job(consumer, started_at - timedelta(milliseconds=waited_ms))
        DeliveryAttempt.objects.create(
            job=job,
            attempt_number=1,
            started_at=started_at,
            duration_ms=duration_ms,
            status_code=status_code,
            error_class="" if status_code == 200 else "http-status",
            dispatcher_id="d1",
        )
        sent = Sent(consumer.pk, started_at, status_code, waited_ms + duration_ms)
        self.sent.append(sent)
        return sent


Key = tuple[int, datetime]  # consumer ID, period start
# attempts, delivered, failed, latency histogram, failures per status-code class
Figures = tuple[int, int, int, dict[int, int], dict[str, int]]


def failure_class(status_code: int | None) -> str | None:
    """The class the rollup counts a failed attempt in, worked out independently; None: none."""
    if status_code is None:
        return "no answer"
    return {3: "3xx", 4: "4xx", 5: "5xx"}.get(status_code // 100)


def expected(sent: list[Sent], span: int) -> dict[Key, Figures]:
    """The rollup worked out in Python from the attempts the test made."""
    attempts: Counter[Key] = Counter()
    delivered: Counter[Key] = Counter()
    histograms: defaultdict[Key, Counter[int]] = defaultdict(Counter)
    classes: defaultdict[Key, Counter[str]] = defaultdict(Counter)
    for attempt in sent:
        epoch = attempt.started_at.timestamp()
        key = (attempt.consumer_id, datetime.fromtimestamp(epoch - epoch % span, UTC))
        attempts[key] += 1
        if attempt.status_code is not None and 200 <= attempt.status_code < 300:
            delivered[key] += 1
            histograms[key][latency_bucket(attempt.latency_ms)] += 1
        elif failure_class(attempt.status_code):
            classes[key][str(failure_class(attempt.status_code))] += 1
    return {
        key: (n, delivered[key], n - delivered[key], dict(histograms[key]), dict(classes[key]))
        for key, n in attempts.items()
    }


def stored(span: int) -> dict[Key, Figures]:
    return {
        (row.consumer_id, row.period_start): (
            row.attempts,
            row.delivered,
            row.failed,
            {int(k): n for k, n in row.latency_histogram.items()},
            {
                name: getattr(row, column)
                for name, column in FAILURE_CLASSES.items()
                if getattr(row, column)
            },
        )
        for row in DeliveryStats.objects.filter(span=span)
    }


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return NOW.replace(hour=hour, minute=minute, second=second)


@pytest.fixture
def history() -> History:
    return History()


def test_minutes_and_hours_match_an_independent_count(history):
    billing, audit = history.consumer("billing"), history.consumer("audit")
    rng = random.Random(7)  # noqa: S311 (a reproducible history, not a secret)
    for _ in range(120):
        started = at(11, 0) + timedelta(seconds=rng.uniform(0, 100 * 60))  # 11:00 to 12:40
        status = rng.choice([200, 200, 200, 204, 301, 404, 429, 500, 503, None, 101])
        history.attempt(
            rng.choice([billing, audit]),
            started,
            status,
            waited_ms=rng.choice([3.0, 80.0, 2_500.0, 95_000.0]),
            duration_ms=rng.uniform(1, 900),
        )

    counted = refresh_delivery_stats(now=NOW)

    assert counted == 120
    assert stored(MINUTE) == expected(history.sent, 60)
    assert stored(HOUR) == expected(history.sent, 3600)
    assert len(stored(HOUR)) == 4  # two consumers, the 11:00 and 12:00 hours


def test_re_running_never_counts_twice(history):
    billing = history.consumer("billing")
    for second in range(0, 180, 20):
        history.attempt(billing, at(12, 36, 0) + timedelta(seconds=second))

    refresh_delivery_stats(now=NOW)
    first = stored(MINUTE), stored(HOUR)
    refresh_delivery_stats(now=NOW)
    refresh_delivery_stats(now=NOW + timedelta(seconds=40))

    assert (stored(MINUTE), stored(HOUR)) == first
    assert sum(attempts for attempts, *_ in first[1].values()) == 9


def test_attempts_recorded_late_are_still_counted(history):
    billing = history.consumer("billing")
    history.attempt(billing, at(12, 39, 10))
    refresh_delivery_stats(now=NOW)

    # An attempt that started before that refresh but was recorded after it (its answer took
    # 25 s), and one that failed in the same minute, recorded later still.
    history.attempt(billing, at(12, 40, 5), 200)
    history.attempt(billing, at(12, 39, 50), 503)
    refresh_delivery_stats(now=NOW + timedelta(minutes=1))

    assert stored(MINUTE) == expected(history.sent, 60)
    assert stored(MINUTE)[(billing.pk, at(12, 39))][:3] == (2, 1, 1)
    assert stored(HOUR) == expected(history.sent, 3600)


def test_an_attempt_recorded_after_the_recount_window_needs_a_recount_by_hand(history):
    billing = history.consumer("billing")
    history.attempt(billing, at(12, 10))
    history.attempt(billing, at(12, 40))
    refresh_delivery_stats(now=NOW)
    late = history.attempt(billing, at(12, 11))  # 29 minutes late: past any delivery timeout

    refresh_delivery_stats(now=NOW + timedelta(minutes=1))
    assert (billing.pk, at(12, 11)) not in stored(MINUTE)

    with time_machine.travel(NOW + timedelta(minutes=1), tick=False):  # the command reads the clock
        call_command("refresh_delivery_stats", "--hours", "48")
    assert stored(MINUTE)[(billing.pk, late.started_at)][:3] == (1, 1, 0)
    assert stored(HOUR) == expected(history.sent, 3600)


def test_a_refresh_catches_up_after_not_running_for_hours(history):
    billing = history.consumer("billing")
    history.attempt(billing, at(6, 30))
    refresh_delivery_stats(now=at(6, 31))
    for hour in (7, 9, 11):  # while the refresh was not running
        history.attempt(billing, at(hour, 15), 500)

    refresh_delivery_stats(now=NOW)

    assert stored(MINUTE) == expected(history.sent, 60)
    assert stored(HOUR) == expected(history.sent, 3600)


def test_old_rows_are_deleted_and_old_attempts_not_recounted(history):
    billing = history.consumer("billing")
    history.attempt(billing, NOW - timedelta(days=3))  # older than minute rows are kept
    for age in (timedelta(days=2, minutes=1), timedelta(days=1)):
        DeliveryStats.objects.create(
            consumer=billing, span=MINUTE, period_start=NOW - age, attempts=1, delivered=1
        )
    for age in (timedelta(days=8, hours=1), timedelta(days=7)):
        DeliveryStats.objects.create(
            consumer=billing, span=HOUR, period_start=NOW - age, attempts=5, delivered=5
        )

    refresh_delivery_stats(now=NOW)

    assert set(DeliveryStats.objects.values_list("span", "period_start")) == {
        (MINUTE, NOW - timedelta(days=1)),
        (HOUR, NOW - timedelta(days=7)),
    }


def test_recent_adds_up_the_rows_of_a_window(history):
    billing, audit = history.consumer("billing"), history.consumer("audit")
    history.attempt(billing, at(11, 40, 10))  # just outside the last hour
    history.attempt(billing, at(11, 41, 10))
    history.attempt(billing, at(12, 40, 10), 500)
    history.attempt(audit, at(12, 40, 20))
    refresh_delivery_stats(now=NOW)

    hour = recent(MINUTE, 60, now=NOW)

    assert hour.since == at(11, 41)
    assert len(hour.per_period) == 60
    assert (hour.total.attempts, hour.total.delivered, hour.total.failed) == (3, 2, 1)
    assert hour.per_consumer[billing.pk].success_rate == 0.5
    assert hour.per_period[at(12, 40)].attempts == 2
    day = recent(HOUR, 24, now=NOW)
    assert day.total.attempts == 4
    assert day.per_period[at(11, 0)].delivered == 2


def test_recent_of_one_consumer_has_its_own_periods_and_status_classes(history):
    billing, audit = history.consumer("billing"), history.consumer("audit")
    for status in (200, 204, 302, 404, 410, 500, None, 101):
        history.attempt(billing, at(12, 20), status)
    history.attempt(audit, at(12, 20), 503)
    refresh_delivery_stats(now=NOW)
    # A row counted before the classes were: its failure is in no class.
    DeliveryStats.objects.create(
        consumer=billing, span=MINUTE, period_start=at(12, 30), attempts=1, failed=1
    )

    hour = recent(MINUTE, 60, now=NOW, consumer_id=billing.pk)

    assert set(hour.per_consumer) == {billing.pk}
    assert hour.per_period[at(12, 20)].attempts == 8  # audit's attempt is not in it
    assert hour.per_period[at(12, 20)].failures == hour.total.failures
    assert hour.total.status_classes() == {
        "2xx": 2,
        "3xx": 1,
        "4xx": 2,
        "5xx": 1,
        "no answer": 1,
        "other": 2,  # the 101, and the failure of the row without classes
    }
    day = recent(HOUR, 24, now=NOW, consumer_id=billing.pk)
    assert day.total.status_classes()["4xx"] == 2
    assert recent(HOUR, 24, now=NOW).total.failures["5xx"] == 2  # every consumer's
    assert Tally(3, 3, 0).status_classes() == {
        "2xx": 3,
        "3xx": 0,
        "4xx": 0,
        "5xx": 0,
        "no answer": 0,
    }


def test_latency_buckets_and_percentiles():
    assert latency_bucket(-40) == latency_bucket(0.5) == 0
    assert latency_bucket(10) == 8
    assert latency_bucket(99) == 15
    assert latency_bucket(1e12) == 64
    rng = random.Random(3)  # noqa: S311
    latencies = sorted(rng.lognormvariate(5, 1.5) for _ in range(5000))
    tally = Tally(histogram=Counter(latency_bucket(ms) for ms in latencies))
    for quantile in (0.5, 0.95, 0.99):
        truth = latencies[math.ceil(quantile * len(latencies)) - 1]
        estimate = tally.latency_ms(quantile)
        assert estimate is not None
        assert abs(estimate / truth - 1) < 0.16
    assert Tally().latency_ms(0.5) is None
    assert bucket_estimate_ms(64) == 1e8


def test_the_sql_latency_bucket_agrees_with_python(history):
    billing = history.consumer("billing")
    for latency in (0.2, 7.0, 55.0, 930.0, 12_000.0, 4_000_000.0):
        history.attempt(billing, at(12, 0), waited_ms=latency - 0.1, duration_ms=0.1)
    rows = attempt_counts(at(12, 0), None)
    assert sorted(bucket for *_, bucket, _ in rows) == sorted(
        latency_bucket(sent.latency_ms) for sent in history.sent
    )


def test_a_scheduled_message_counts_its_latency_from_when_it_was_due(history):
    billing = history.consumer("billing")
    history.attempt(billing, at(12, 0), waited_ms=50.0, duration_ms=10.0)
    Message.objects.update(
        received_at=at(12, 0) - timedelta(days=1),  # broadcast a day before it was due
        scheduled_for=at(12, 0) - timedelta(milliseconds=50),
    )

    [(*_, bucket, _)] = attempt_counts(at(12, 0), None)

    assert bucket == latency_bucket(60.0)


def test_queue_depths_stop_at_their_bound(history):
    billing, audit = history.consumer("billing"), history.consumer("audit")
    history.job(billing, NOW)  # DELIVERED: not counted
    for status, count in ((QUEUED, 5), (INFLIGHT, 2), (DEAD, 3)):
        for _ in range(count):
            history.job(audit, NOW, status)

    depths = queue_depths(limit=4)

    assert depths[billing.pk].queued == BoundedCount(0, 4)
    assert str(depths[audit.pk].queued) == "≥ 4"
    assert depths[audit.pk].queued.capped
    assert (str(depths[audit.pk].in_flight), str(depths[audit.pk].dead)) == ("2", "3")
    assert str(queue_depths(limit=10_000)[audit.pk].queued) == "5"
    # Every consumer's together, each status counted on its own up to its bound.
    totals = status_totals(limit=6)
    assert (str(totals.queued), str(totals.in_flight), str(totals.dead)) == ("5", "2", "3")
    assert str(status_totals(limit=2).queued) == "≥ 2"


@pytest.mark.django_db(transaction=True)
def test_a_refresh_waits_for_one_already_running(history):
    billing = history.consumer("billing")
    for second in range(0, 300, 10):
        history.attempt(billing, at(12, 36) + timedelta(seconds=second))
    finished: list[int] = []
    errors: list[BaseException] = []

    def refresh() -> None:
        try:
            finished.append(refresh_delivery_stats(now=NOW))
        except BaseException as error:
            errors.append(error)
        finally:
            connections.close_all()

    with connection.cursor() as cursor:  # hold the refresh lock, as a running refresh does
        cursor.execute("BEGIN")
        cursor.execute("SELECT pg_advisory_xact_lock(%s)", [LOCK_ID])
        threads = [threading.Thread(target=refresh) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=1)
        assert finished == []  # both wait for the lock
        cursor.execute("COMMIT")
    for thread in threads:
        thread.join(timeout=30)

    assert not errors
    assert finished == [30, 30]
    assert stored(MINUTE) == expected(history.sent, 60)
    assert stored(HOUR) == expected(history.sent, 3600)


# Committed and emptied by TRUNCATE afterwards: rolled back, its 200,000 rows would stay as dead
# tuples and its ANALYZE's row counts in pg_class, slowing every later test of the worker.
@pytest.mark.django_db(transaction=True)
def test_the_refresh_reads_only_its_window_through_the_started_at_index(history):
    """200,000 attempts over nearly two days; the refresh's query for three minutes must find them
    through attempt_started_idx and reach jobs and messages by primary key, not scan tables."""
    consumer = history.consumer("billing")
    start = at(13, 0) - timedelta(days=2)  # the first run counts from here
    tables = {
        "message": Message._meta.db_table,
        "job": Job._meta.db_table,
        "attempt": DeliveryAttempt._meta.db_table,
    }
    statements = [
        """INSERT INTO {message} (channel_id, producer_id, public_id, payload, content_type,
            headers, priority, status, received_at, ordering_key, payload_size, payload_file)
        SELECT %(channel)s, 'shop', 'bulk-' || n, '\\x7b7d', 'application/json', '{{}}', 0,
            'DISPATCHED', %(start)s + n * interval '800 milliseconds', '', 2, ''
        FROM generate_series(1, 200000) AS n""",
        """INSERT INTO {job} (message_id, consumer_id, status, priority, ordering_key, attempts,
            next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at)
        SELECT id, %(consumer)s, 'DELIVERED', 0, '', 1, received_at, 0, '', received_at,
            received_at
        FROM {message} WHERE public_id LIKE 'bulk-%%'""",
        """INSERT INTO {attempt} (job_id, attempt_number, started_at, duration_ms, status_code,
            error_class, response_excerpt, dispatcher_id)
        SELECT id, 1, created_at + interval '50 milliseconds', 20, 200, '', '', 'd1'
        FROM {job} WHERE consumer_id = %(consumer)s""",
    ]
    parameters = {"channel": history.channel.pk, "consumer": consumer.pk, "start": start}
    with connection.cursor() as cursor:
        for statement in statements:
            cursor.execute(statement.format(**tables), parameters)
        cursor.execute("ANALYZE")

    window = start + timedelta(days=1)
    plan = attempt_counts(window, window + timedelta(minutes=3)).explain()

    assert "attempt_started_idx" in plan
    assert not scans_a_table(plan), plan
    assert refresh_delivery_stats(now=NOW) == 200_000  # first run: everything still kept
    assert sum(row.attempts for row in DeliveryStats.objects.filter(span=HOUR)) == 200_000
