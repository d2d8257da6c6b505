"""Reading configuration from the environment, for Django.

The variables themselves are declared, and parsed, in `broker/settings_catalog/` (no Django
there). These helpers keep Django's contract for code that configures Django: every one fails
loudly with ImproperlyConfigured naming the variable and the bad value, instead of falling back
silently, since a typo in production configuration must stop the process at start-up, not change
behaviour quietly. (Secrets, with their `NAME_FILE` variants, are settings of the catalog.)
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from django.core.exceptions import ImproperlyConfigured

from broker import settings_catalog as catalog
from broker.settings_catalog import ConfigError, ServerEnvironment

T = TypeVar("T")

POSTGRESQL = "django.db.backends.postgresql"
# The Django alias of BROKER_READ_DATABASE_URL (broker/db_routing.py).
READ_REPLICA = "replica"


@contextmanager
def _improperly_configured() -> Iterator[None]:
    """The catalog's ConfigError as Django's ImproperlyConfigured, with the same one line."""
    try:
        yield
    except ConfigError as exc:
        raise ImproperlyConfigured(str(exc)) from None


def _read(name: str, kind: catalog.Kind[T], default: T) -> T:
    with _improperly_configured():
        return catalog.read_variable(os.environ, name, kind, default)


def env_str(name: str, default: str) -> str:
    return _read(name, catalog.Text(), default)


def env_bool(name: str, default: bool) -> bool:
    return _read(name, catalog.Flag(), default)


def env_list(name: str, default: list[str]) -> list[str]:
    return _read(name, catalog.Items(), default)


def _server_setting(setting: catalog.Setting[T]) -> T:
    with _improperly_configured():
        return setting.from_environment(os.environ)


def parse_database_url(url: str, variable: str = "DATABASE_URL") -> dict[str, Any]:
    """Turn DATABASE_URL (or `variable`, of the same forms) into a Django DATABASES entry (the
    URL's forms: settings_catalog)."""
    with _improperly_configured():
        parsed = catalog.parse_database_url(url, variable)
    return _postgres_database(parsed)


def database_settings(url: str, variable: str = "DATABASE_URL") -> dict[str, Any]:
    """A DATABASES entry for the URL in `variable`, with the store's connection settings: the
    pool, the connections' age, prepared statements and JIT."""
    database = {**parse_database_url(url, variable), "CONN_HEALTH_CHECKS": True}
    # PostgreSQL: a connection pool per process, so that a process holds a bounded number of
    # connections whatever its threads do. Without it every thread keeps a connection of its own,
    # and `manage.py runserver`, a thread per HTTP connection, ran the server out of connections
    # ("too many clients", issue 14). See docs/configuration.md.
    pool = database_pool()
    if pool:
        database["OPTIONS"]["pool"] = pool
    database["CONN_MAX_AGE"] = database_conn_max_age(pooled=pool is not None)
    database["OPTIONS"].update(_postgres_session_options(database["OPTIONS"]))
    return database


def _postgres_session_options(options: dict[str, Any]) -> dict[str, Any]:
    """Options of every PostgreSQL session the broker opens (DATABASE_PREPARED_STATEMENTS,
    DATABASE_JIT), added to those of the URL."""
    added: dict[str, Any] = {}
    if _server_setting(ServerEnvironment.DATABASE_PREPARED_STATEMENTS):
        # Server-side binding with prepared statements: PostgreSQL plans a statement a connection
        # repeats (publishing above all) once instead of on every request. The pool hands out
        # whole sessions, so they survive there; turn off behind an external pooler in
        # transaction mode (PgBouncer) that cannot carry prepared statements.
        added.update(server_side_binding=True, prepare_threshold=5)
    session: list[str] = []
    if _server_setting(ServerEnvironment.DATABASE_JIT) == "off":
        # The broker's queries are short index lookups, but on large tables their cost estimates
        # pass jit_above_cost and PostgreSQL compiles them: at 25,000,000 jobs the push claim
        # took 800-930 ms with JIT against 19-21 ms without (docs/performance-history.md).
        session.append("-c jit=off")
    # No session of the broker waits for ever on another's lock, nor holds its own for ever
    # when its process stops mid-transaction (frozen, or cut off by the network): issue 36.
    for variable, name in (
        (ServerEnvironment.DATABASE_LOCK_TIMEOUT_SECONDS, "lock_timeout"),
        (ServerEnvironment.DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS,
            "idle_in_transaction_session_timeout"),
    ):  # fmt: skip
        milliseconds = round(_server_setting(variable) * 1000)
        if milliseconds:
            session.append(f"-c {name}={milliseconds}")
    if session:
        # libpq's `options` sets them at connection start, after whatever the URL's own say.
        added["options"] = " ".join(filter(None, [options.get("options"), *session]))
    return added


def read_replica_settings(url: str) -> dict[str, Any]:
    """The DATABASES entry of BROKER_READ_DATABASE_URL, a streaming replica of the default
    database (broker/db_routing.py routes reads there)."""
    replica = database_settings(url, "BROKER_READ_DATABASE_URL")
    # The tests of a project with a replica run against the primary's test database alone.
    replica["TEST"] = {"MIRROR": "default"}
    return replica


def database_pool() -> dict[str, Any] | None:
    """The options of a PostgreSQL connection pool per process (Django's OPTIONS["pool"]), or
    None: DATABASE_POOL=false turns it off.

    With a pool, a process holds at most DATABASE_POOL_MAX_SIZE connections whatever its
    threads do; a request waits up to DATABASE_POOL_TIMEOUT seconds for one of them.
    """
    if not _server_setting(ServerEnvironment.DATABASE_POOL):
        return None
    timeout = _server_setting(ServerEnvironment.DATABASE_POOL_TIMEOUT)
    return {
        # Connections open only when a request finds none free: a sync worker (one request at a
        # time) holds exactly one. (With min_size 1, the first request would not wait for the
        # pool's first connection and open a second.) One left unused for 10 minutes closes.
        "min_size": 0,
        # At least 2: the dispatcher's two database threads keep one each for good.
        "max_size": _server_setting(ServerEnvironment.DATABASE_POOL_MAX_SIZE),
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
    max_age = _server_setting(ServerEnvironment.DATABASE_CONN_MAX_AGE)
    if not pooled:
        return 60 if max_age is None else max_age
    if max_age:
        raise ImproperlyConfigured(
            "DATABASE_CONN_MAX_AGE keeps a connection per thread, which the connection pool"
            " replaces: unset it, or set DATABASE_POOL=false to use it."
        )
    return 0


def _postgres_database(parsed: catalog.DatabaseUrl) -> dict[str, Any]:
    return {
        "ENGINE": POSTGRESQL,
        "NAME": parsed.name,
        "USER": parsed.user,
        "PASSWORD": parsed.password,
        "HOST": parsed.host,
        "PORT": str(parsed.port or ""),
        "OPTIONS": {"connect_timeout": 5, **parsed.options},
    }
