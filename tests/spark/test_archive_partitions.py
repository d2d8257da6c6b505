"""`spark_etl archive` on the partitioned tables: old partitions whose jobs are all finished are
detached, copied to Parquet and dropped whole; a partition with an unfinished job waits; attempts
of jobs carried forward are archived with their own partition; every row reaches Parquet once,
across runs and crashes. Housekeeping leaves retention to the archive once it has run."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.db import connection
from django.utils import timezone

from broker.models import Message
from consumers.models import Consumer
from jobs import housekeeping, partitions
from jobs.models import DeliveryAttempt, Job
from spark_etl import pipeline
from tests.helpers import make_channel, make_consumer, make_producer
from tests.spark.conftest import spark_test
from tests.spark.test_archive import SimulatedCrash

pytestmark = spark_test

DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def daily_partitions(settings):
    """The histories below are laid out in daily partitions (the default is weekly)."""
    settings.BROKER_PARTITION_DAYS = 1


class History:
    """Jobs placed in daily partitions 40 and 39 days back (the retention is 30 days)."""

    def __init__(self) -> None:
        make_producer()
        channel = make_channel("orders")
        self.billing, self.audit = (
            make_consumer(channel, "billing"),
            make_consumer(channel, "audit"),
        )
        self.now = timezone.now()
        self.first_day = partitions.span_start(self.now - 40 * DAY)
        self.second_day = self.first_day + DAY
        partitions.ensure_partitions(self.now, since=self.first_day - 2 * DAY)
        self.count = 0

    def message(self, received_at) -> Message:
        self.count += 1
        return Message.objects.create(
            channel_id="orders", producer_id="shop", public_id=f"m-{self.count}",
            payload=b'{"n": %d}' % self.count, content_type="application/json",
            status=Message.Status.DISPATCHED, received_at=received_at,
        )  # fmt: skip

    def job(self, message: Message, consumer: Consumer, status: str, placed_at) -> Job:
        """A job created with its message, in the partition of `placed_at`, with one attempt."""
        job = Job.objects.create(message=message, consumer=consumer, status=status, attempts=1)
        Job.objects.filter(pk=job.pk).update(partition_at=placed_at, created_at=message.received_at)
        self.attempt(job, message.received_at + timedelta(minutes=5))
        return job

    @staticmethod
    def attempt(job: Job, started_at) -> DeliveryAttempt:
        return DeliveryAttempt.objects.create(
            job=job, attempt_number=1, started_at=started_at, duration_ms=3.0,
            status_code=200, dispatcher_id="host:1:abc",
        )  # fmt: skip


def relation_exists(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [name])
        return bool(cursor.fetchone()[0])


def home(job: Job) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM jobs_job WHERE id = %s", [job.pk])
        return str(cursor.fetchone()[0])


def archived_ids(spark, config, table: str) -> Counter[int]:
    frame = spark.read.parquet(f"{config.archive_path}/{table}")
    return Counter(row["id"] for row in frame.select("id").collect())


def test_old_partitions_are_archived_whole_and_a_partition_with_a_queued_job_waits(
    spark, etl_config
):
    history = History()
    first, second = history.first_day + timedelta(hours=3), history.second_day + timedelta(hours=3)
    # The first day: all finished. One delivery was retried the next day (an attempt in the next
    # day's attempt partition), and a job of another message was carried forward, still queued.
    delivered = history.message(first)
    retried = history.job(delivered, history.billing, "DELIVERED", first)
    history.attempt(retried, second)
    dead = history.job(delivered, history.audit, "DEAD", first)
    history.attempt(dead, first - timedelta(seconds=30))  # by a dispatcher's clock, behind
    carried_message = history.message(first)
    carried = history.job(carried_message, history.billing, "QUEUED", history.now)
    # The second day: a job still queued holds its partition back, and with it the other
    # message whose jobs are there.
    waiting_message = history.message(second)
    waiting = history.job(waiting_message, history.billing, "QUEUED", second)
    neighbour = history.message(second)
    neighbour_job = history.job(neighbour, history.billing, "DELIVERED", second)

    def attempts_of(*jobs: Job) -> list[int]:
        return list(DeliveryAttempt.objects.filter(job__in=jobs).values_list("pk", flat=True))

    first_run_attempts = attempts_of(retried, dead, carried)
    second_run_attempts = attempts_of(waiting, neighbour_job)

    result = pipeline.run_archive(spark, etl_config)

    first_jobs, second_jobs = (
        partitions.JOBS.partition_name(history.first_day),
        partitions.JOBS.partition_name(history.second_day),
    )
    first_attempts = partitions.ATTEMPTS.partition_name(history.first_day)
    second_attempts = partitions.ATTEMPTS.partition_name(history.second_day)
    assert not relation_exists(first_jobs)
    assert not relation_exists(first_attempts)
    assert relation_exists(second_jobs)
    assert relation_exists(second_attempts)
    assert first_jobs in result.partitions
    assert first_attempts in result.partitions
    assert archived_ids(spark, etl_config, "jobs") == Counter([retried.pk, dead.pk])
    # Each attempt once: with its job, or, for the job carried forward, with its partition.
    assert archived_ids(spark, etl_config, "attempts") == Counter(first_run_attempts)
    assert archived_ids(spark, etl_config, "messages") == Counter([delivered.pk])
    assert set(Message.objects.values_list("pk", flat=True)) == {
        carried_message.pk, waiting_message.pk, neighbour.pk,
    }  # fmt: skip
    assert set(Job.objects.values_list("pk", flat=True)) == {
        carried.pk,
        waiting.pk,
        neighbour_job.pk,
    }

    # Housekeeping now leaves old partitions to the archive: it carries the queued job out of
    # the second day's partition into the current one and drops nothing; the purge deletes
    # nothing.
    assert partitions.archive_owns_retention()
    assert partitions.retire_partitions(timezone.now()) == []
    assert home(waiting) == home(carried)
    assert housekeeping.purge_delivered() == 0

    second_run = pipeline.run_archive(spark, etl_config)

    assert second_jobs in second_run.partitions
    assert second_attempts in second_run.partitions
    assert not relation_exists(second_jobs)
    assert archived_ids(spark, etl_config, "jobs") == Counter(
        [retried.pk, dead.pk, neighbour_job.pk]
    )
    assert archived_ids(spark, etl_config, "attempts") == Counter(
        first_run_attempts + second_run_attempts
    )
    assert archived_ids(spark, etl_config, "messages") == Counter([delivered.pk, neighbour.pk])
    assert set(Job.objects.values_list("pk", flat=True)) == {carried.pk, waiting.pk}
    assert set(Message.objects.values_list("pk", flat=True)) == {
        carried_message.pk, waiting_message.pk,
    }  # fmt: skip

    call_command("install_schedules", "--no-spark")
    assert not partitions.archive_owns_retention()


def test_an_archive_interrupted_at_each_step_of_a_partition_loses_and_duplicates_nothing(
    spark, etl_config
):
    history = History()
    first = history.first_day + timedelta(hours=1)
    jobs = [
        history.job(history.message(first), consumer, status, first)
        for consumer, status in ((history.billing, "DELIVERED"), (history.audit, "DEAD"))
    ]
    attempts = list(DeliveryAttempt.objects.values_list("pk", flat=True))
    steps = ["partition staged", "partition written", "published attempts", "published jobs"]
    steps += ["partition published", "partition dropped"]
    crashed: list[str] = []

    def crash_once(step: str) -> None:
        if step in steps and step not in crashed:
            crashed.append(step)
            raise SimulatedCrash(step)

    for _ in range(len(steps)):
        with pytest.raises(SimulatedCrash):
            pipeline.run_archive(spark, etl_config, checkpoint=crash_once)
    pipeline.run_archive(spark, etl_config, checkpoint=crash_once)

    assert crashed == steps
    assert archived_ids(spark, etl_config, "jobs") == Counter(job.pk for job in jobs)
    assert archived_ids(spark, etl_config, "attempts") == Counter(attempts)
    assert not Job.objects.exists()
    assert not Message.objects.exists()
    assert not relation_exists(partitions.JOBS.partition_name(history.first_day))


def test_jobs_older_than_every_partition_are_archived_by_rows_and_the_warning_goes(
    spark, etl_config
):
    """Jobs and attempts that no partition covers (the DEFAULT partitions: housekeeping was
    behind, or old data came in) are archived with their messages, row by row."""
    history = History()
    oldest = [p.start for table in partitions.TABLES for p in partitions.partitions(table)[:1]]
    long_ago = min(*filter(None, oldest), history.now - 40 * DAY) - DAY
    message = history.message(long_ago)
    jobs = [
        history.job(message, history.billing, "DELIVERED", long_ago),
        history.job(message, history.audit, "DEAD", long_ago),
    ]
    attempts = list(DeliveryAttempt.objects.values_list("pk", flat=True))
    assert {home(job) for job in jobs} == {partitions.JOBS.default}
    assert partitions.default_partition_rows() == partitions.DefaultRows(jobs=2, attempts=2)

    result = pipeline.run_archive(spark, etl_config)

    assert result.messages == 1
    assert archived_ids(spark, etl_config, "jobs") == Counter(job.pk for job in jobs)
    assert archived_ids(spark, etl_config, "attempts") == Counter(attempts)
    assert archived_ids(spark, etl_config, "messages") == Counter([message.pk])
    assert not Job.objects.exists()
    assert not DeliveryAttempt.objects.exists()
    assert not partitions.default_partition_rows()
