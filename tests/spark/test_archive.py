"""`spark_etl archive` against PostgreSQL: the Parquet holds exactly the rows that were deleted,
offloaded payloads included, and a run interrupted at any step, then run again, loses nothing and
duplicates nothing.

The jobs here sit in the DEFAULT partition of the partitioned jobs table (placed at a time no
partition covers), where the archive takes them with their messages, batch by batch, as it does
every job on a database whose tables are not partitioned; test_archive_partitions.py covers the
archive of whole partitions."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from broker import payloads
from broker.models import Message, PeriodicMessage
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from spark_etl import pipeline
from spark_etl.store import ARCHIVE_LOCK
from tests.helpers import make_channel, make_consumer, make_producer
from tests.spark.conftest import spark_test

pytestmark = spark_test

TABLES = {"messages": "broker_message", "jobs": "jobs_job", "attempts": "jobs_deliveryattempt"}
NO_PARTITION = datetime(2000, 1, 1, tzinfo=UTC)  # before any time partition: the DEFAULT one


Offloaded = dict[int, tuple[str, bytes]]  # message id -> (stored file name, payload)


class SimulatedCrash(Exception):
    pass


def make_message(channel: str, received_at: datetime, number: int, **fields) -> Message:
    return Message.objects.create(
        channel_id=channel,
        producer_id="shop",
        public_id=f"m-{number}",
        payload=fields.pop("payload", b'{"n": %d}' % number),
        content_type="application/json",
        status=fields.pop("status", Message.Status.DISPATCHED),
        received_at=received_at,
        headers={"X-Trace": f"t-{number}"},
        **fields,
    )


def add_job(message: Message, consumer: Consumer, status: str, failures: int = 0) -> Job:
    job = Job.objects.create(
        message=message, consumer=consumer, status=status, attempts=failures + 1
    )
    Job.objects.filter(pk=job.pk).update(partition_at=NO_PARTITION)
    for number in range(1, failures + 2):
        ok = status == "DELIVERED" and number == failures + 1
        DeliveryAttempt.objects.create(
            job=job,
            attempt_number=number,
            started_at=message.received_at + timedelta(seconds=number),
            duration_ms=12.5 * number,
            status_code=200 if ok else (503 if number % 2 else None),
            error_class="" if ok else ("http-status" if number % 2 else "timeout"),
            response_excerpt="fine" if ok else "down",
            dispatcher_id="host:1:abc",
        )
    return job


def old_and_new_history() -> tuple[set[int], Offloaded]:
    """Messages to archive (their ids) and the offloaded payloads among them; and messages that
    must stay: a queued job, a scheduled message, a recent one."""
    make_producer()
    orders, users = make_channel("orders"), make_channel("users")
    billing, audit = make_consumer(orders, "billing"), make_consumer(orders, "audit", "pull")
    crm = make_consumer(users, "crm")
    old = timezone.now() - timedelta(days=40)
    archived, offloaded = set(), {}
    for number in range(6):
        channel, consumers = ("orders", [billing, audit]) if number % 3 else ("users", [crm])
        received = old + timedelta(days=number % 2, hours=number)
        message = make_message(channel, received, number)
        for index, consumer in enumerate(consumers):
            add_job(
                message, consumer, "DEAD" if (number + index) % 4 == 0 else "DELIVERED", number % 3
            )
        archived.add(message.pk)
    big = b"x" * 300_000 + b"!"
    name = payloads.store(big)
    message = make_message("orders", old, 10, payload=b"", payload_file=name, payload_size=len(big))
    add_job(message, billing, "DELIVERED")
    archived.add(message.pk)
    offloaded[message.pk] = (name, big)
    no_consumer = make_message("users", old, 11, status=Message.Status.ACKNOWLEDGED)
    archived.add(no_consumer.pk)
    PeriodicMessage.objects.create(
        channel_id="users", producer_id="shop", public_id="tick", payload=b"{}",
        content_type="application/json", interval_seconds=60, last_message=no_consumer,
    )  # fmt: skip
    # Must stay: a job still queued, a scheduled message, a recent message.
    add_job(make_message("orders", old, 20), billing, "QUEUED")
    make_message("orders", old, 21, status=Message.Status.SCHEDULED, scheduled_for=old)
    add_job(make_message("orders", timezone.now() - timedelta(days=1), 22), billing, "DELIVERED")
    return archived, offloaded


def snapshot(message_ids: set[int]) -> dict[str, dict[int, dict[str, Any]]]:
    """Every column of the rows of these messages, their jobs and their attempts."""
    queries = {
        "messages": "SELECT * FROM broker_message WHERE id = ANY(%s)",
        "jobs": "SELECT * FROM jobs_job WHERE message_id = ANY(%s)",
        "attempts": "SELECT a.* FROM jobs_deliveryattempt a JOIN jobs_job j ON j.id = a.job_id"
        " WHERE j.message_id = ANY(%s)",
    }
    rows: dict[str, dict[int, dict[str, Any]]] = {}
    with connection.cursor() as cursor:
        for table, query in queries.items():
            cursor.execute(query, [list(message_ids)])
            names = [column.name for column in cursor.description]
            rows[table] = {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
    return rows


def normalised(value):
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)  # Spark's are UTC here
    if isinstance(value, bytearray | memoryview):
        return bytes(value)
    return value


def archived_rows(spark, config, table: str, columns: list[str]) -> list[dict[str, Any]]:
    frame = spark.read.parquet(f"{config.archive_path}/{table}")
    rows = []
    for row in frame.collect():
        found = {name: normalised(row[name]) for name in columns}
        if table == "messages":
            found["headers"] = json.loads(found["headers"])
        rows.append(found)
    return rows


def assert_archive_equals(spark, config, before: dict[str, Any], offloaded: Offloaded) -> None:
    """Each row once in Parquet, equal in every column to the row as it was in PostgreSQL."""
    for table, expected in before.items():
        columns = list(next(iter(expected.values())))
        rows = archived_rows(spark, config, table, columns)
        assert sorted(row["id"] for row in rows) == sorted(expected), table
        for row in rows:
            want = {name: normalised(value) for name, value in expected[row["id"]].items()}
            if table == "messages":
                want["headers"] = json.loads(want["headers"])  # jsonb comes as text both ways
            if table == "messages" and row["id"] in offloaded:
                want["payload"] = offloaded[row["id"]][1]  # the archive holds the stored payload
            assert row == want, (table, row["id"])


def assert_deleted(message_ids: set[int], offloaded: Offloaded) -> None:
    assert not Message.objects.filter(pk__in=message_ids).exists()
    assert not Job.objects.filter(message_id__in=message_ids).exists()
    assert not DeliveryAttempt.objects.filter(job__message_id__in=message_ids).exists()
    for name, _ in offloaded.values():
        assert not payloads.payload_storage().exists(name)


def test_archive_round_trip(spark, etl_config):
    archived, offloaded = old_and_new_history()
    before = snapshot(archived)
    staying = set(Message.objects.exclude(pk__in=archived).values_list("pk", flat=True))
    config = replace(etl_config, archive_batch=4, delete_chunk=2)

    result = pipeline.run_archive(spark, config)

    assert result.messages == len(archived)
    assert not result.kept
    assert result.batches == 2
    assert_archive_equals(spark, config, before, offloaded)
    assert_deleted(archived, offloaded)
    assert set(Message.objects.values_list("pk", flat=True)) == staying
    assert PeriodicMessage.objects.get().last_message is None
    # Partitioned by batch, then channel and date.
    root = Path(config.archive_path, "messages")
    partitions = {path.relative_to(root).parts for path in root.glob("batch=*/channel=*/date=*")}
    assert {channel for _, channel, _ in partitions} == {"channel=orders", "channel=users"}
    assert {batch for batch, _, _ in partitions} == {"batch=000000001", "batch=000000002"}
    assert not any(Path(config.archive_path, "_staging").iterdir())

    # A second run finds nothing more to do.
    assert pipeline.run_archive(spark, config).messages == 0


def test_an_interrupted_archive_loses_and_duplicates_nothing(spark, etl_config):
    """Crash once at every step: each run stops at the next step not crashed at yet, the next
    run continues from there. In the end every row is archived once and deleted."""
    archived, offloaded = old_and_new_history()
    before = snapshot(archived)
    config = replace(etl_config, delete_chunk=2)  # one batch, deleted in several chunks
    steps = ["planned", "staged", "written", "published attempts", "published jobs"]
    steps += ["published messages", "published", "deleted chunk", "deleted", "done"]
    crashed: list[str] = []

    def crash_once(step: str) -> None:
        if step not in crashed:
            crashed.append(step)
            raise SimulatedCrash(step)

    for _ in range(len(steps)):
        with pytest.raises(SimulatedCrash):
            pipeline.run_archive(spark, config, checkpoint=crash_once)
    assert crashed == steps
    pipeline.run_archive(spark, config, checkpoint=crash_once)  # no step left to crash at

    assert_archive_equals(spark, config, before, offloaded)
    assert_deleted(archived, offloaded)


def test_a_job_requeued_during_the_archive_keeps_its_message(spark, etl_config):
    archived, _ = old_and_new_history()
    dead = Job.objects.filter(status="DEAD", message_id__in=archived).order_by("pk")[0]

    def requeue_once_published(step: str) -> None:
        if step == "published" and dead.status == "DEAD":
            dead.requeue()

    result = pipeline.run_archive(spark, etl_config, checkpoint=requeue_once_published)

    assert result.kept == [dead.message_id]
    dead.refresh_from_db()
    assert dead.status == "QUEUED"  # the job, its message and attempts are all still there
    assert DeliveryAttempt.objects.filter(job=dead).exists()
    assert not Message.objects.filter(pk__in=archived - {dead.message_id}).exists()


def test_one_run_at_a_time_and_a_failed_runs_lock_is_free_at_once(spark, etl_config):
    """The lock is let go as the run ends, not when its server process gets round to exiting:
    a retry right after a failed step found it still held on a busy machine."""
    old_and_new_history()
    with psycopg.connect(**etl_config.database.psycopg_kwargs(), autocommit=True) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [ARCHIVE_LOCK])
        with pytest.raises(pipeline.ArchiveBusy):
            pipeline.run_archive(spark, etl_config)

    def crash(step: str) -> None:
        raise SimulatedCrash(step)

    with pytest.raises(SimulatedCrash):
        pipeline.run_archive(spark, etl_config, checkpoint=crash)
    with psycopg.connect(**etl_config.database.psycopg_kwargs(), autocommit=True) as other:
        taken = other.execute("SELECT pg_try_advisory_lock(%s)", [ARCHIVE_LOCK]).fetchone()
    assert taken == (True,)
