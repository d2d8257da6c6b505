"""The driver's own SQL, through psycopg: the connection, the pipeline's bookkeeping tables, the
bounds of the report's JDBC reads and its watermark. The archive's SQL is beside it:
`batch_store.py` (batches of messages) and `partition_store.py` (whole time partitions).

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
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from spark_etl.config import EtlConfig
from spark_etl.tables import (
    ARCHIVE_BATCH,
    ARCHIVE_PARTITION,
    JOB,
    MESSAGE,
    WATERMARK,
)

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
