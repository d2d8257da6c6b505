"""Time partitions of the jobs and attempts tables on PostgreSQL (docs/scaling.md, "Partitions").

Deleting delivered jobs row by row cannot keep up with 100,000,000 jobs a day, so on PostgreSQL
both big tables are partitioned by time and retention drops whole partitions:

- `jobs_job` by RANGE (`partition_at`): when the job was created, or when retention last carried
  it forward unfinished. It is not `created_at` because a job's public ID is made of its key and
  creation second, which must never change, while an unfinished job must be able to leave a
  partition that is being dropped.
- `jobs_deliveryattempt` by RANGE (`started_at`): attempts are history, kept for the retention
  period after they were made.

Each table has one partition per BROKER_PARTITION_DAYS days (aligned to the UTC epoch), created
ahead by housekeeping (`maintain_partitions`, hourly), and a DEFAULT partition that takes rows no
other partition covers: publishing never fails because housekeeping did not run; the rows are
moved into their partition when it is created. Rows no partition will ever cover (older than
every partition: housekeeping stopped for longer than a span, a clock jump, old data imported)
are handled by rows, in short batches (`place_default_jobs`, and retention below), never by
creating a partition over them; /_status, the dashboard and /metrics warn while any are there
(default_rows.py). The migration that partitions a populated database
(jobs/migrations/0014_time_partitions.py) keeps the existing rows where they are, as one
"initial" partition, so it costs index builds and a validation scan, not a copy.

Retention (`retire_partitions`): a partition whose whole range is older than
BROKER_RETENTION_DAYS is dropped once every job in it is DELIVERED. Its stragglers, jobs still
QUEUED or DEAD, are first carried forward into the current partition in short batches (same ID,
same creation time, visible throughout), so that they never hold a drop back for long; an
INFLIGHT job is left to finish and carried on a later run. Attempt partitions are dropped by age
alone. The DEFAULT partitions' rows past retention go the same way, a batch at a time:
unfinished jobs carried forward, delivered jobs and old attempts deleted. Dropping a partition
takes a brief exclusive lock of the parent table; it is asked for with a short lock timeout and
tried again on the next run rather than queue writers behind it.

Where `spark_etl archive` runs (`archive_owns_retention`), the archive drops old partitions
instead, after copying them to Parquet, and takes the DEFAULT partition's old jobs by rows with
their messages; retention here only carries queued jobs forward.

The SQL of the package (catalog.py, creation.py, retention.py, default_rows.py) is put together
from the names of these two tables, their partitions and columns, never from input.
"""

from __future__ import annotations

from django.utils import timezone

from jobs.partitions.catalog import (
    AHEAD,
    ATTEMPTS,
    JOBS,
    LOCK_TIMEOUT,
    TABLES,
    UNATTACHED_INDEXES_SQL,
    Partition,
    Table,
    is_partitioned,
    partitions,
    span,
    span_start,
    sql_timestamp,
)
from jobs.partitions.creation import ensure_partitions, new_partition_table, plain_indexes
from jobs.partitions.default_rows import DefaultRows, default_partition_rows
from jobs.partitions.retention import (
    archive_owns_retention,
    carry_forward,
    forget_archive,
    place_default_jobs,
    retire_partitions,
)

__all__ = [
    "AHEAD",
    "ATTEMPTS",
    "JOBS",
    "LOCK_TIMEOUT",
    "TABLES",
    "UNATTACHED_INDEXES_SQL",
    "DefaultRows",
    "Partition",
    "Table",
    "archive_owns_retention",
    "carry_forward",
    "default_partition_rows",
    "ensure_partitions",
    "forget_archive",
    "is_partitioned",
    "maintain_partitions",
    "new_partition_table",
    "partitions",
    "place_default_jobs",
    "plain_indexes",
    "retire_partitions",
    "span",
    "span_start",
    "sql_timestamp",
]


def maintain_partitions() -> str:
    """The hourly housekeeping task: partitions ahead, then retention (docs/housekeeping.md)."""
    if not is_partitioned(JOBS):
        return "no partitioned tables"
    now = timezone.now()
    created = ensure_partitions(now)
    placed = place_default_jobs(now)
    retired = retire_partitions(now)
    return (
        f"created {len(created)} partitions, placed {placed} jobs of the DEFAULT partition,"
        f" dropped {len(retired)}"
    )
