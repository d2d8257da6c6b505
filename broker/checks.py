"""Start-up system checks with stable IDs (`manage.py check`, `check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, register
from django.core.exceptions import ImproperlyConfigured
from django.db import connection

from broker import embedded_postgres
from broker.conf import broker_settings
from broker.crypto import cipher


@register()
def check_encryption_keys(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    try:
        cipher()
    except ImproperlyConfigured as exc:
        return [Error(str(exc), id="broker.E001")]
    return []


@register()
def check_database(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """The broker's store is PostgreSQL: its queue is SQL of PostgreSQL's (jobs/queue/). A host
    project of the outbox (docs/outbox.md) sets DATABASES itself, so say so before a publish
    fails on it."""
    if connection.vendor != "postgresql":
        engine = settings.DATABASES["default"]["ENGINE"]
        return [
            Error(
                f"The broker's database is PostgreSQL; DATABASES['default'] is {engine}.",
                hint="Set DATABASE_URL=postgres://user:password@host:5432/name (the broker's own"
                " settings; SQLite, its former default, is no longer supported), or use"
                " django.db.backends.postgresql in a host project's DATABASES.",
                id="broker.E004",
            )
        ]
    return []


@register()
def check_payload_storage(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """Offloading large payloads (docs/delivery.md, "Large payloads") needs the storage that
    BROKER_PAYLOAD_STORAGE names; without it every large publish would fail, so say so at start-up
    instead."""
    name = broker_settings.BROKER_PAYLOAD_STORAGE
    if name not in settings.STORAGES:
        return [
            Error(
                f"BROKER_PAYLOAD_STORAGE is {name!r}, which is not a key of STORAGES.",
                hint=f'Add STORAGES[{name!r}], e.g. {{"BACKEND": '
                '"django.core.files.storage.FileSystemStorage", "OPTIONS": {"location": ...}} '
                "(docs/configuration.md).",
                id="broker.E002",
            )
        ]
    return []


@register()
def check_embedded_postgres(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    """Without DATABASE_URL the store is the embedded server of the data directory, which only
    runbroker starts: a command run while it is stopped is told so, not "connection refused"."""
    directory = getattr(settings, "EMBEDDED_POSTGRES_DIR", None)  # a host project has none
    if directory is None or embedded_postgres.running_url(directory):
        return []
    return [
        Error(
            f"DATABASE_URL is not set, and the embedded PostgreSQL server of {directory} is not "
            "running.",
            hint="Start the broker in this directory with `manage.py runbroker` (it starts the "
            "server; other commands then use it), or set DATABASE_URL=postgres://...",
            id="broker.E003",
        )
    ]
