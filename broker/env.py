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


def env_choice(name: str, default: str, choices: tuple[str, ...]) -> str:
    """One of `choices` (compared in lower case); anything else stops start-up."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value not in choices:
        raise ImproperlyConfigured(f"{name}={raw!r} is not one of {', '.join(choices)}.")
    return value


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


def database_pool(engine: str) -> dict[str, Any] | None:
    """The options of a PostgreSQL connection pool per process (Django's OPTIONS["pool"]), or
    None: SQLite has none, and DATABASE_POOL=false turns it off.

    With a pool, a process holds at most DATABASE_POOL_MAX_SIZE connections whatever its
    threads do; a request waits up to DATABASE_POOL_TIMEOUT seconds for one of them.
    """
    if not engine.endswith("postgresql") or not env_bool("DATABASE_POOL", True):
        return None
    timeout = env_float("DATABASE_POOL_TIMEOUT", 5.0, minimum=0.1, maximum=3600.0)
    return {
        # Connections open only when a request finds none free: a sync worker (one request at a
        # time) holds exactly one. (With min_size 1, the first request would not wait for the
        # pool's first connection and open a second.) One left unused for 10 minutes closes.
        "min_size": 0,
        # At least 2: the dispatcher's two database threads keep one each for good.
        "max_size": env_int("DATABASE_POOL_MAX_SIZE", 4, minimum=2),
        "timeout": timeout,
        # While the database is down the pool retries in the background, each delay twice the
        # last, for this long; then the next request starts afresh. With psycopg's 5 minutes,
        # the server still answered 503 for 20 s and more after a 70 s outage had ended; with
        # the retries bounded by the timeout, a waiting request gets the first new connection.
        "reconnect_timeout": timeout,
    }


def database_conn_max_age(pooled: bool) -> int:
    """Django's CONN_MAX_AGE: how long a thread keeps its own connection after a request.

    With a pool, 0 (Django allows nothing else): each request gives its connection back to the
    pool. Without one, DATABASE_CONN_MAX_AGE seconds.
    """
    if not pooled:
        return env_int("DATABASE_CONN_MAX_AGE", 60, minimum=0)
    if env_int("DATABASE_CONN_MAX_AGE", 0, minimum=0) != 0:
        raise ImproperlyConfigured(
            "DATABASE_CONN_MAX_AGE keeps a connection per thread, which the connection pool"
            " replaces: unset it, or set DATABASE_POOL=false to use it."
        )
    return 0


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
