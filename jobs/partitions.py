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
moved into their partition when it is created. The migration that partitions a populated
database (jobs/migrations/0014_time_partitions.py) keeps the existing rows where they are, as one
"initial" partition, so it costs index builds and a validation scan, not a copy.

Retention (`retire_partitions`): a partition whose whole range is older than
BROKER_RETENTION_DAYS is dropped once every job in it is DELIVERED. Its stragglers, jobs still
QUEUED or DEAD, are first carried forward into the current partition in short batches (same ID,
same creation time, visible throughout), so that they never hold a drop back for long; an
INFLIGHT job is left to finish and carried on a later run. Attempt partitions are dropped by age
alone. Dropping a partition takes a brief exclusive lock of the parent table; it is asked for
with a short lock timeout and tried again on the next run rather than queue writers behind it.

Where `spark_etl archive` runs (`archive_owns_retention`), the archive drops old partitions
instead, after copying them to Parquet, and retention here only carries queued jobs forward.

The SQL below is put together from the names of these two tables, their partitions and columns,
never from input.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import OperationalError, connection, transaction
from django.db.backends.utils import CursorWrapper
from django.utils import timezone

from broker.conf import broker_settings
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from spark_etl.tables import ARCHIVE_REGISTRATION, WATERMARK

logger = logging.getLogger(__name__)

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
AHEAD = timedelta(days=2)  # partitions exist at least this far past now
CARRY_BATCH = 5000  # stragglers carried forward per transaction: well under a second each
LOCK_TIMEOUT = "1s"  # the longest a DDL statement may make writers wait for it
LOCK_TRIES = 3


@dataclass(frozen=True)
class Table:
    name: str
    key: str  # the partition key column

    @property
    def default(self) -> str:
        return f"{self.name}_default"

    def partition_name(self, start: datetime) -> str:
        return f"{self.name}_p{start:%Y%m%d}"


JOBS = Table("jobs_job", "partition_at")
ATTEMPTS = Table("jobs_deliveryattempt", "started_at")
TABLES = (JOBS, ATTEMPTS)

# The names of the partitions' indexes that are invalid or that no index of their parent table
# holds (an index build cut short): after migrations and partition maintenance there is none,
# which the tests and bench/scale.py's upgrade check assert.
UNATTACHED_INDEXES_SQL = f"""
SELECT index.relname FROM pg_inherits partition
JOIN pg_index ON pg_index.indrelid = partition.inhrelid
JOIN pg_class index ON index.oid = pg_index.indexrelid
WHERE partition.inhparent IN ('{JOBS.name}'::regclass, '{ATTEMPTS.name}'::regclass)
    AND (NOT pg_index.indisvalid
         OR NOT EXISTS (SELECT FROM pg_inherits parent WHERE parent.inhrelid = index.oid))
"""  # noqa: S608 (the tables' own names)


@dataclass(frozen=True)
class Partition:
    name: str
    start: datetime | None  # None: MINVALUE (the initial partition)
    end: datetime


def is_partitioned(table: Table) -> bool:
    with connection.cursor() as cursor:
        cursor.execute("SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table.name])
        row = cursor.fetchone()
    return row is not None and row[0] == "p"


def span() -> timedelta:
    return timedelta(days=broker_settings.BROKER_PARTITION_DAYS)


def span_start(moment: datetime) -> datetime:
    """The start of the span `moment` falls in: spans are counted from the UTC epoch."""
    spans = (moment - EPOCH) // span()
    return EPOCH + spans * span()


def partitions(table: Table) -> list[Partition]:
    """The table's partitions with a range, oldest first (the DEFAULT partition is not listed)."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT child.relname, pg_get_expr(child.relpartbound, child.oid)
            FROM pg_inherits JOIN pg_class child ON child.oid = pg_inherits.inhrelid
            WHERE pg_inherits.inhparent = to_regclass(%s)
            """,
            [table.name],
        )
        rows = cursor.fetchall()
    found = [_partition(name, bound) for name, bound in rows if bound != "DEFAULT"]
    return sorted(found, key=lambda p: p.end)


def _partition(name: str, bound: str) -> Partition:
    # FOR VALUES FROM ('2026-11-28 00:00:00+00') TO ('2026-11-29 00:00:00+00'), or FROM (MINVALUE)
    low, high = (part.split(")")[0] for part in bound.split("(")[1:3])
    return Partition(name, None if low == "MINVALUE" else _moment(low), _moment(high))


