"""The archive by time partition, through psycopg.

On the partitioned tables (jobs/partitions/) the archive takes whole partitions: a partition
of jobs past the cutoff whose every job is DELIVERED or DEAD is detached (from then on nobody
can change it or add to it), copied to Parquet and dropped; a partition of attempts, likewise,
once every partition of jobs it could hold attempts of is archived. The manifest
(ARCHIVE_PARTITION) records each detached partition until it is dropped, so a crashed run's
partition is finished by the next run, from the step where it stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import psycopg
from psycopg import sql

from spark_etl.batch_store import DONE
from spark_etl.store import Connection
from spark_etl.tables import ARCHIVE_PARTITION

DETACHED = "detached"  # then WRITTEN, PUBLISHED, DONE, as a batch
LOCK_TIMEOUT = "1s"  # the longest a detach may make the broker's writers wait for it
LOCK_TRIES = 3
# A job's attempts are stamped by the clock of the dispatcher that made them, its creation by the
# API's: jobs.models.CLOCK_ALLOWANCE, how far apart they may be (the package runs without Django;
# tests/spark/test_tables.py keeps the two equal).
CLOCK_ALLOWANCE = timedelta(days=1)


@dataclass
class Partition:
    name: str
    parent: str
    start: datetime | None  # None: from MINVALUE (the migration's "initial" partition)
    end: datetime
    state: str = DETACHED
    rows: int = 0  # counted when detached: it cannot change afterwards


def is_partitioned(conn: Connection, table: str) -> bool:
    row = conn.execute(
        "SELECT relkind FROM pg_class WHERE oid = to_regclass(%s)", [table]
    ).fetchone()
    return bool(row and row[0] == "p")


# FOR VALUES FROM ('2026-11-28 00:00:00+00') TO ('2026-11-29 00:00:00+00'), or FROM (MINVALUE)
_RANGE_BOUND = r"FROM \('?([^')]*)'?\) TO \('?([^')]*)'?\)"


def ranged_partitions(conn: Connection, table: str) -> list[Partition]:
    """The partitions of `table` with a time range, oldest first (not its DEFAULT partition)."""
    rows = conn.execute(
        """
        SELECT name, bound[1], bound[2] FROM (
            SELECT child.relname AS name,
                regexp_match(pg_get_expr(child.relpartbound, child.oid), %s) AS bound
            FROM pg_inherits JOIN pg_class child ON child.oid = pg_inherits.inhrelid
            WHERE pg_inherits.inhparent = to_regclass(%s)
        ) ranges WHERE bound IS NOT NULL
        """,
        [_RANGE_BOUND, table],
    ).fetchall()
    found = [
        Partition(name, table, None if low == "MINVALUE" else _moment(low), _moment(high))
        for name, low, high in rows
    ]
    return sorted(found, key=lambda partition: partition.end)


def _moment(literal: str) -> datetime:
    return datetime.fromisoformat(literal).astimezone(UTC)


def unfinished_partitions(conn: Connection) -> list[Partition]:
    rows = conn.execute(
        f"SELECT name, parent, range_start, range_end, state, rows FROM {ARCHIVE_PARTITION}"  # noqa: S608
        " WHERE state <> %s ORDER BY range_end, name",
        [DONE],
    ).fetchall()
    return [Partition(*row) for row in rows]


def detach(conn: Connection, partition: Partition, unfinished_jobs: bool) -> bool:
    """Detach `partition` from its parent and record it in the manifest, in one transaction;
    with `unfinished_jobs`, only if no job in it is unfinished, checked under the lock that keeps
    everyone out of it. False when it holds unfinished jobs or the lock was not granted (within
    LOCK_TIMEOUT, LOCK_TRIES times): a later run tries again."""
    for _ in range(LOCK_TRIES):
        try:
            detached = _detach(conn, partition, unfinished_jobs)
        except psycopg.errors.LockNotAvailable:
            continue
        if detached:  # counted once out of everyone's way: nobody can change it any more
            counted = conn.execute(
                sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(partition.name))
            ).fetchone()
            partition.rows = int(counted[0]) if counted else 0
            conn.execute(
                f"UPDATE {ARCHIVE_PARTITION} SET rows = %s WHERE name = %s",  # noqa: S608
                [partition.rows, partition.name],
            )
        return detached
    return False


def _detach(conn: Connection, partition: Partition, unfinished_jobs: bool) -> bool:
    """The locked part, kept short: the check reads the index of queued and in-flight jobs
    (a partition of finished jobs has no entry in it), not the partition."""
    name, parent = sql.Identifier(partition.name), sql.Identifier(partition.parent)
    with conn.transaction():
        conn.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(name))
        if unfinished_jobs:
            unfinished = conn.execute(
                sql.SQL(
                    "SELECT EXISTS (SELECT 1 FROM {} WHERE status IN ('QUEUED', 'INFLIGHT'))"
                ).format(name)
            ).fetchone()
            if unfinished and unfinished[0]:
                return False
        conn.execute(sql.SQL("ALTER TABLE {} DETACH PARTITION {}").format(parent, name))
        conn.execute(
            f"""INSERT INTO {ARCHIVE_PARTITION} (name, parent, range_start, range_end, state, rows)
            VALUES (%s, %s, %s, %s, %s, 0)
            ON CONFLICT (name) DO UPDATE SET parent = EXCLUDED.parent,
                range_start = EXCLUDED.range_start, range_end = EXCLUDED.range_end,
                state = EXCLUDED.state, rows = 0, updated_at = now()""",  # noqa: S608
            [partition.name, partition.parent, partition.start, partition.end, DETACHED],
        )
    partition.state = DETACHED
    return True


def id_bounds(conn: Connection, relation: str, column: str) -> tuple[int, int] | None:
    row = conn.execute(
        sql.SQL("SELECT min({column}), max({column}) FROM {relation}").format(
            column=sql.Identifier(column), relation=sql.Identifier(relation)
        )
    ).fetchone()
    return (row[0], row[1]) if row and row[0] is not None else None


def attempts_since(conn: Connection, relation: str) -> str:
    """When the attempts of the jobs in `relation` can have started, at the earliest, as an SQL
    literal: their earliest creation, less CLOCK_ALLOWANCE (a literal, not a parameter, lets
    PostgreSQL skip the partitions before it when it plans)."""
    row = conn.execute(
        sql.SQL("SELECT min(created_at) FROM {}").format(sql.Identifier(relation))
    ).fetchone()
    oldest = row[0] if row and row[0] is not None else datetime.now(UTC)
    return f"'{(oldest - CLOCK_ALLOWANCE).astimezone(UTC).isoformat()}'::timestamptz"


def count_rows(conn: Connection, query: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM ({query}) counted").fetchone()  # noqa: S608
    return int(row[0]) if row else 0


def set_partition_state(conn: Connection, partition: Partition, state: str) -> None:
    conn.execute(
        f"UPDATE {ARCHIVE_PARTITION} SET state = %s, updated_at = now() WHERE name = %s",  # noqa: S608
        [state, partition.name],
    )
    partition.state = state


def drop_detached(conn: Connection, partition: Partition, attempts_default: str | None) -> None:
    """Drop the archived partition, and mark it done in the same transaction. For a partition of
    jobs, `attempts_default` names the DEFAULT partition of attempts, where attempts of its jobs
    made while no partition covered their time are deleted with it (they were archived with it)."""
    name = sql.Identifier(partition.name)
    with conn.transaction():
        if _exists(conn, partition.name):
            if attempts_default and _exists(conn, attempts_default):
                conn.execute(
                    sql.SQL("DELETE FROM {} WHERE job_id IN (SELECT id FROM {})").format(
                        sql.Identifier(attempts_default), name
                    )
                )
            conn.execute(sql.SQL("DROP TABLE {}").format(name))
        set_partition_state(conn, partition, DONE)


def _exists(conn: Connection, relation: str) -> bool:
    row = conn.execute("SELECT to_regclass(%s) IS NOT NULL", [relation]).fetchone()
    return bool(row and row[0])
