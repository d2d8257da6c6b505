"""The migration operations that add and remove an index without blocking writes
(jobs/migrations/_concurrent_index.py) on the partitioned jobs table: the parent's index built
ON ONLY the parent, each partition's concurrently and attached, a build stopped half-way
completed by running it again, partitions made later given the index, removal everywhere.

CREATE INDEX CONCURRENTLY runs outside a transaction, so the database tests commit; they put
their rows in partitions of 2001, made for them and dropped afterwards with the index."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import psycopg
import pytest
from django.db import IntegrityError, connection, models
from django.db.migrations.loader import MigrationLoader
from django.db.migrations.operations.base import Operation
from django.db.migrations.state import ProjectState
from django.db.models import Q

from jobs import partitions
from jobs.migrations._concurrent_index import (
    AddIndexConcurrentlyOnPostgres,
    RemoveIndexConcurrentlyOnPostgres,
    child_index_name,
)
from jobs.models import Job
from jobs.states import DEAD, QUEUED
from tests.helpers import another_session, make_job

# Descending order, an INCLUDE column and a condition, all of which each partition's index must
# repeat for PostgreSQL to attach it.
INDEX = models.Index(
    fields=["consumer", "-priority"],
    include=["next_attempt_at"],
    condition=Q(status=DEAD),
    name="job_test_dead_priority_idx",
)
FIRST = datetime(2001, 3, 1, tzinfo=UTC)
LONG_BEFORE = datetime(1990, 1, 1, tzinfo=UTC)  # only the DEFAULT partition covers it


class Crash(Exception):
    pass


def test_partition_index_names_are_unique_and_fit_postgresql():
    short = child_index_name("job_due_idx", "jobs_job", "jobs_job_p20261128")
    assert short == "job_due_idx_p20261128"  # as jobs.partitions names a new partition's
    long = "job_" + "x" * 60
    names = [
        child_index_name(f"{long}_a", "jobs_job", "jobs_job_p20261128"),
        child_index_name(f"{long}_b", "jobs_job", "jobs_job_p20261128"),
        child_index_name(f"{long}_a", "jobs_job", "jobs_job_p20261129"),
    ]
    assert len(set(names)) == 3
    assert all(len(name.encode()) <= 63 for name in names)
    assert child_index_name(f"{long}_a", "jobs_job", "jobs_job_p20261128") == names[0]


@pytest.fixture
def restored_schema() -> Iterator[None]:
    """Drop the test's index and the partitions it made, whatever happened."""
    before = {table: set(partition_names(table)) for table in partitions.TABLES}
    yield
    with connection.cursor() as cursor:
        cursor.execute(f'DROP INDEX IF EXISTS "{INDEX.name}"')
        for table in partitions.TABLES:
            for name in set(partition_names(table)) - before[table]:
                cursor.execute(f"DROP TABLE {name}")  # as regclass writes it


@pytest.mark.usefixtures("restored_schema")
@pytest.mark.django_db(transaction=True)
def test_the_index_is_built_on_every_partition_then_removed_from_all():
    first, second = partitions_with_jobs()
    counts_before = index_counts()

    added = migrate(AddIndexConcurrentlyOnPostgres(model_name="job", index=INDEX), jobs_state())

    assert parent_index_valid() is True
    attached = attached_partitions()
    assert {first, second, partitions.JOBS.default} <= set(attached)
    assert all(attached.values())
    definition = index_definition(child_index_name(INDEX.name, "jobs_job", second))
    assert "(consumer_id, priority DESC) INCLUDE (next_attempt_at) WHERE" in definition

    # A partition made afterwards, as housekeeping makes them, has it too.
    later = FIRST.replace(month=6)
    partitions.ensure_partitions(later)
    newest = partitions.JOBS.partition_name(partitions.span_start(later))
    assert attached_partitions()[newest] is True
    assert parent_index_valid() is True

    migrate(RemoveIndexConcurrentlyOnPostgres(model_name="job", name=INDEX.name), added)

    assert parent_index_valid() is None
    counts = index_counts()
    assert {name: counts[name] for name in counts_before} == counts_before
    assert counts[newest] == counts[first]


@pytest.mark.usefixtures("restored_schema")
@pytest.mark.django_db(transaction=True)
def test_a_build_stopped_half_way_is_completed_by_running_it_again(monkeypatch):
    first, second = partitions_with_jobs()
    add = AddIndexConcurrentlyOnPostgres(model_name="job", index=INDEX)
    with monkeypatch.context() as patched:
        crash_before_building_on(second, patched)
        with pytest.raises(Crash):
            migrate(add, jobs_state())
    # A concurrent build that fails leaves its index behind, invalid: here one of the name the
    # second run uses (unique on the status, which two of the partition's jobs share).
    leftover = child_index_name(INDEX.name, "jobs_job", second)
    with pytest.raises(IntegrityError), connection.cursor() as cursor:
        cursor.execute(f'CREATE UNIQUE INDEX CONCURRENTLY "{leftover}" ON "{second}" (status)')
    assert parent_index_valid() is False
    assert attached_partitions()[first] is True
    assert attached_partitions()[second] is False

    migrate(add, jobs_state())

    assert parent_index_valid() is True
    assert all(attached_partitions().values())
    assert "UNIQUE" not in index_definition(leftover)


