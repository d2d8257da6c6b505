"""Retention: old partitions dropped once their jobs are finished, their stragglers carried
forward first; or, where `spark_etl archive` runs, left to the archive."""

from __future__ import annotations

import functools
from datetime import datetime, timedelta

from django.db import connection, transaction

from broker.conf import broker_settings
from jobs.partitions.catalog import (
    ATTEMPTS,
    JOBS,
    Partition,
    Table,
    is_partitioned,
    lock_timeout,
    logger,
    partitions,
    with_lock_retries,
)
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from spark_etl.tables import ARCHIVE_REGISTRATION, WATERMARK

CARRY_BATCH = 5000  # stragglers carried forward per transaction: well under a second each


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
            with_lock_retries(functools.partial(_drop_if_done, JOBS, partition, dropped))
    for partition in partitions(ATTEMPTS):
        if partition.end <= cutoff:
            with_lock_retries(functools.partial(_drop_if_done, ATTEMPTS, partition, dropped))
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


def place_default_jobs(now: datetime, days: int | None = None) -> int:
    """Move the jobs of the DEFAULT partition that are younger than the retention (`days`,
    BROKER_RETENTION_DAYS; 0 keeps everything, so all of them) into the oldest partition that
    starts after them, CARRY_BATCH jobs per transaction; return how many were moved.

    Rows older than the retention are left to `retire_partitions` (or the archive), which takes
    them row by row. Moving a job is an UPDATE of its `partition_at` to that partition's start
    (the same as a carry forward: same ID, creation time and everything else), so it retires with
    that partition, never before its time: no DDL over a DEFAULT partition full of rows
    (docs/scaling.md, "Partitions"). INFLIGHT jobs (their claim's outcome is
    recorded by their partition key) and rows another transaction holds wait for the next run;
    so do rows past every partition, which move into theirs when it is made."""
    if not is_partitioned(JOBS):
        return 0
    days = broker_settings.BROKER_RETENTION_DAYS if days is None else days
    starts = [p.start for p in partitions(JOBS) if p.start is not None]
    if not starts:
        return 0
    since = now - timedelta(days=days) if days else None
    moved = 0
    while batch := _place_batch(starts, since):
        moved += batch
    if moved:
        logger.info("partitions: placed %d jobs of %s into partitions", moved, JOBS.default)
    return moved


def _place_batch(starts: list[datetime], since: datetime | None) -> int:
    # Every row chosen is before the last partition's start and in no partition, so a partition
    # starts after it and the UPDATE moves it out of the DEFAULT one: the loop ends.
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            f"""
            UPDATE "{JOBS.name}" AS job SET "{JOBS.key}" = (
                SELECT min(start) FROM unnest(%(starts)s::timestamptz[]) AS start
                WHERE start > job."{JOBS.key}"
            )
            WHERE id IN (
                SELECT id FROM "{JOBS.default}" WHERE status <> %(inflight)s
                    AND "{JOBS.key}" < %(last)s
                    AND (%(since)s::timestamptz IS NULL OR "{JOBS.key}" >= %(since)s)
                LIMIT %(batch)s FOR UPDATE SKIP LOCKED
            ) AND tableoid = to_regclass(%(default)s) AND status <> %(inflight)s
                AND "{JOBS.key}" < %(last)s
            """,  # noqa: S608
            {
                "starts": starts,
                "last": max(starts),
                "since": since,
                "inflight": INFLIGHT,
                "batch": CARRY_BATCH,
                "default": JOBS.default,
            },
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
        lock_timeout(cursor)
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
