"""Time partitions of jobs and attempts on PostgreSQL (jobs/partitions/, docs/scaling.md):
made ahead, rows no partition covers kept in the DEFAULT one and moved when theirs comes,
retention by dropping whole partitions with unfinished jobs carried forward, and the migration
that partitions a populated database in place."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import uuid
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from django.db import connection
from django.utils import timezone

from jobs import partitions
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, JobStatus
from tests import ROOT
from tests.helpers import another_session, make_job

pytestmark = pytest.mark.django_db
DAY = timedelta(days=1)


def placed_job(status: JobStatus, at) -> Job:
    """A job in the partition of `at` (the test's clock): the database would place it by its
    own clock, which the tests may have moved away from (--clock-ahead-days)."""
    partitions.ensure_partitions(at)
    job = make_job(status)
    Job.objects.filter(pk=job.pk).update(partition_at=at)
    job.refresh_from_db()
    return job


def home(job: Job) -> str:
    """The partition that holds the job's row."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT tableoid::regclass::text FROM jobs_job WHERE id = %s", [job.pk])
        (partition,) = cursor.fetchone()
    return str(partition)


def names(table: partitions.Table) -> list[str]:
    return [partition.name for partition in partitions.partitions(table)]


def attempt(job: Job, started_at) -> DeliveryAttempt:
    return DeliveryAttempt.objects.create(
        job=job, attempt_number=1, started_at=started_at, duration_ms=1.0, dispatcher_id="d"
    )


def test_both_tables_are_partitioned_by_time_with_partitions_ahead():
    now = timezone.now()
    partitions.ensure_partitions(now)  # as housekeeping does hourly
    for table in partitions.TABLES:
        assert partitions.is_partitioned(table)
        covered = partitions.partitions(table)
        assert covered[-1].end >= now + partitions.AHEAD
        assert all(a.end == b.start for a, b in itertools.pairwise(covered))
    job = placed_job(QUEUED, now)
    assert home(job) == partitions.JOBS.partition_name(partitions.span_start(now))


def test_a_row_no_partition_covers_waits_in_the_default_partition_then_moves_into_its_own():
    job = placed_job(DEAD, timezone.now())
    later = timezone.now() + 30 * DAY
    Job.objects.filter(pk=job.pk).update(partition_at=later)
    assert home(job) == "jobs_job_default"

    created = partitions.ensure_partitions(later)

    assert partitions.JOBS.partition_name(partitions.span_start(later)) in created
    assert home(job) == partitions.JOBS.partition_name(partitions.span_start(later))
    assert Job.objects.with_public_id(job.public_id).get().status == DEAD


def test_a_partition_whose_lock_is_not_granted_is_left_for_the_next_run_naming_the_holder(
    monkeypatch, caplog
):
    monkeypatch.setattr(partitions.catalog, "LOCK_TRIES", 1)
    later = timezone.now() + 30 * DAY
    with another_session() as writer:
        writer.execute("LOCK TABLE jobs_job_default IN ROW EXCLUSIVE MODE")
        created = partitions.ensure_partitions(later)
        holder = writer.info.backend_pid

    assert not [name for name in created if name.startswith("jobs_job_")]
    missing = partitions.JOBS.partition_name(partitions.span_start(later))
    assert missing not in names(partitions.JOBS)
    assert f"lock not granted in {partitions.LOCK_TIMEOUT}, trying again; the oldest" in caplog.text
    assert f"pid {holder} " in caplog.text

    assert missing in partitions.ensure_partitions(later)


def test_retention_drops_a_delivered_partition_and_carries_unfinished_jobs_forward():
    now = timezone.now()
    jobs = {status: placed_job(status, now) for status in (DELIVERED, DEAD, QUEUED, INFLIGHT)}
    for job in jobs.values():
        attempt(job, now)
    old = home(jobs[DELIVERED])
    later = now + 40 * DAY
    partitions.ensure_partitions(later)

    dropped = partitions.retire_partitions(later, days=30)

    # The in-flight job holds its partition back; the unfinished ones left it, same IDs.
    assert old in names(partitions.JOBS)
    assert old not in dropped
    for status in (DEAD, QUEUED):
        carried = Job.objects.with_public_id(jobs[status].public_id).get()
        assert (carried.status, carried.partition_at) == (status, later)
        assert home(carried) == partitions.JOBS.partition_name(partitions.span_start(later))
    # Attempts go by their own age.
    assert not DeliveryAttempt.objects.exists()
    assert not any(
        name.endswith(old.removeprefix("jobs_job")) for name in names(partitions.ATTEMPTS)
    )

    Job.objects.filter(pk=jobs[INFLIGHT].pk).update(status=DELIVERED)
    assert partitions.retire_partitions(later, days=30) == [old]
    # The delivered jobs went with it.
    assert set(Job.objects.values_list("pk", flat=True)) == {jobs[DEAD].pk, jobs[QUEUED].pk}


def test_retention_deletes_old_delivered_rows_of_the_default_partition_and_keeps_the_rest():
    now = timezone.now()
    delivered, dead = make_job(DELIVERED), make_job(DEAD)
    long_ago = now - 100 * DAY  # before every partition: the DEFAULT one holds it
    Job.objects.update(partition_at=long_ago)
    attempt(delivered, long_ago)
    assert {home(delivered), home(dead)} == {"jobs_job_default"}

    partitions.retire_partitions(now, days=30)

    assert list(Job.objects.values_list("pk", flat=True)) == [dead.pk]
    assert Job.objects.get().partition_at == now
    assert not DeliveryAttempt.objects.exists()


def test_nothing_is_retired_when_retention_keeps_everything():
    make_job(DELIVERED)
    assert partitions.retire_partitions(timezone.now() + 400 * DAY, days=0) == []
    assert Job.objects.exists()


def test_the_migration_partitions_a_populated_database_in_place():
    """Jobs and attempts written before the migration stay where they are, with their IDs, as
    each table's "initial" partition with every index attached; new jobs take the IDs after
    theirs; retention later carries the unfinished ones out and drops it."""
    settings = connection.settings_dict
    server = f"postgres://{settings['USER']}@{settings['HOST']}:{settings['PORT']}"
    name = f"broker_migration_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = f"{server}/{name}"
    try:
        for app in ("auth", "broker", "consumers"):  # all but jobs; auth first for its signals
            manage(url, "migrate", "--no-input", "-v", "0", app)
        manage(url, "migrate", "--no-input", "-v", "0", "jobs", "0013")
        manage(url, "shell", "-c", POPULATE)
        with psycopg.connect(url, autocommit=True) as database:
            before = statuses(database)
            (last_id,) = one(database, "SELECT max(id) FROM jobs_job")

        manage(url, "migrate", "--no-input", "-v", "0")

        with psycopg.connect(url, autocommit=True) as database:
            assert statuses(database) == before
            assert statuses(database, "jobs_job_initial") == before
            assert unattached_indexes(database) == []
            assert one(database, NEW_JOB) == (last_id + 1,)
        manage(url, "shell", "-c", RETIRE_IN_40_DAYS)
        with psycopg.connect(url, autocommit=True) as database:
            assert statuses(database) == {DEAD: before[DEAD], QUEUED: before[QUEUED] + 1}
            assert one(database, "SELECT to_regclass('jobs_job_initial')") == (None,)
    finally:
        with psycopg.connect(f"{server}/postgres", autocommit=True) as admin:
            admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')


# 2,000 messages to 10 consumers, their jobs in three states and an attempt each; jobs and
# attempts in SQL, as the models have moved on since jobs 0013 (which has no partition_at).
POPULATE = """
from django.db import connection
from django.utils import timezone
from broker.models import Message
from tests.helpers import make_channel, make_consumer, make_producer
channel, producer = make_channel(), make_producer()
for n in range(10):
    make_consumer(channel, consumer_id=f"c{n}")
Message.objects.bulk_create(
    Message(channel=channel, producer=producer, public_id=f"m{n}", payload=b"{}",
            content_type="application/json", status="DISPATCHED", received_at=timezone.now())
    for n in range(2000)
)
with connection.cursor() as cursor:
    cursor.execute(
        "INSERT INTO jobs_job (message_id, consumer_id, status, priority, ordering_key, attempts,"
        " next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at,"
        " enqueued_at) SELECT m.id, c.id, (ARRAY['QUEUED', 'DEAD', 'DELIVERED'])[1 + (m.id + c.id)"
        " % 3], 0, '', 1, now(), 0, '', now(), now(), now()"
        " FROM broker_message m CROSS JOIN consumers_consumer c"
    )
    cursor.execute(
        "INSERT INTO jobs_deliveryattempt (job_id, consumer_id, attempt_number, started_at,"
        " duration_ms, status_code, error_class, response_excerpt, dispatcher_id)"
        " SELECT id, consumer_id, 1, now() - interval '1 hour', 5, 200, '', '', 'd' FROM jobs_job"
    )
"""
NEW_JOB = """
INSERT INTO jobs_job (message_id, consumer_id, status, priority, ordering_key, attempts,
    next_attempt_at, incremental_timeout, last_error, created_at, status_changed_at)
SELECT message_id, consumer_id, 'QUEUED', 0, '', 0, now(), 0, '', now(), now()
FROM jobs_job WHERE status = 'DELIVERED' LIMIT 1 RETURNING id
"""
RETIRE_IN_40_DAYS = """
from datetime import timedelta
from typing import Any
from django.utils import timezone
from jobs import partitions
later = timezone.now() + timedelta(days=40)
partitions.ensure_partitions(later)
partitions.retire_partitions(later, days=30)
"""


def manage(url: str, *arguments: str) -> None:
    subprocess.run(
        [sys.executable, "manage.py", *arguments],
        cwd=ROOT,
        env={**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "broker.settings"},
        check=True,
        timeout=300,
    )


def one(database: psycopg.Connection, query: str) -> tuple[Any, ...]:
    row = database.execute(query).fetchone()
    assert row is not None
    return row


def statuses(database: psycopg.Connection, table: str = "jobs_job") -> dict[str, int]:
    query = f"SELECT status, count(*) FROM {table} GROUP BY status"  # noqa: S608
    return dict(database.execute(query).fetchall())


def unattached_indexes(database: psycopg.Connection) -> list[str]:
    """The partitions' indexes that are invalid or that no index of their parent holds."""
    return [name for (name,) in database.execute(partitions.UNATTACHED_INDEXES_SQL).fetchall()]