def _moment(literal: str) -> datetime:
    return datetime.fromisoformat(literal.strip("'")).astimezone(UTC)


def sql_timestamp(moment: datetime) -> str:
    """A timestamp as SQL text: DDL takes no bound parameters."""
    return f"'{moment.astimezone(UTC).isoformat()}'::timestamptz"


# Housekeeping --------------------------------------------------------------------------------


def maintain_partitions() -> str:
    """The hourly housekeeping task: partitions ahead, then retention (docs/housekeeping.md)."""
    if not is_partitioned(JOBS):
        return "no partitioned tables"
    now = timezone.now()
    created = ensure_partitions(now)
    retired = retire_partitions(now)
    return f"created {len(created)} partitions, dropped {len(retired)}"


def ensure_partitions(now: datetime, since: datetime | None = None) -> list[str]:
    """Create partitions for the time from `since` (default: now) to AHEAD past now that no
    partition covers yet, on both tables; return their names. Each ends at the next span
    boundary or where an existing partition starts, so that a changed BROKER_PARTITION_DAYS
    leaves no gap. Rows the DEFAULT partition holds for the new ranges are moved into them."""
    created = []
    for table in TABLES:
        existing = partitions(table)
        moment = span_start(since or now)
        while moment < now + AHEAD:
            covering = [p for p in existing if _covers(p, moment)]
            if covering:
                moment = covering[0].end
                continue
            later_starts = [p.start for p in existing if p.start and p.start > moment]
            end = min([span_start(moment) + span(), *later_starts])
            _with_lock_retries(functools.partial(_create, table, moment, end))
            created.append(table.partition_name(moment))
            moment = end
    return created


def _covers(partition: Partition, moment: datetime) -> bool:
    return (partition.start is None or partition.start <= moment) and moment < partition.end


def _create(table: Table, start: datetime, end: datetime) -> None:
    """A new partition for [start, end): made as a table of its own with a CHECK constraint that
    proves its rows fit, filled from the DEFAULT partition if that holds rows of the range, then
    attached, which locks the parent only as much as a vacuum does."""
    name = table.partition_name(start)
    with transaction.atomic(), connection.cursor() as cursor:
        _lock_timeout(cursor)
        new_partition_table(cursor, table, name)
        low, high = sql_timestamp(start), sql_timestamp(end)
        cursor.execute(
            f'ALTER TABLE "{name}" ADD CONSTRAINT "{name}_range"'
            f' CHECK ("{table.key}" >= {low} AND "{table.key}" < {high})'
        )
        if _has_default(cursor, table):
            _move_from_default(cursor, table, name, start, end)
        cursor.execute(
            f'ALTER TABLE "{table.name}" ATTACH PARTITION "{name}"'
            f" FOR VALUES FROM ({sql_timestamp(start)}) TO ({sql_timestamp(end)})"
        )
        cursor.execute(f'ALTER TABLE "{name}" DROP CONSTRAINT "{name}_range"')


def _move_from_default(
    cursor: CursorWrapper, table: Table, name: str, start: datetime, end: datetime
) -> None:
    columns = ", ".join(f'"{column}"' for column in _columns(cursor, table))
    moved = (
        f'WITH moved AS (DELETE FROM "{table.default}" WHERE "{table.key}" >= %s'  # noqa: S608
        f' AND "{table.key}" < %s RETURNING {columns})'
        f' INSERT INTO "{name}" ({columns}) SELECT {columns} FROM moved'
    )
    cursor.execute(moved, [start, end])
    if cursor.rowcount:
        logger.info(
            "partitions: moved %d rows from %s into %s", cursor.rowcount, table.default, name
        )


def new_partition_table(cursor: CursorWrapper, table: Table, name: str) -> None:
    """A table to attach as the partition `name`: the parent's columns, defaults, CHECK
    constraints and storage parameters, and its indexes named after the parent's (an operator
    reading a plan sees job_consumer_due_idx_p20261128, not a generated name)."""
    cursor.execute(
        f'CREATE TABLE "{name}" (LIKE "{table.name}" INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'
        f"{_storage(cursor, table)}"
    )
    suffix = name.removeprefix(table.name)
    for index, definition in plain_indexes(cursor, table.name):
        columns_and_predicate = definition.split(" USING ", 1)[1]
        cursor.execute(
            f'CREATE INDEX "{index[: 62 - len(suffix)]}{suffix}" ON "{name}"'
            f" USING {columns_and_predicate}"
        )