@pytest.mark.usefixtures("restored_schema")
@pytest.mark.django_db(transaction=True)
def test_a_statement_that_locks_writers_out_waits_briefly_for_its_lock_and_tries_again(caplog):
    """Waiting behind a long transaction would queue every writer of the table behind it."""
    with writing_transaction() as writer:
        threading.Timer(2.5, writer.rollback).start()

        migrate(AddIndexConcurrentlyOnPostgres(model_name="job", index=INDEX), jobs_state())

    assert "lock not granted" in caplog.text
    assert parent_index_valid() is True


# Helpers ---------------------------------------------------------------------------------------


def partitions_with_jobs() -> tuple[str, str]:
    """Two partitions of 2001 holding jobs (two dead ones in the second) and a job in the
    DEFAULT partition; return the two partitions' names."""
    first_at = partitions.span_start(FIRST)
    second_at = first_at + partitions.span()
    partitions.ensure_partitions(second_at, since=first_at)
    place(make_job(QUEUED), first_at)
    for _ in range(2):
        place(make_job(DEAD), second_at)
    place(make_job(QUEUED), LONG_BEFORE)
    return partitions.JOBS.partition_name(first_at), partitions.JOBS.partition_name(second_at)


def place(job: Job, at: datetime) -> None:
    Job.objects.filter(pk=job.pk).update(partition_at=at)


def jobs_state() -> ProjectState:
    return MigrationLoader(connection).project_state()


def migrate(operation: Operation, state: ProjectState) -> ProjectState:
    """Apply `operation` to the database as a migration that is not atomic would; return the
    project state after it."""
    after = state.clone()
    operation.state_forwards("jobs", after)
    with connection.schema_editor(atomic=False) as editor:
        operation.database_forwards("jobs", editor, state, after)
    return after


def crash_before_building_on(partition: str, patched: pytest.MonkeyPatch) -> None:
    """Make the migration stop where it would build the index on `partition`."""
    editor_class = connection.SchemaEditorClass
    execute = editor_class.execute

    def crashing(editor: Any, sql: Any, params: Any = ()) -> None:
        if "CONCURRENTLY" in str(sql) and f'ON "{partition}"' in str(sql):
            raise Crash
        execute(editor, sql, params)

    patched.setattr(editor_class, "execute", crashing)


@contextlib.contextmanager
def writing_transaction() -> Iterator[psycopg.Connection[Any]]:
    """Another connection, in a transaction that holds the lock a writer of jobs_job holds."""
    with another_session() as other:
        other.execute("LOCK TABLE jobs_job IN ROW EXCLUSIVE MODE")
        yield other


def partition_names(table: partitions.Table) -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT inhrelid::regclass::text FROM pg_inherits WHERE inhparent = %s::regclass",
            [table.name],
        )
        return [row[0] for row in cursor.fetchall()]


def parent_index_valid() -> bool | None:
    """Whether the test's index of jobs_job is valid; None if there is none."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)", [INDEX.name]
        )
        row = cursor.fetchone()
    return None if row is None else bool(row[0])


def attached_partitions() -> dict[str, bool]:
    """Each partition of jobs_job: whether it has a valid index attached to the test's."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT partition.relname, EXISTS (
                SELECT 1 FROM pg_inherits attached
                JOIN pg_index ON pg_index.indexrelid = attached.inhrelid
                WHERE attached.inhparent = to_regclass(%s)
                  AND pg_index.indrelid = partition.oid AND pg_index.indisvalid
            )
            FROM pg_inherits JOIN pg_class partition ON partition.oid = pg_inherits.inhrelid
            WHERE pg_inherits.inhparent = 'jobs_job'::regclass
            """,
            [INDEX.name],
        )
        return dict(cursor.fetchall())


def index_counts() -> dict[str, int]:
    """Each partition of jobs_job: how many indexes it has."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT inhrelid::regclass::text,
                   (SELECT count(*) FROM pg_index WHERE indrelid = inhrelid)
            FROM pg_inherits WHERE inhparent = 'jobs_job'::regclass
            """
        )
        return dict(cursor.fetchall())


def index_definition(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_get_indexdef(to_regclass(%s))", [name])
        return str(cursor.fetchone()[0])
