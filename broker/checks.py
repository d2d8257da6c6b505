"""Start-up system checks with stable IDs (`manage.py check`, `check --deploy`)."""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register
from django.core.exceptions import ImproperlyConfigured

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
