"""spark_etl/tables.py against the Django models. The pipeline runs without Django, so it names
the tables and copies the models' on_delete itself; this is what keeps the copy true (plain
Python: no Spark, no database)."""

from __future__ import annotations

from dataclasses import fields

import pytest
from django.apps import apps
from django.db import models

from jobs.models import CLOCK_ALLOWANCE
from spark_etl import partition_store, tables
from spark_etl.config import EtlConfig

# Model label -> the table spark_etl names for it.
MODELS: dict[str, str] = {
    "broker.Message": tables.MESSAGE,
    "broker.PeriodicMessage": tables.PERIODIC,
    "consumers.Consumer": tables.CONSUMER,
    "jobs.Job": tables.JOB,
    "jobs.DeliveryAttempt": tables.ATTEMPT,
    "jobs.DeliveryReport": tables.REPORT,
}


@pytest.mark.parametrize(("label", "table"), MODELS.items())
def test_each_table_is_its_models(label: str, table: str) -> None:
    assert apps.get_model(label)._meta.db_table == table


def test_the_report_table_setting_defaults_to_the_models() -> None:
    defaults = {field.name: field.default for field in fields(EtlConfig)}
    assert defaults["report_table"] == tables.REPORT


def test_the_pipelines_own_tables_are_no_models() -> None:
    django_tables = {model._meta.db_table for model in apps.get_models(include_auto_created=True)}
    own = {tables.WATERMARK, tables.ARCHIVE_BATCH, tables.REPORT_STAGING}
    assert not own & django_tables


def references_to(table: str) -> set[tuple[str, str, str]]:
    """(table, column, on_delete) of every foreign key of every model (many-to-many tables
    included) that points at `table`."""
    found = set()
    for model in apps.get_models(include_auto_created=True):
        if model._meta.proxy:
            continue
        for field in model._meta.local_concrete_fields:
            if not isinstance(field, models.ForeignKey):
                continue
            target = field.target_field  # the column it refers to
            if target.model._meta.db_table == table:
                assert target.column == "id", field  # the archive deletes by id
                on_delete = field.remote_field.on_delete.__name__
                found.add((model._meta.db_table, field.column, on_delete))
    return found


@pytest.mark.parametrize("table", tables.ARCHIVE_DELETES)
def test_the_archive_mirrors_every_foreign_key_to_what_it_deletes(table: str) -> None:
    """Each reference declared is a foreign key with that on_delete, and every foreign key to
    an archived table is declared (OnDelete's names are Django's: CASCADE, SET_NULL)."""
    declared = {
        (reference.table, reference.column, reference.on_delete.name)
        for reference in tables.ARCHIVE_DELETES[table]
    }
    assert declared == references_to(table)


def test_what_the_archive_deletes_it_archives() -> None:
    """The tables a message's deletion cascades to are exactly the tables written to Parquet."""
    reached = set()
    pending = [tables.MESSAGE]
    while pending:
        table = pending.pop()
        reached.add(table)
        pending += [
            reference.table
            for reference in tables.ARCHIVE_DELETES.get(table, ())
            if reference.on_delete is tables.OnDelete.CASCADE
        ]
    assert reached == set(tables.ARCHIVED) == set(tables.ARCHIVE_DELETES)


def test_the_archive_allows_for_the_clocks_as_the_broker_does() -> None:
    assert partition_store.CLOCK_ALLOWANCE == CLOCK_ALLOWANCE
