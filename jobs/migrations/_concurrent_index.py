"""Migration operations for the jobs tables, which take writes all the time: an index built and
dropped without blocking writes on PostgreSQL (the migration must be `atomic = False`), plainly
elsewhere. Its module name starts with "_", so Django loads it as no migration.

A plain table gets CREATE / DROP INDEX CONCURRENTLY. PostgreSQL refuses both on a partitioned
table (jobs_job and jobs_deliveryattempt since jobs 0014, jobs/partitions.py), so there:

- adding builds the parent's index ON ONLY the parent (invalid, it holds no rows), then each
  partition's index CONCURRENTLY and attaches it; the parent's index becomes valid with the last
  one. A run that stopped half-way can be run again: what exists is kept, a partition's invalid
  index (left by a concurrent build that failed) is dropped and built again. Partitions made
  later (`ensure_partitions`) are given the parent's indexes when they are attached.
- removing is a plain DROP INDEX of the parent's index, which takes its partitions' with it.

The statements that lock writers out of a table (catalog changes only, a moment each) give up
after a short lock timeout and are tried again, so that they never queue writers behind a long
transaction. Partitions that are partitioned themselves are not supported (PostgreSQL refuses to
build their index concurrently): the jobs tables have none.
"""

from __future__ import annotations

import hashlib
import logging
import time
from typing import TYPE_CHECKING, Any, cast

from django.db import OperationalError, migrations, models, transaction
from django.db.backends.base.schema import BaseDatabaseSchemaEditor
from django.db.backends.ddl_references import Statement
from django.db.migrations.state import ProjectState

from jobs.partitions import LOCK_TIMEOUT

if TYPE_CHECKING:
    from django.db.backends.postgresql.schema import DatabaseSchemaEditor as PostgresSchemaEditor

logger = logging.getLogger(__name__)

LOCK_TRIES = 30  # a migration must get there: a minute or so of trying, then it fails
LOCK_PAUSE = 1.0  # seconds between tries, for the writers that queued behind one to go through
NAME_BYTES = 63  # PostgreSQL's longest identifier
LOCK_NOT_AVAILABLE = "55P03"


class AddIndexConcurrentlyOnPostgres(migrations.AddIndex):
    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            add_index(schema_editor, model, self.index)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            remove_index(schema_editor, model, self.index)


class RemoveIndexConcurrentlyOnPostgres(migrations.RemoveIndex):
    def database_forwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = from_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = from_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            remove_index(schema_editor, model, index)

    def database_backwards(
        self,
        app_label: str,
        schema_editor: BaseDatabaseSchemaEditor,
        from_state: ProjectState,
        to_state: ProjectState,
    ) -> None:
        model = to_state.apps.get_model(app_label, self.model_name)
        if self.allow_migrate_model(schema_editor.connection.alias, model):
            index = to_state.models[app_label, self.model_name_lower].get_index_by_name(self.name)
            add_index(schema_editor, model, index)


def add_index(
    schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model], index: models.Index
) -> None:
    if _is_partitioned(schema_editor, model._meta.db_table):
        _add_partitioned_index(schema_editor, model, index)
    else:
        cast("PostgresSchemaEditor", schema_editor).add_index(model, index, concurrently=True)


def remove_index(
    schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model], index: models.Index
) -> None:
    if _is_partitioned(schema_editor, model._meta.db_table):
        # PostgreSQL has no concurrent way: a partition's index cannot be detached from its
        # parent's, nor dropped alone. A plain DROP locks every partition exclusively, but only
        # to delete catalog rows (the files go at commit), not to read or write any data.
        _briefly_locking(schema_editor, index.remove_sql(model, schema_editor))
    else:
        cast("PostgresSchemaEditor", schema_editor).remove_index(model, index, concurrently=True)


def _add_partitioned_index(
    schema_editor: BaseDatabaseSchemaEditor, model: type[models.Model], index: models.Index
) -> None:
    table = model._meta.db_table
    only_parent = f"ONLY {schema_editor.quote_name(table)}"
    _briefly_locking(
        schema_editor, _create_sql(schema_editor, model, index, index.name, only_parent)
    )
    for partition in _partitions_without(schema_editor, table, index.name):
        _add_to_partition(schema_editor, model, index, partition)
    if not schema_editor.collect_sql:  # sqlmigrate only prints the statements
        _require_valid(schema_editor, table, index.name)


def _add_to_partition(
    schema_editor: BaseDatabaseSchemaEditor,
    model: type[models.Model],
    index: models.Index,
    partition: str,
) -> None:
    """Build the partition's copy of `index` without blocking its writers, then attach it."""
    child = child_index_name(index.name, model._meta.db_table, partition)
    _drop_if_invalid(schema_editor, partition, child)
    on_partition = schema_editor.quote_name(partition)
    schema_editor.execute(
        _create_sql(schema_editor, model, index, child, on_partition, concurrently=True),
        params=None,
    )
    _briefly_locking(
        schema_editor,
        f"ALTER INDEX {schema_editor.quote_name(index.name)}"
        f" ATTACH PARTITION {schema_editor.quote_name(child)}",
    )