def plain_indexes(cursor: CursorWrapper, table_name: str) -> list[tuple[str, str]]:
    """The table's indexes that back no constraint, with their definitions."""
    cursor.execute(
        """
        SELECT index.relname, pg_get_indexdef(index.oid)
        FROM pg_index JOIN pg_class index ON index.oid = pg_index.indexrelid
        WHERE pg_index.indrelid = to_regclass(%s)
          AND NOT EXISTS (SELECT 1 FROM pg_constraint WHERE conindid = index.oid)
        """,
        [table_name],
    )
    return list(cursor.fetchall())


def _columns(cursor: CursorWrapper, table: Table) -> list[str]:
    cursor.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s)"
        " AND attnum > 0 AND NOT attisdropped ORDER BY attnum",
        [table.name],
    )
    return [row[0] for row in cursor.fetchall()]


def _has_default(cursor: CursorWrapper, table: Table) -> bool:
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [table.default])
    return bool(cursor.fetchone()[0])


def _storage(cursor: CursorWrapper, table: Table) -> str:
    """The WITH (...) of a new partition: the storage parameters (autovacuum tuning, fillfactor)
    of the newest existing one. A partitioned table cannot hold them itself; they are set on the
    first partitions by the migration and an operator's ALTER TABLE of the newest one carries on."""
    cursor.execute(
        """
        SELECT child.reloptions FROM pg_inherits JOIN pg_class child ON child.oid = inhrelid
        WHERE inhparent = to_regclass(%s) AND child.reloptions IS NOT NULL
        ORDER BY child.oid DESC LIMIT 1
        """,
        [table.name],
    )
    row = cursor.fetchone()
    return f" WITH ({', '.join(row[0])})" if row else ""


def _lock_timeout(cursor: CursorWrapper) -> None:
    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


def _with_lock_retries(ddl: Callable[[], None]) -> bool:
    """Run `ddl` (a callable making one transaction) up to LOCK_TRIES times while its lock times
    out; False if it never got it (the next run tries again)."""
    for _ in range(LOCK_TRIES):
        try:
            ddl()
            return True
        except OperationalError as error:
            if getattr(error.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            logger.warning("partitions: lock not granted in %s, trying again", LOCK_TIMEOUT)
    return False


# Retention -----------------------------------------------------------------------------------


def retire_partitions(now: datetime, days: int | None = None) -> list[str]:
    """Drop the partitions whose whole range is older than `days` (BROKER_RETENTION_DAYS; 0
    keeps everything): attempt partitions by age alone, job partitions once their stragglers
    are carried forward and every job left is DELIVERED. Rows of the DEFAULT partitions older
    than that go the same way, a batch at a time. Return the names of the partitions dropped."""
    days = broker_settings.BROKER_RETENTION_DAYS if days is None else days
    if not is_partitioned(JOBS) or not days:
        return []
    cutoff = now - timedelta(days=days)
    if archive_owns_retention():
        # The archive takes partitions whose jobs are all finished: only queued jobs are carried
        # out of its way (dead ones are archived, as the DLQ's history), and nothing is dropped.
        for partition in partitions(JOBS):
            if partition.end <= cutoff:
                carry_forward(partition.name, partition.end, now, statuses=(QUEUED,))
        return []
    dropped: list[str] = []
    for partition in partitions(JOBS):
        if partition.end <= cutoff:
            carry_forward(partition.name, partition.end, now)
            _with_lock_retries(functools.partial(_drop_if_done, JOBS, partition, dropped))
    for partition in partitions(ATTEMPTS):
        if partition.end <= cutoff:
            _with_lock_retries(functools.partial(_drop_if_done, ATTEMPTS, partition, dropped))
    carry_forward(JOBS.default, cutoff, now)
    _delete_old_defaults(cutoff)
    return dropped


def archive_owns_retention() -> bool:
    """Whether `spark_etl archive` runs on this database (each run registers itself in its
    watermark table; `install_schedules --no-spark` forgets it). Then the archive, not this
    module, drops old partitions: after copying them to Parquet."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [WATERMARK])
        if not cursor.fetchone()[0]:
            return False
        cursor.execute(
            f"SELECT EXISTS (SELECT 1 FROM {WATERMARK} WHERE name = %s)",  # noqa: S608
            [ARCHIVE_REGISTRATION],
        )
        return bool(cursor.fetchone()[0])


def forget_archive() -> bool:
    """Give retention back to housekeeping (the archive no longer runs); False if it had it."""
    if not archive_owns_retention():
        return False
    with connection.cursor() as cursor:
        cursor.execute(
            f"DELETE FROM {WATERMARK} WHERE name = %s",  # noqa: S608
            [ARCHIVE_REGISTRATION],
        )
    return True


def carry_forward(
    relation: str, before: datetime, now: datetime, statuses: tuple[str, ...] = (QUEUED, DEAD)
) -> int:
    """Move the jobs of the partition `relation` placed before `before` whose status is one of
    `statuses` to `now`'s partition, CARRY_BATCH jobs per transaction; rows another transaction
    holds are skipped and carried on a later run. Return how many were moved."""
    moved = 0
    while batch := _carry_batch(relation, before, now, statuses):
        moved += batch
    if moved:
        logger.info("partitions: carried %d unfinished jobs out of %s", moved, relation)
    return moved


def _carry_batch(relation: str, before: datetime, now: datetime, statuses: tuple[str, ...]) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE "{JOBS.name}" SET "{JOBS.key}" = %s
            WHERE id IN (
                SELECT id FROM "{relation}" WHERE status = ANY(%s) AND "{JOBS.key}" < %s
                LIMIT %s FOR UPDATE SKIP LOCKED
            ) AND "{JOBS.key}" < %s
            """,  # noqa: S608
            [now, list(statuses), before, CARRY_BATCH, before],
        )
        return int(cursor.rowcount)


