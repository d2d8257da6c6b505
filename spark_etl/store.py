"""The driver's own SQL, through psycopg: bounds of the JDBC reads, the report watermark, the
archive's manifest and its deletions.

The pipeline keeps its bookkeeping in two tables of its own, created here on first use (the
package runs without Django, so not through a migration):
- the watermark (`tables.WATERMARK`): how far the report has read (a nightly run reads only what
  is new);
- the archive manifest (`tables.ARCHIVE_BATCH`): one row per archive batch, which makes a re-run
  after a crash continue where the crashed run stopped.

Table names, and what deleting archived rows does to the rows referring to them, come from
`tables.py`.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from spark_etl.config import EtlConfig
from spark_etl.tables import (
    ARCHIVE_BATCH,
    ARCHIVE_DELETES,
    ARCHIVE_PARTITION,
    ARCHIVE_REGISTRATION,
    ATTEMPT,
    JOB,
    MESSAGE,
    WATERMARK,
    OnDelete,
)

TERMINAL = ("DELIVERED", "DEAD")

# Archive batch states, in the order a batch goes through them.
PLANNED, WRITTEN, PUBLISHED, DELETED, DONE = "planned", "written", "published", "deleted", "done"
ABANDONED = "abandoned"  # its rows changed before they were published; re-planned later

# Any constant of our own: two archive runs must never work on the same manifest at once.
ARCHIVE_LOCK = 0x5E7C_A4C1

Connection = psycopg.Connection[tuple[Any, ...]]

_SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {WATERMARK} (
    name text PRIMARY KEY,
    value timestamptz NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE IF NOT EXISTS {ARCHIVE_BATCH} (
    id bigserial PRIMARY KEY,
    state text NOT NULL,
    planned_at timestamptz NOT NULL DEFAULT now(),
    updated_at timestamptz NOT NULL DEFAULT now(),
    cutoff timestamptz NOT NULL,
    message_ids bigint[] NOT NULL,
    payload_files text[] NOT NULL,
    messages integer NOT NULL,
    jobs integer NOT NULL,
    attempts integer NOT NULL,
    kept_message_ids bigint[] NOT NULL DEFAULT '{{}}'
);
CREATE INDEX IF NOT EXISTS {ARCHIVE_BATCH}_open_idx
    ON {ARCHIVE_BATCH} (id) WHERE state NOT IN ('done', 'abandoned');
CREATE TABLE IF NOT EXISTS {ARCHIVE_PARTITION} (
    name text PRIMARY KEY,
    parent text NOT NULL,
    range_start timestamptz,
    range_end timestamptz NOT NULL,
    state text NOT NULL,
    rows bigint NOT NULL,
    updated_at timestamptz NOT NULL DEFAULT now()
);
"""


@contextmanager
def connect(config: EtlConfig) -> Iterator[Connection]:
    with psycopg.connect(**config.database.psycopg_kwargs(), autocommit=True) as conn:
        yield conn


def ensure_tables(conn: Connection) -> None:
    # Two runs creating the tables at once would race on the catalog; the lock serialises them.
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(%s)", [ARCHIVE_LOCK + 1])
        conn.execute(_SCHEMA)


# --- the report ---------------------------------------------------------------------------------


def watermark(conn: Connection, name: str) -> datetime | None:
    row = conn.execute(
        f"SELECT value FROM {WATERMARK} WHERE name = %s",  # noqa: S608 (our table name)
        [name],
    ).fetchone()
    return row[0] if row else None


def set_watermark(conn: Connection, name: str, value: datetime) -> None:
    conn.execute(
        f"""INSERT INTO {WATERMARK} (name, value) VALUES (%s, %s)
        ON CONFLICT (name) DO UPDATE SET value = EXCLUDED.value, updated_at = now()""",  # noqa: S608
        [name, value],
    )


