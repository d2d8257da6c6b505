"""Start-up system checks with stable IDs (`manage.py check`, `check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

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


@register(Tags.database, deploy=True)
def check_production_database(app_configs: Any, **kwargs: Any) -> list[CheckMessage]:
    if settings.DATABASES["default"]["ENGINE"].endswith("sqlite3"):
        return [
            Warning(
                "SQLite is the zero-setup store for a first run; use PostgreSQL in production.",
                hint="Set DATABASE_URL=postgres://user:password@host:5432/name.",
                id="broker.W001",
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
    directory = settings.EMBEDDED_POSTGRES_DIR
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