def _delete_old_defaults(cutoff: datetime) -> None:
    """Delete what the DEFAULT partitions hold from before `cutoff` that retention would drop
    with a partition: delivered jobs with their attempts, and attempts. They take rows only
    while housekeeping is behind, so this stays small."""
    while _delete_old_default_batch(cutoff):
        pass


def _delete_old_default_batch(cutoff: datetime) -> int:
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            DELETE FROM "{JOBS.name}" WHERE id IN (
                SELECT id FROM "{JOBS.default}" WHERE "{JOBS.key}" < %s AND status = %s
                LIMIT %s FOR UPDATE SKIP LOCKED
            ) AND "{JOBS.key}" < %s RETURNING id
            """,  # noqa: S608
            [cutoff, DELIVERED, CARRY_BATCH, cutoff],
        )
        jobs = [row[0] for row in cursor.fetchall()]
        cursor.execute(f'DELETE FROM "{ATTEMPTS.name}" WHERE job_id = ANY(%s)', [jobs])  # noqa: S608
        cursor.execute(
            f"""
            DELETE FROM "{ATTEMPTS.default}" WHERE id IN (
                SELECT id FROM "{ATTEMPTS.default}" WHERE "{ATTEMPTS.key}" < %s LIMIT %s
            )
            """,  # noqa: S608
            [cutoff, CARRY_BATCH],
        )
        return len(jobs) + int(cursor.rowcount)


def _drop_if_done(table: Table, partition: Partition, dropped: list[str]) -> None:
    """Detach and drop the partition if no job in it is unfinished, checked under the lock that
    keeps anyone from changing it meanwhile (a replay could queue a delivered job again)."""
    with transaction.atomic(), connection.cursor() as cursor:
        _lock_timeout(cursor)
        cursor.execute(f'LOCK TABLE "{partition.name}" IN ACCESS EXCLUSIVE MODE')
        if table is JOBS:
            # Two probes of the partial indexes of unfinished and of dead jobs, not a read of a
            # partition of delivered jobs, while the partition is locked against everyone.
            cursor.execute(
                f"""SELECT EXISTS (SELECT 1 FROM "{partition.name}" WHERE status IN (%s, %s))
                OR EXISTS (SELECT 1 FROM "{partition.name}" WHERE status = %s)""",  # noqa: S608
                [QUEUED, INFLIGHT, DEAD],
            )
            if cursor.fetchone()[0]:
                logger.info("partitions: %s still holds unfinished jobs", partition.name)
                return
        # Deferred foreign key checks of rows written earlier in this transaction must run
        # before their table goes (only a caller's enclosing transaction has any).
        cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        cursor.execute(f'ALTER TABLE "{table.name}" DETACH PARTITION "{partition.name}"')
        cursor.execute(f'DROP TABLE "{partition.name}"')
    dropped.append(partition.name)
    logger.info("partitions: dropped %s", partition.name)
