"""Reading configuration from environment variables.

Every helper fails loudly (ImproperlyConfigured naming the variable and the bad value) instead of
falling back silently: a typo in production configuration must stop the process at start-up, not
change behaviour quietly. Secrets also accept a `NAME_FILE` variant pointing at a file (Docker and
Kubernetes secrets); the error messages never echo a secret's value.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_str(name: str, default: str) -> str:
    return os.environ.get(name, default)


def env_secret(name: str, default: str) -> str:
    """A secret from NAME, or from the file named by NAME_FILE (never both)."""
    file_name = os.environ.get(f"{name}_FILE")
    if file_name and name in os.environ:
        raise ImproperlyConfigured(f"Set either {name} or {name}_FILE, not both.")
    if file_name:
        try:
            return Path(file_name).read_text().strip()
        except OSError as exc:
            raise ImproperlyConfigured(f"{name}_FILE: cannot read {file_name!r}: {exc}") from exc
    return os.environ.get(name, default)


def env_secret_list(name: str) -> list[str]:
    """Comma-separated secrets (tokens, keys) from NAME or NAME_FILE."""
    return [item.strip() for item in env_secret(name, "").split(",") if item.strip()]


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ImproperlyConfigured(f"{name}={raw!r} is not a boolean (use true or false).")


def env_int(name: str, default: int, *, minimum: int | None = None) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not an integer.") from None
    if minimum is not None and value < minimum:
        raise ImproperlyConfigured(f"{name}={value} must be at least {minimum}.")
    return value


def env_float(name: str, default: float, *, minimum: float, maximum: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw.strip())
    except ValueError:
        raise ImproperlyConfigured(f"{name}={raw!r} is not a number.") from None
    if not minimum <= value <= maximum:
        raise ImproperlyConfigured(f"{name}={value} must be between {minimum} and {maximum}.")
    return value


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return list(default)
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_int_list(name: str, default: list[int], *, minimum: int = 0) -> list[int]:
    items = env_list(name, [str(value) for value in default])
    try:
        values = [int(item) for item in items]
    except ValueError:
        raise ImproperlyConfigured(f"{name} must be comma-separated integers.") from None
    if any(value < minimum for value in values):
        raise ImproperlyConfigured(f"{name}: every value must be at least {minimum}.")
    return values


def parse_database_url(url: str) -> dict[str, Any]:
    """Turn DATABASE_URL into a Django DATABASES entry.

    `sqlite:///relative.sqlite3`, `sqlite:////absolute/path.sqlite3` and `sqlite://:memory:` select
    SQLite; `postgres://user:password@host:port/name?sslmode=require` selects PostgreSQL (query
    parameters become libpq connection options).
    """
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return _sqlite_database(parts.path, parts.netloc)
    if parts.scheme in {"postgres", "postgresql"}:
        return _postgres_database(parts, dict(parse_qsl(parts.query)))
    raise ImproperlyConfigured(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported (use sqlite:// or postgres://)."
    )


def _sqlite_database(path: str, netloc: str) -> dict[str, Any]:
    if netloc == ":memory:":
        name = ":memory:"
    elif path.startswith("/") and len(path) > 1:
        name = path[1:]  # sqlite:///x.db -> "x.db"; sqlite:////abs/x.db -> "/abs/x.db"
    else:
        raise ImproperlyConfigured("DATABASE_URL for SQLite needs a file: sqlite:///broker.sqlite3")
    return {
        "ENGINE": "django.db.backends.sqlite3",
        "NAME": name,
        "OPTIONS": {
            # IMMEDIATE takes the write lock when a transaction starts, so two writers cannot both
            # read a job as QUEUED and then race to update it; WAL lets readers run meanwhile.
            "transaction_mode": "IMMEDIATE",
            "timeout": 20,
            "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
        },
    }


def _postgres_database(parts: SplitResult, options: Mapping[str, str]) -> dict[str, Any]:
    if not parts.path.strip("/"):
        raise ImproperlyConfigured("DATABASE_URL for PostgreSQL needs a database name.")
    try:
        port = parts.port
    except ValueError:
        raise ImproperlyConfigured("DATABASE_URL has an invalid port.") from None
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": unquote(parts.path.strip("/")),
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": parts.hostname or "",
        "PORT": str(port or ""),
        "OPTIONS": {"connect_timeout": 5, **options},
    }
