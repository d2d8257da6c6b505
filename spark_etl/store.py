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
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from spark_etl.config import EtlConfig
from spark_etl.tables import (
    ARCHIVE_BATCH,
    ARCHIVE_DELETES,
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


def _unfinished_jobs_filter(alias: str) -> str:
    return (
        f"NOT EXISTS (SELECT 1 FROM {JOB} j WHERE j.message_id = {alias}.id"  # noqa: S608
        f" AND j.status NOT IN {TERMINAL!r})"
    )


def eligible_messages(
    conn: Connection, cutoff: datetime, since: datetime | None, after: int, limit: int
) -> list[tuple[int, str, int]]:
    """(id, payload_file, payload_size) of the next `limit` messages to archive, lowest id first:
    received in [since, cutoff), not waiting to be released, every job DELIVERED or DEAD."""
    query = (
        f"SELECT m.id, m.payload_file, m.payload_size FROM {MESSAGE} m"  # noqa: S608
        " WHERE m.id > %(after)s AND m.received_at < %(cutoff)s"
        " AND (%(since)s::timestamptz IS NULL OR m.received_at >= %(since)s)"
        f" AND m.status <> 'SCHEDULED' AND {_unfinished_jobs_filter('m')}"
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
            delete_with_references(conn, MESSAGE, sql.SQL("id = ANY(%(ids)s)"), {"ids": deletable})
        if kept:
            conn.execute(
                f"""UPDATE {ARCHIVE_BATCH} SET kept_message_ids = ARRAY(
                    SELECT DISTINCT unnest(kept_message_ids || %s::bigint[]) ORDER BY 1)
                WHERE id = %s""",  # noqa: S608
                [kept, batch.id],
            )
            batch.kept_message_ids = sorted({*batch.kept_message_ids, *kept})
    return len(deletable), kept


def delete_with_references(
    conn: Connection, table: str, where: sql.Composable, params: dict[str, Any]
) -> None:
    """Delete the rows of `table` matching `where`, having first done to the rows that refer to
    them what the models' on_delete would (tables.ARCHIVE_DELETES): cascade, or set to NULL.

    The broker's foreign keys have no ON DELETE in PostgreSQL, so this is the archive's copy of
    what the ORM does; the referring rows go first, then the rows themselves.
    """
    ids = sql.SQL("SELECT id FROM {} WHERE {}").format(sql.Identifier(table), where)
    for reference in ARCHIVE_DELETES[table]:
        column = sql.Identifier(reference.column)
        referring = sql.SQL("{} IN ({})").format(column, ids)
        if reference.on_delete is OnDelete.CASCADE:
            delete_with_references(conn, reference.table, referring, params)
        else:
            conn.execute(
                sql.SQL("UPDATE {} SET {} = NULL WHERE {}").format(
                    sql.Identifier(reference.table), column, referring
                ),
                params,
            )
    conn.execute(sql.SQL("DELETE FROM {} WHERE {}").format(sql.Identifier(table), where), params)
