"""New partitions: created ahead of time, each built as a table of its own and attached, with the
rows the DEFAULT partition holds for its range moved in."""

from __future__ import annotations

import functools
from datetime import datetime

from django.db import connection, transaction
from django.db.backends.utils import CursorWrapper

from jobs.partitions.catalog import (
    AHEAD,
    TABLES,
    Partition,
    Table,
    lock_timeout,
    logger,
    partitions,
    span,
    span_start,
    sql_timestamp,
    with_lock_retries,
)


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
            if with_lock_retries(functools.partial(_create, table, moment, end)):
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
        lock_timeout(cursor)
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