def _create_sql(
    schema_editor: BaseDatabaseSchemaEditor,
    model: type[models.Model],
    index: models.Index,
    name: str,
    table: str,
    *,
    concurrently: bool = False,
) -> str:
    """Django's CREATE INDEX for `index`, named `name`, on `table` (SQL: a partition, or ONLY the
    parent), IF NOT EXISTS, for a run that stopped half-way to be run again. Django writes the
    columns, condition, operator classes and INCLUDE columns; they carry over unchanged."""
    statement = index.create_sql(model, schema_editor, concurrently=concurrently)
    parts: dict[str, Any] = {
        **statement.parts,
        "name": f"IF NOT EXISTS {schema_editor.quote_name(name)}",
        "table": table,
    }
    return str(Statement(statement.template, **parts))


def child_index_name(index: str, table: str, partition: str) -> str:
    """The name of the index `index` of `table` on its partition `partition`: the index's name
    and what the partition's name adds to the table's (job_due_idx_p20261128 on
    jobs_job_p20261128, as jobs.partitions names a new partition's indexes); cut short with a
    hash of the whole when that is too long for PostgreSQL, so that it stays unique. The same on
    every run, so that a run that stopped half-way finds what it built."""
    suffix = partition.removeprefix(table) if partition.startswith(table) else f"_{partition}"
    name = f"{index}{suffix}"
    if len(name.encode()) <= NAME_BYTES:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    head = name.encode()[: NAME_BYTES - len(digest) - 1].decode(errors="ignore")
    return f"{head}_{digest}"


def _briefly_locking(schema_editor: BaseDatabaseSchemaEditor, sql: str) -> None:
    """Run `sql`, a catalog change that locks writers out of a table for a moment, in its own
    transaction that waits at most LOCK_TIMEOUT for its lock: waiting longer behind a long
    transaction would queue every writer of the table behind it. Tried LOCK_TRIES times."""
    for attempt in range(1, LOCK_TRIES + 1):
        try:
            with transaction.atomic(using=schema_editor.connection.alias):
                schema_editor.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
                schema_editor.execute(sql, params=None)
            return
        except OperationalError as error:
            lock_not_granted = getattr(error.__cause__, "sqlstate", None) == LOCK_NOT_AVAILABLE
            if not lock_not_granted or attempt == LOCK_TRIES:
                raise
            logger.warning("index migration: lock not granted in %s, trying again", LOCK_TIMEOUT)
            time.sleep(LOCK_PAUSE)


def _is_partitioned(schema_editor: BaseDatabaseSchemaEditor, table: str) -> bool:
    return _one(
        schema_editor,
        "SELECT relkind = 'p' FROM pg_class WHERE oid = to_regclass(%s)",
        [schema_editor.quote_name(table)],
    )


def _partitions_without(
    schema_editor: BaseDatabaseSchemaEditor, table: str, index: str
) -> list[str]:
    """The partitions of `table` (the DEFAULT one too) that have no index attached to `index`."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT partition.relname
            FROM pg_inherits JOIN pg_class partition ON partition.oid = pg_inherits.inhrelid
            WHERE pg_inherits.inhparent = to_regclass(%s) AND NOT EXISTS (
                SELECT 1 FROM pg_inherits attached
                JOIN pg_index ON pg_index.indexrelid = attached.inhrelid
                WHERE attached.inhparent = to_regclass(%s) AND pg_index.indrelid = partition.oid
            )
            ORDER BY partition.relname
            """,
            [schema_editor.quote_name(table), schema_editor.quote_name(index)],
        )
        return [row[0] for row in cursor.fetchall()]


def _drop_if_invalid(schema_editor: BaseDatabaseSchemaEditor, partition: str, index: str) -> None:
    """Drop the partition's index `index` if it is invalid: a concurrent build of it failed or
    was stopped. IF NOT EXISTS would keep it as it is."""
    invalid = _one(
        schema_editor,
        """
        SELECT NOT pg_index.indisvalid
        FROM pg_index JOIN pg_class index ON index.oid = pg_index.indexrelid
        WHERE pg_index.indrelid = to_regclass(%s) AND index.relname = %s
        """,
        [schema_editor.quote_name(partition), index],
    )
    if invalid:
        schema_editor.execute(
            f"DROP INDEX CONCURRENTLY IF EXISTS {schema_editor.quote_name(index)}"
        )


def _require_valid(schema_editor: BaseDatabaseSchemaEditor, table: str, index: str) -> None:
    """A partition attached while the index was built may lack it: then say so, as the index
    would be left invalid (unused by queries); running the migration again completes it."""
    valid = _one(
        schema_editor,
        "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass(%s)",
        [schema_editor.quote_name(index)],
    )
    if not valid:
        raise RuntimeError(
            f"the index {index} of the partitioned table {table} is not valid yet: a partition"
            " lacks it; run the migration again"
        )


def _one(schema_editor: BaseDatabaseSchemaEditor, query: str, params: list[str]) -> bool:
    """The boolean the query selects, False when it selects no row."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(query, params)
        row = cursor.fetchone()
    return bool(row and row[0])
