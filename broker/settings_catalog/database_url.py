"""DATABASE_URL's forms, parsed once for Django (broker/env.py) and spark_etl (spark_etl/config.py).
Messages never echo the URL, which may hold a password."""

from __future__ import annotations

from dataclasses import dataclass, field
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from broker.settings_catalog.kinds import ConfigError


@dataclass(frozen=True)
class DatabaseUrl:
    """DATABASE_URL's parts (a PostgreSQL server's); empty strings and None where it says nothing
    (libpq's defaults)."""

    name: str
    user: str = ""
    password: str = ""
    host: str = ""
    port: int | None = None
    options: dict[str, str] = field(default_factory=dict)  # the query: libpq options


def parse_database_url(url: str, variable: str = "DATABASE_URL") -> DatabaseUrl:
    """`postgres://user:password@host:port/name?sslmode=require` (or `postgresql://`). Messages
    name `variable` (the read replica's URL has the same forms) and never echo the URL, which
    may hold a password."""
    parts = urlsplit(url)
    if parts.scheme in {"postgres", "postgresql"}:
        return _postgres_url(parts, variable)
    if parts.scheme == "sqlite":
        raise ConfigError(
            f"{variable} is a sqlite:// URL: the broker's store is PostgreSQL, and SQLite is no"
            f" longer supported. Set {variable}=postgres://user:password@host:5432/name."
        )
    raise ConfigError(
        f"{variable} scheme {parts.scheme!r} is not supported: the broker's store is PostgreSQL"
        " (postgres://user:password@host:5432/name)."
    )


def _postgres_url(parts: SplitResult, variable: str) -> DatabaseUrl:
    if not parts.path.strip("/"):
        raise ConfigError(f"{variable} for PostgreSQL needs a database name.")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError(f"{variable} has an invalid port.") from None
    return DatabaseUrl(
        name=unquote(parts.path.strip("/")),
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        host=parts.hostname or "",
        port=port,
        options=dict(parse_qsl(parts.query)),
    )
