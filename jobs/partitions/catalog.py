"""The partitioned tables, their partitions and spans, and the DDL's lock discipline: what the
partitions' creation and retention (and the migration that partitions in place) share."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.db import OperationalError, connection
from django.db.backends.utils import CursorWrapper

from broker.conf import broker_settings

logger = logging.getLogger("jobs.partitions")

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
AHEAD = timedelta(days=2)  # partitions exist at least this far past now
# The longest a DDL statement may make writers wait for it. Longer than PostgreSQL's
# deadlock_timeout (1 s by default): only a request still waiting then makes an autovacuum that
# holds the lock step aside, and a new partition locks broker_message, which its foreign key
# points to and which autovacuum often works on (a request that gave up at 1 s never got it).
LOCK_TIMEOUT = "2s"
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

# The names of the indexes of jobs and attempts, and of their partitions, that are invalid, and
# of the partitions' indexes that no index of their parent table holds (an index build cut short,
# or one made `ON ONLY` the parent: it stays invalid until every partition's is attached). After
# migrations and partition maintenance there is none, which the tests, bench/scale.py's upgrade
# check and the benches' builds (bench/secondary_indexes.py) assert.
UNATTACHED_INDEXES_SQL = f"""
SELECT index.relname FROM pg_inherits partition
JOIN pg_index ON pg_index.indrelid = partition.inhrelid
JOIN pg_class index ON index.oid = pg_index.indexrelid
WHERE partition.inhparent IN ('{JOBS.name}'::regclass, '{ATTEMPTS.name}'::regclass)
    AND (NOT pg_index.indisvalid
         OR NOT EXISTS (SELECT FROM pg_inherits parent WHERE parent.inhrelid = index.oid))
UNION ALL
SELECT index.relname FROM pg_index
JOIN pg_class index ON index.oid = pg_index.indexrelid
WHERE pg_index.indrelid IN ('{JOBS.name}'::regclass, '{ATTEMPTS.name}'::regclass)
    AND NOT pg_index.indisvalid
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


def lock_timeout(cursor: CursorWrapper) -> None:
    cursor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")


def with_lock_retries(ddl: Callable[[], None]) -> bool:
    """Run `ddl` (a callable making one transaction) up to LOCK_TRIES times while its lock times
    out; False if it never got it (the next run tries again)."""
    for _ in range(LOCK_TRIES):
        try:
            ddl()
            return True
        except OperationalError as error:
            if getattr(error.__cause__, "sqlstate", None) != "55P03":  # lock_not_available
                raise
            logger.warning(
                "partitions: lock not granted in %s, trying again; the oldest transactions"
                " holding locks on the queue's tables: %s",
                LOCK_TIMEOUT,
                _lock_holders() or "none left",
            )
    return False


def _lock_holders() -> str:
    """Who kept the DDL waiting, for the operator (and a failing test's log): the sessions
    holding locks on tables (the queue's, or those its foreign keys point to), longest
    transaction first, with the tables they hold."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT activity.pid, application_name, state, now() - xact_start, left(query, 120),
                   string_agg(DISTINCT lock.relation::regclass::text, ', ')
            FROM pg_stat_activity activity
            JOIN pg_locks lock ON lock.pid = activity.pid AND lock.granted
            JOIN pg_class class ON class.oid = lock.relation AND class.relkind IN ('r', 'p')
            WHERE activity.pid <> pg_backend_pid() AND datname = current_database()
            GROUP BY 1, 2, 3, 4, 5, xact_start
            ORDER BY xact_start NULLS LAST
            LIMIT 5
            """
        )
        holders = cursor.fetchall()
    return "; ".join(
        f"pid {pid} ({application or 'no name'}, {state}, for {age}, on {tables}): {query}"
        for pid, application, state, age, query, tables in holders
    )
