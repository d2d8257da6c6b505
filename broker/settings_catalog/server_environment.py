"""`ServerEnvironment`: the variables that configure Django and the processes (the store, Django's
own settings, logs, the payload directory, housekeeping workers); broker/settings.py builds
Django's settings from them."""

from __future__ import annotations

from broker.settings_catalog.kinds import Choice, Flag, Integer, Items, Number, Text
from broker.settings_catalog.setting import BROKER, READ_REPLICA, STORE, Setting, SettingGroup

# Unset: the embedded PostgreSQL server of postgres/ (broker/settings.py).
DEFAULT_DATABASE_URL = ""
# Flagged by `manage.py check --deploy` (security.W009) because of its prefix: never run with it.
INSECURE_DEFAULT_SECRET_KEY = "django-insecure-webhook-broker-development-key-do-not-deploy"  # noqa: S105
LOG_FORMATS = ("text", "json")
# DATABASE_JIT: JIT off on the broker's connections, or the server's own setting left alone.
DATABASE_JIT_MODES = ("off", "server")


class ServerEnvironment(SettingGroup, section=STORE):
    """Variables that configure Django and the processes (broker/settings.py); code reads the
    Django settings built from them, not these."""

    DATABASE_URL = Setting(
        Text(),
        DEFAULT_DATABASE_URL,
        "the store, PostgreSQL 15+: `postgres://user:password@host:port/name?option=value`"
        " (query options such as `sslmode=require` go to libpq; `postgres:///name` uses the"
        " local socket). Other schemes, `sqlite://` among them, are refused. Unset: the"
        " embedded PostgreSQL server of `postgres/` ([below](#the-embedded-postgresql-server))",
        shown_default="the embedded PostgreSQL server",
    )
    DATABASE_POOL = Setting(
        Flag(),
        True,
        "PostgreSQL: a pool of connections per process, shared by its threads"
        " ([below](#database-connections)); `false`: a connection per thread, kept"
        " `DATABASE_CONN_MAX_AGE` seconds",
    )
    DATABASE_POOL_MAX_SIZE = Setting(
        Integer(minimum=2),
        4,
        "the most connections one process (a gunicorn worker, runserver, a dispatcher, a"
        " django-q2 process) opens",
    )
    DATABASE_POOL_TIMEOUT = Setting(
        Number(minimum=0.1, maximum=3600.0),
        5.0,
        "seconds a request waits for a free connection of the pool before it is answered"
        " `503 database unavailable`",
        shown_default="`5`",
    )
    DATABASE_CONN_MAX_AGE: Setting[int | None] = Setting(
        Integer(minimum=0),
        None,  # broker/env.py: 60 without the pool, and nothing but 0 with it
        "only with `DATABASE_POOL=false`: seconds a thread keeps its connection"
        " (0: a new one per request). With the pool, setting it is an error: Django allows no"
        " persistent connections with a pool",
        shown_default="`60` without the pool",
    )
    DATABASE_PREPARED_STATEMENTS = Setting(
        Flag(),
        True,
        "PostgreSQL: server-side binding and prepared statements (halves the database's CPU per"
        " broadcast); set `false` behind a pooler in transaction mode that cannot carry them",
    )
    DATABASE_JIT = Setting(
        Choice(DATABASE_JIT_MODES),
        "off",
        "PostgreSQL: `off` turns JIT compilation off for the broker's own connections (libpq's"
        " `options=-c jit=off`); at 25,000,000 jobs JIT made the dispatcher's claim 40 times"
        " slower ([below](#jit)). `server`: keep the server's setting; behind PgBouncer, which"
        " refuses `options`, set `ALTER DATABASE … SET jit = off` and this to `server`",
    )
    DATABASE_LOCK_TIMEOUT_SECONDS = Setting(
        Number(minimum=0.0, maximum=3600.0),
        5.0,
        "PostgreSQL: the longest any statement of the broker waits for a lock another session"
        " holds (`lock_timeout`); it then fails (a publish answers `503`) rather than queueing"
        " behind, say, a session left idle in a transaction that holds a consumer's row."
        " `0`: the server's setting. Behind PgBouncer, which refuses `options`, set `0` and"
        " `ALTER ROLE … SET lock_timeout` ([below](#lock-timeouts))",
        shown_default="`5`",
    )
    DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS = Setting(
        Number(minimum=0.0, maximum=86400.0),
        30.0,
        "PostgreSQL: the server ends a broker session that stays this long inside a transaction"
        " without a statement (`idle_in_transaction_session_timeout`): a process frozen or cut"
        " off mid-transaction gives its row locks back within this time, not at TCP keepalive's"
        " two hours. `0`: the server's setting. Behind PgBouncer: as above",
        shown_default="`30`",
    )
    BROKER_READ_DATABASE_URL = Setting(
        Text(),
        "",
        "a streaming replica of the `DATABASE_URL` server, as a `postgres://` URL of the same"
        " form: the reads that may be a moment old (the UI's pages, the admin API's lists and"
        " summaries, `/metrics`) go there, everything else to `DATABASE_URL`"
        " ([below](#read-replica)). Unset: one database",
        section=READ_REPLICA,
        shown_default="unset",
    )
    DJANGO_SECRET_KEY = Setting(
        Text(),
        INSECURE_DEFAULT_SECRET_KEY,
        "Django's signing key; `manage.py check --deploy` flags the default (security.W009)",
        secret=True,
        shown_default="an insecure development key",
    )
    DJANGO_DEBUG = Setting(Flag(), False, "Django debug mode; never in production")
    DJANGO_ALLOWED_HOSTS = Setting(
        Items(),
        ["localhost", "127.0.0.1", "[::1]"],
        "host names the broker answers to",
    )
    DJANGO_CSRF_TRUSTED_ORIGINS = Setting(
        Items(),
        [],
        "origins (`https://broker.example.com`) allowed to post forms, when behind a proxy",
    )
    DJANGO_HTTPS = Setting(
        Flag(),
        False,
        "served over TLS: secure cookies, redirect to HTTPS (except `/_status`), HSTS, and trust"
        " of `X-Forwarded-Proto: https` from the proxy",
    )
    DJANGO_HSTS_SECONDS: Setting[int | None] = Setting(
        Integer(minimum=0),
        None,  # broker/settings.py: a year with DJANGO_HTTPS, else 0
        "HSTS max-age",
        shown_default="`31536000` with HTTPS, else `0`",
    )
    DJANGO_STATIC_ROOT = Setting(
        Text(),
        "",  # broker/settings.py: staticfiles/ in the directory the process runs in
        "where `collectstatic` writes",
        shown_default="`staticfiles/` in the directory the process runs in",
    )
    DJANGO_LOG_LEVEL = Setting(Text(), "INFO", "root log level (logs go to standard error)")
    BROKER_LOG_FORMAT = Setting(
        Choice(LOG_FORMATS),
        "text",
        "log lines as text, or with `json` one JSON object per line, fields as keys (the"
        " container image sets it): [observability.md](observability.md#logs)",
    )
    BROKER_PAYLOAD_DIR = Setting(
        Text(),
        "",  # broker/settings.py: payloads/ in the directory the process runs in
        "where the default `broker_payloads` storage keeps its files: the web server and every"
        " dispatcher must see the same one, so start them in one directory or set it (the image"
        " runs in `/var/lib/broker`)",
        section=BROKER,
        shown_default="`payloads/` in the directory the process runs in",
    )
    BROKER_HOUSEKEEPING_WORKERS = Setting(
        Integer(minimum=1),
        1,
        "worker processes of the housekeeping cluster (`manage.py qcluster`,"
        " [housekeeping.md](housekeeping.md))",
        section=BROKER,
    )
