"""Rows no time partition covers (docs/scaling.md, "Partitions"): jobs and attempts
older than every partition wait in the DEFAULT partitions, retention takes them there by rows,
the hourly maintenance places young jobs into a partition, and /_status, the dashboard and
/metrics warn while any are there."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.utils import timezone

from jobs import partitions
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, JobStatus
from tests.helpers import make_job, make_operator

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)
RETENTION_DAYS = 30


@pytest.fixture(autouse=True)
def retention(settings):
    settings.BROKER_RETENTION_DAYS = RETENTION_DAYS
    settings.BROKER_PUBLIC_METRICS = True  # /metrics read without a token below


def before_every_partition(now: datetime, at_least: timedelta) -> datetime:
    """A time at least `at_least` ago that no partition covers and none will: a day before the
    oldest partition (the database may hold partitions other tests made, and committed)."""
    partitions.ensure_partitions(now)
    oldest = [p.start for table in partitions.TABLES for p in partitions.partitions(table)[:1]]
    assert None not in oldest  # the tests' database is migrated empty: no "initial" partition
    return min(*filter(None, oldest), now - at_least + DAY) - DAY


def job_placed_at(status: JobStatus, at: datetime) -> Job:
    job = make_job(status)
    Job.objects.filter(pk=job.pk).update(partition_at=at, created_at=at)
    job.refresh_from_db()
    return job


def attempt(job: Job, started_at: datetime) -> DeliveryAttempt:
    return DeliveryAttempt.objects.create(
        job=job, attempt_number=1, started_at=started_at, duration_ms=1.0, dispatcher_id="d"
    )


def home(job: Job) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM jobs_job WHERE id = %s", [job.pk])
        return str(cursor.fetchone()[0])


def warnings_shown(client: Client) -> dict[str, Any]:
    """What /_status, /metrics and the dashboard say about the DEFAULT partitions."""
    status = client.get("/_status").json()
    metrics = client.get("/metrics").content.decode()
    dashboard = client.get("/ui/").content.decode()
    return {
        "status": (status["status"], status["defaultPartitions"], status["warnings"]),
        "metric": [line for line in metrics.splitlines() if line.startswith("broker_default_")],
        "dashboard": 'class="retention-behind"' in dashboard,
    }


def test_jobs_older_than_every_partition_are_retired_and_the_warning_goes(client):
    client.force_login(make_operator())
    now = timezone.now()
    long_ago = before_every_partition(now, 100 * DAY)
    jobs = {status: job_placed_at(status, long_ago) for status in (DELIVERED, DEAD, QUEUED)}
    attempt(jobs[DELIVERED], long_ago)
    assert {home(job) for job in jobs.values()} == {partitions.JOBS.default}

    shown = warnings_shown(client)

    status, counted, warnings = shown["status"]
    assert status == "ok"  # a warning, not a failed health check
    assert counted == {"jobs": 3, "attempts": 1, "countedUpTo": 1000}
    assert warnings == [
        "3 jobs and 1 attempt are in the DEFAULT partitions (no time partition covers them):"
        " is the hourly 'broker: maintain partitions' schedule running? Retention takes them row"
        " by row (docs/scaling.md)."
    ]
    assert shown["metric"] == [
        'broker_default_partition_rows{table="jobs_job"} 3.0',
        'broker_default_partition_rows{table="jobs_deliveryattempt"} 1.0',
    ]
    assert shown["dashboard"] is True

    partitions.maintain_partitions()  # the hourly task

    # The delivered job went with its attempt; the unfinished ones were carried forward.
    assert set(Job.objects.values_list("pk", flat=True)) == {jobs[DEAD].pk, jobs[QUEUED].pk}
    assert not DeliveryAttempt.objects.exists()
    current = partitions.JOBS.partition_name(partitions.span_start(now))
    assert {home(jobs[DEAD]), home(jobs[QUEUED])} == {current}
    assert warnings_shown(client) == {
        "status": ("ok", {"jobs": 0, "attempts": 0, "countedUpTo": 1000}, []),
        "metric": [
            'broker_default_partition_rows{table="jobs_job"} 0.0',
            'broker_default_partition_rows{table="jobs_deliveryattempt"} 0.0',
        ],
        "dashboard": False,
    }


def test_young_jobs_are_placed_in_the_oldest_partition_after_them_and_retire_with_it(settings):
    now = timezone.now()
    settings.BROKER_RETENTION_DAYS = 0  # keeps everything: every job of the DEFAULT one is young
    young = before_every_partition(now, 10 * DAY)
    jobs = {status: job_placed_at(status, young) for status in (DELIVERED, DEAD, QUEUED, INFLIGHT)}
    attempt(jobs[DELIVERED], young)
    oldest = partitions.partitions(partitions.JOBS)[0]

    assert partitions.place_default_jobs(now) == 3

    for status in (DELIVERED, DEAD, QUEUED):
        placed = Job.objects.get(pk=jobs[status].pk)
        assert (home(placed), placed.partition_at) == (oldest.name, oldest.start)
        assert (placed.status, placed.created_at) == (status, young)  # nothing else changed
    # An in-flight job's outcome is recorded by its partition key: it waits for the next run.
    assert home(jobs[INFLIGHT]) == partitions.JOBS.default
    Job.objects.filter(pk=jobs[INFLIGHT].pk).update(status=DELIVERED)
    assert partitions.place_default_jobs(now) == 1
    # Attempts keep their time (when they were made): they wait for retention.
    assert partitions.default_partition_rows() == partitions.DefaultRows(jobs=0, attempts=1)

    # Retention past the oldest partition's end: it goes whole with its delivered jobs, the
    # attempt goes by its age, and the warning with it.
    settings.BROKER_RETENTION_DAYS = RETENTION_DAYS
    with time_machine.travel(oldest.end + (RETENTION_DAYS + 1) * DAY):
        partitions.maintain_partitions()

    assert oldest not in partitions.partitions(partitions.JOBS)
    assert set(Job.objects.values_list("status", flat=True)) == {DEAD, QUEUED}
    assert not DeliveryAttempt.objects.exists()
    assert not partitions.default_partition_rows()


def test_jobs_past_every_partition_wait_for_theirs():
    """A job dated after every partition (a clock ahead) is left where it is: its partition
    moves it in when it is made."""
    now = timezone.now()
    partitions.ensure_partitions(now)
    ahead = partitions.partitions(partitions.JOBS)[-1].end + 3 * DAY
    job = job_placed_at(DELIVERED, ahead)

    assert partitions.place_default_jobs(now) == 0
    assert home(job) == partitions.JOBS.default

    partitions.ensure_partitions(ahead)
    assert home(job) == partitions.JOBS.partition_name(partitions.span_start(ahead))
    assert not partitions.default_partition_rows()
