"""The benches' rebuild of the big tables' indexes (bench/secondary_indexes.py, issue 38): built
from pg_get_indexdef as it is (`ON ONLY`), a partitioned table's index stays invalid and no
partition has one; built from the statements the benches keep, every index is valid, and the
check after a build stops on one that is not."""

from __future__ import annotations

import importlib
import sys
from types import ModuleType

import psycopg
import pytest
from django.db import connection
from psycopg import sql

from tests import ROOT

pytestmark = pytest.mark.django_db  # the DDL is rolled back with the test's transaction


@pytest.fixture(scope="module")
def bench_indexes() -> ModuleType:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        return importlib.import_module("secondary_indexes")
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.fixture
def database() -> psycopg.Connection:
    """The test's own connection, inside its transaction, as the driver's connection the
    benches use."""
    connection.ensure_connection()
    database: psycopg.Connection = connection.connection
    return database


def test_the_rebuilt_indexes_cover_every_partition_and_are_valid(bench_indexes, database):
    found = bench_indexes.secondary_indexes(database)
    job_indexes = [(name, text) for name, text in found if " public.jobs_job " in text]

    for name, _ in found:
        database.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    for _, definition in found:
        database.execute(definition)

    assert job_indexes  # jobs is partitioned here: pg_get_indexdef said ON ONLY
    assert not [text for _, text in found if " ONLY " in text]
    bench_indexes.require_valid_indexes(database)  # returns: nothing invalid
    name, definition = job_indexes[0]
    on_partitions = database.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = %s::regclass", [name]
    ).fetchone()
    partitions = database.execute(
        "SELECT count(*) FROM pg_inherits WHERE inhparent = 'jobs_job'::regclass"
    ).fetchone()
    assert on_partitions == partitions


def test_an_index_built_on_the_parent_only_stops_the_bench(bench_indexes, database):
    name, definition = next(
        (name, text) for name, text in bench_indexes.secondary_indexes(database)
        if " public.jobs_job " in text
    )  # fmt: skip
    database.execute(sql.SQL("DROP INDEX {}").format(sql.Identifier(name)))
    database.execute(definition.replace(" ON ", " ON ONLY ", 1))  # as pg_get_indexdef has it

    with pytest.raises(SystemExit, match=name):
        bench_indexes.require_valid_indexes(database)