def message_bounds(
    conn: Connection, since: datetime | None, until: datetime
) -> tuple[int, int] | None:
    """The lowest and highest id of the messages received in [since, until): the slices of the
    partitioned reads. None when there is none."""
    row = conn.execute(
        f"SELECT min(id), max(id) FROM {MESSAGE}"  # noqa: S608 (our table name)
        " WHERE received_at < %(until)s AND (%(since)s::timestamptz IS NULL"
        " OR received_at >= %(since)s)",
        {"since": since, "until": until},
    ).fetchone()
    return (row[0], row[1]) if row and row[0] is not None else None


def job_bounds(conn: Connection, messages: tuple[int, int]) -> tuple[int, int] | None:
    row = conn.execute(
        f"SELECT min(id), max(id) FROM {JOB} WHERE message_id BETWEEN %s AND %s",  # noqa: S608
        list(messages),
    ).fetchone()
    return (row[0], row[1]) if row and row[0] is not None else None


def replace_report(
    conn: Connection,
    table: str,
    staging: str,
    since: datetime | None,
    until: datetime,
    columns: list[str],
) -> int:
    """Swap the report rows of [since, until) for the staged ones, and move the watermark, in one
    transaction: the dashboard sees the old figures or the new ones, never a mix."""
    names = sql.SQL(", ").join(sql.Identifier(column) for column in columns)
    with conn.transaction():
        conn.execute(
            sql.SQL(
                "DELETE FROM {} WHERE period_start < %(until)s"
                " AND (%(since)s::timestamptz IS NULL OR period_start >= %(since)s)"
            ).format(sql.Identifier(table)),
            {"since": since, "until": until},
        )
        inserted = conn.execute(
            sql.SQL("INSERT INTO {} ({}) SELECT {} FROM {}").format(
                sql.Identifier(table), names, names, sql.Identifier(staging)
            )
        ).rowcount
        set_watermark(conn, "report", until)
    return inserted


# --- the archive --------------------------------------------------------------------------------


@dataclass
class Batch:
    id: int
    state: str
    planned_at: datetime
    message_ids: list[int]
    payload_files: list[str]  # of the batch's offloaded messages
    messages: int
    jobs: int
    attempts: int
    kept_message_ids: list[int] = field(default_factory=list)

    @property
    def key(self) -> str:
        """Names the batch's Parquet directories; from the manifest, so a re-run finds them."""
        return f"{self.id:09d}"

    @property
    def bounds(self) -> tuple[int, int]:
        return min(self.message_ids), max(self.message_ids)


_BATCH_COLUMNS = (
    "id, state, planned_at, message_ids, payload_files, messages, jobs, attempts, kept_message_ids"
)


def register_archive(conn: Connection, cutoff: datetime) -> None:
    """Tell the broker's housekeeping that this database is archived: from now on it leaves the
    old time partitions to the archive instead of dropping them (jobs/partitions.py)."""
    set_watermark(conn, ARCHIVE_REGISTRATION, cutoff)


