"""The archive's batches of messages, through psycopg: the manifest (`tables.ARCHIVE_BATCH`) that
lets a re-run continue where a crashed run stopped, the messages a batch takes, and their
deletion with what the models' on_delete does to the rows referring to them (`tables.py`)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import psycopg
from psycopg import sql

from spark_etl.store import ARCHIVE_LOCK, Connection, set_watermark
from spark_etl.tables import (
    ARCHIVE_BATCH,
    ARCHIVE_DELETES,
    ARCHIVE_REGISTRATION,
    ATTEMPT,
    JOB,
    MESSAGE,
    OnDelete,
)

TERMINAL = ("DELIVERED", "DEAD")

# Archive batch states, in the order a batch goes through them.
PLANNED, WRITTEN, PUBLISHED, DELETED, DONE = "planned", "written", "published", "deleted", "done"
ABANDONED = "abandoned"  # its rows changed before they were published; re-planned later


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
    old time partitions to the archive instead of dropping them (jobs/partitions/)."""
    set_watermark(conn, ARCHIVE_REGISTRATION, cutoff)


@contextmanager
def archive_lock(conn: Connection) -> Iterator[bool]:
    """Whether this connection got the archive's lock; held until the block ends. Released
    explicitly, not left to the connection's close: a server process lets its locks go only as
    it exits, after the client has moved on, and a run that follows at once (a retry after a
    failed step) would find the lock still held. A crashed run's lock goes with its connection."""
    row = conn.execute("SELECT pg_try_advisory_lock(%s)", [ARCHIVE_LOCK]).fetchone()
    locked = bool(row and row[0])
    try:
        yield locked
    finally:
        if locked and not conn.broken:
            # Not over the error that ended the run: an unlock that fails leaves the lock to
            # the connection's close, as a crash does.
            with suppress(psycopg.Error):
                conn.execute("SELECT pg_advisory_unlock(%s)", [ARCHIVE_LOCK])


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
