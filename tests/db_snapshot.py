"""Every row the broker keeps, to prove that a refused request changed nothing."""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.db import connection

# Rows a request never writes but the machinery may (heartbeats of dispatchers, Django's
# sessions); none of the broker's state.
APPS = ("broker", "consumers", "jobs")


def snapshot() -> dict[str, list[tuple[Any, ...]]]:
    """All rows of the broker's tables, each table ordered by primary key."""
    rows: dict[str, list[tuple[Any, ...]]] = {}
    for label in APPS:
        for model in apps.get_app_config(label).get_models():
            rows[model._meta.db_table] = list(model._default_manager.order_by("pk").values_list())
    rows.update(_raw_tables())
    return rows


def fingerprint() -> tuple[str, ...]:
    """A digest of every row of the broker's tables in one query (PostgreSQL): cheap enough to
    take around each of the thousands of requests the fuzzer sends."""
    tables = [
        model._meta.db_table for label in APPS for model in apps.get_app_config(label).get_models()
    ]
    from broker.ratelimit import TABLE

    tables.append(TABLE)
    digests = ", ".join(
        f"(SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t::text), '')) FROM {table} t)"  # noqa: S608
        for table in tables
    )
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT {digests}")  # table names from the models
        return tuple(cursor.fetchone())


def _raw_tables() -> dict[str, list[tuple[Any, ...]]]:
    """Tables without a model (the broadcast rate limiter's buckets, broker/ratelimit.py)."""
    from broker.ratelimit import TABLE

    if TABLE not in connection.introspection.table_names():
        return {}
    with connection.cursor() as cursor:
        cursor.execute(f"SELECT * FROM {TABLE} ORDER BY 1")  # noqa: S608 (a constant name)
        return {TABLE: [tuple(row) for row in cursor.fetchall()]}