def try_archive_lock(conn: Connection) -> bool:
    """Held by this connection until it closes (a crashed run's lock goes with its connection)."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", [ARCHIVE_LOCK]).fetchone()
    return bool(row and row[0])


def unfinished_batches(conn: Connection) -> list[Batch]:
    rows = conn.execute(
        f"SELECT {_BATCH_COLUMNS} FROM {ARCHIVE_BATCH}"  # noqa: S608
        " WHERE state NOT IN ('done', 'abandoned') ORDER BY id"
    ).fetchall()
    return [Batch(*row) for row in rows]


def _jobs_done_filter(partitioned: bool) -> str:
    """The test that message `m` has no unfinished job. On the partitioned tables, also none in
    a partition other than the DEFAULT one: the message waits until its jobs have left with their
    partitions, and only the DEFAULT partition's jobs (rows no partition covered) are archived
    and deleted row by row."""
    left_behind = (
        f" OR j.tableoid IS DISTINCT FROM to_regclass('{JOB}_default')" if partitioned else ""
    )
    return (
        f"NOT EXISTS (SELECT 1 FROM {JOB} j WHERE j.message_id = m.id"  # noqa: S608
        f" AND (j.status NOT IN {TERMINAL!r}{left_behind}))"
    )


def eligible_messages(
    conn: Connection,
    cutoff: datetime,
    since: datetime | None,
    after: int,
    limit: int,
    partitioned: bool = False,
) -> list[tuple[int, str, int]]:
    """(id, payload_file, payload_size) of the next `limit` messages to archive, lowest id first:
    received in [since, cutoff), not waiting to be released, every job DELIVERED or DEAD (and,
    `partitioned`, in no partition but the DEFAULT one)."""
    query = (
        f"SELECT m.id, m.payload_file, m.payload_size FROM {MESSAGE} m"  # noqa: S608
        " WHERE m.id > %(after)s AND m.received_at < %(cutoff)s"
        " AND (%(since)s::timestamptz IS NULL OR m.received_at >= %(since)s)"
        f" AND m.status <> 'SCHEDULED' AND {_jobs_done_filter(partitioned)}"
        " ORDER BY m.id LIMIT %(limit)s"
    )
    params = {"after": after, "cutoff": cutoff, "since": since, "limit": limit}
    return [(row[0], row[1], row[2]) for row in conn.execute(query, params)]


def plan_batch(
    conn: Connection, cutoff: datetime, message_ids: list[int], payload_files: list[str]
) -> Batch:
    """Record a new batch with the counts its Parquet must have."""
    counts = conn.execute(
        f"""SELECT
            (SELECT count(*) FROM {JOB} WHERE message_id = ANY(%(ids)s)),
            (SELECT count(*) FROM {ATTEMPT} a JOIN {JOB} j ON j.id = a.job_id
             WHERE j.message_id = ANY(%(ids)s))""",  # noqa: S608
        {"ids": message_ids},
    ).fetchone()
    assert counts is not None  # noqa: S101 (an aggregate always returns a row)
    # Planned "now" on the broker's clock, not the database server's: jobs' status_changed_at,
    # which `changed_since_planned` compares with it, is written on the broker's clock.
    row = conn.execute(
        f"""INSERT INTO {ARCHIVE_BATCH}
            (state, planned_at, cutoff, message_ids, payload_files, messages, jobs, attempts)
        VALUES (%s, %s, %s, %s, %s, %s, %s, %s) RETURNING {_BATCH_COLUMNS}""",  # noqa: S608
        [
            PLANNED,
            datetime.now(UTC),
            cutoff,
            message_ids,
            payload_files,
            len(message_ids),
            counts[0],
            counts[1],
        ],
    ).fetchone()
    assert row is not None  # noqa: S101
    return Batch(*row)


def set_state(conn: Connection, batch: Batch, state: str) -> None:
    conn.execute(
        f"UPDATE {ARCHIVE_BATCH} SET state = %s, updated_at = now() WHERE id = %s",  # noqa: S608
        [state, batch.id],
    )
    batch.state = state


def changed_since_planned(conn: Connection, batch: Batch) -> int:
    """How many of the batch's messages may no longer be archived as read (a job requeued or
    replayed since the batch was planned)."""
    row = conn.execute(
        f"""SELECT count(DISTINCT message_id) FROM {JOB}
        WHERE message_id = ANY(%(ids)s)
          AND (status NOT IN {TERMINAL!r} OR status_changed_at > %(planned)s)""",  # noqa: S608
        {"ids": batch.message_ids, "planned": batch.planned_at},
    ).fetchone()
    return int(row[0]) if row else 0


def delete_archived(conn: Connection, batch: Batch, chunk: list[int]) -> tuple[int, list[int]]:
    """Delete the messages of `chunk` with their jobs and attempts, in one transaction; return
    how many went and the ids kept because a job changed after the batch was planned.

    The messages are locked first, then their jobs: the order a replay takes them, so the two
    never deadlock. A requeue or replay racing with this waits, and the check below, a statement
    of its own, sees what it committed: a message whose job changed after the batch was planned
    is kept (its Parquet copy is older than it). Messages no longer there (deleted by a crashed
    run of this batch) are skipped.
    """
    params: dict[str, Any] = {"ids": chunk, "planned": batch.planned_at}
    with conn.transaction():
        conn.execute(
            f"SELECT id FROM {MESSAGE} WHERE id = ANY(%(ids)s) ORDER BY id FOR UPDATE",  # noqa: S608
            params,
        )
        conn.execute(
            f"SELECT id FROM {JOB} WHERE message_id = ANY(%(ids)s) ORDER BY id FOR UPDATE",  # noqa: S608
            params,
        )
        rows = conn.execute(
            f"""SELECT m.id, NOT EXISTS (
                SELECT 1 FROM {JOB} j WHERE j.message_id = m.id
                AND (j.status NOT IN {TERMINAL!r} OR j.status_changed_at > %(planned)s))
            FROM {MESSAGE} m WHERE m.id = ANY(%(ids)s) ORDER BY m.id""",  # noqa: S608
            params,
        ).fetchall()
        deletable = [row[0] for row in rows if row[1]]
        kept = [row[0] for row in rows if not row[1]]
        if deletable:
            delete_with_references(conn, MESSAGE, deletable)
        if kept:
            conn.execute(
                f"""UPDATE {ARCHIVE_BATCH} SET kept_message_ids = ARRAY(
                    SELECT DISTINCT unnest(kept_message_ids || %s::bigint[]) ORDER BY 1)
                WHERE id = %s""",  # noqa: S608
                [kept, batch.id],
            )
            batch.kept_message_ids = sorted({*batch.kept_message_ids, *kept})
    return len(deletable), kept


def delete_with_references(conn: Connection, table: str, ids: list[int]) -> None:
    """Delete the rows of `table` with these ids, having first done to the rows that refer to
    them what the models' on_delete would (tables.ARCHIVE_DELETES): cascade, or set to NULL.

    The broker's foreign keys have no ON DELETE in PostgreSQL, so this is the archive's copy of
    what the ORM does; the referring rows go first, then the rows themselves. Referring rows are
    found by their id lists, not by a subquery: on the partitioned tables a list is an index
    lookup in each partition, and an empty one (jobs already dropped with their partition) costs
    nothing, where a join could scan every partition.
    """
    for reference in ARCHIVE_DELETES[table]:
        column = sql.Identifier(reference.column)
        referring = sql.SQL("{} = ANY(%s)").format(column)
        if reference.on_delete is OnDelete.CASCADE and ARCHIVE_DELETES[reference.table]:
            rows = conn.execute(
                sql.SQL("SELECT id FROM {} WHERE {}").format(
                    sql.Identifier(reference.table), referring
                ),
                [ids],
            )
            if children := [row[0] for row in rows]:
                delete_with_references(conn, reference.table, children)
        elif reference.on_delete is OnDelete.CASCADE:  # nothing refers to these: delete at once
            conn.execute(
                sql.SQL("DELETE FROM {} WHERE {}").format(
                    sql.Identifier(reference.table), referring
                ),
                [ids],
            )
        else:
            conn.execute(
                sql.SQL("UPDATE {} SET {} = NULL WHERE {}").format(
                    sql.Identifier(reference.table), column, referring
                ),
                [ids],
            )
    conn.execute(sql.SQL("DELETE FROM {} WHERE id = ANY(%s)").format(sql.Identifier(table)), [ids])


# --- the archive by time partition -------------------------------------------------------------
#
# On the partitioned tables (jobs/partitions.py) the archive takes whole partitions: a partition
# of jobs past the cutoff whose every job is DELIVERED or DEAD is detached (from then on nobody
# can change it or add to it), copied to Parquet and dropped; a partition of attempts, likewise,
# once every partition of jobs it could hold attempts of is archived. The manifest
# (ARCHIVE_PARTITION) records each detached partition until it is dropped, so a crashed run's
# partition is finished by the next run, from the step where it stopped.

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
