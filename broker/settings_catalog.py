"""Every environment variable the broker reads, declared once: name, type, default, bounds,
whether it is a secret, and one line of meaning.

This module imports nothing from Django, so `spark_etl` (which runs under spark-submit) reads the
same variables the same way. Everything else derives from it:

- `broker/settings.py` builds Django's settings from `ServerEnvironment` and `BrokerSettings`;
- `broker.conf.broker_settings` is a `BrokerSettings` reading Django's settings at each access,
  typed, so `broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS` is an `int` to mypy;
- the tables of docs/configuration.md are generated from it:
  `python -m broker.settings_catalog docs/configuration.md` rewrites them, `--check` only compares
  (tests/deploy/test_settings_catalog.py fails when they drift).

A value that cannot be parsed or is out of range raises `ConfigError`, one line naming the
variable; a secret's value is never part of the message.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, cast, overload
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


class ConfigError(ValueError):
    """A setting is missing or malformed: one line naming the variable (never a secret's value)."""


# --- Kinds of value: how a raw string becomes a typed value, and what bounds it has ---------


class Kind(Generic[T_co]):
    # Numbers, booleans and choices treat a blank value as unset; text and lists keep it (an empty
    # list is a meaningful value: BROKER_GATEWAY_AUTH_EXEMPT_PATHS= exempts nothing).
    blank_is_unset = True

    def parse(self, name: str, raw: str) -> T_co:
        raise NotImplementedError

    def bounds(self) -> str:
        """The allowed values, for the docs ("" when anything of the type goes)."""
        return ""


class Text(Kind[str]):
    blank_is_unset = False

    def parse(self, name: str, raw: str) -> str:
        return raw


class Flag(Kind[bool]):
    def parse(self, name: str, raw: str) -> bool:
        value = raw.strip().lower()
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        raise ConfigError(f"{name}={raw!r} is not a boolean (use true or false).")


@dataclass(frozen=True)
class Choice(Kind[str]):
    choices: tuple[str, ...]

    def parse(self, name: str, raw: str) -> str:
        value = raw.strip().lower()  # compared in lower case
        if value not in self.choices:
            raise ConfigError(f"{name}={raw!r} is not one of {', '.join(self.choices)}.")
        return value

    def bounds(self) -> str:
        return "one of " + ", ".join(f"`{choice}`" for choice in self.choices)


@dataclass(frozen=True)
class Integer(Kind[int]):
    minimum: int | None = None

    def parse(self, name: str, raw: str) -> int:
        try:
            value = int(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not an integer.") from None
        if self.minimum is not None and value < self.minimum:
            raise ConfigError(f"{name}={value} must be at least {self.minimum}.")
        return value

    def bounds(self) -> str:
        return "" if self.minimum is None else f"at least {self.minimum}"


@dataclass(frozen=True)
class Number(Kind[float]):
    minimum: float
    maximum: float

    def parse(self, name: str, raw: str) -> float:
        try:
            value = float(raw.strip())
        except ValueError:
            raise ConfigError(f"{name}={raw!r} is not a number.") from None
        if not self.minimum <= value <= self.maximum:
            raise ConfigError(f"{name}={value} must be between {self.minimum} and {self.maximum}.")
        return value

    def bounds(self) -> str:
        return f"from {_plain(self.minimum)} to {_plain(self.maximum)}, decimals allowed"


def _plain(number: float) -> str:
    """1000000.0 -> "1000000", 0.1 -> "0.1" (no exponent in the docs)."""
    return str(int(number)) if number.is_integer() else str(number)


class Items(Kind[list[str]]):
    """Comma-separated values; blanks around and between them are dropped."""

    blank_is_unset = False

    def parse(self, name: str, raw: str) -> list[str]:
        return [item.strip() for item in raw.split(",") if item.strip()]


@dataclass(frozen=True)
class Integers(Kind[list[int]]):
    minimum: int = 0
    blank_is_unset = False

    def parse(self, name: str, raw: str) -> list[int]:
        try:
            values = [int(item) for item in Items().parse(name, raw)]
        except ValueError:
            raise ConfigError(f"{name} must be comma-separated integers.") from None
        if any(value < self.minimum for value in values):
            raise ConfigError(f"{name}: every value must be at least {self.minimum}.")
        return values

    def bounds(self) -> str:
        return f"each at least {self.minimum}"


# --- One setting ------------------------------------------------------------------------------


class Setting(Generic[T]):
    """One variable, declared as a class attribute of a `SettingGroup` (which names it).

    Read from an instance, it is the value the instance's source gives (Django's settings, the
    environment); read from the class, it is this declaration.
    """

    name: str

    def __init__(
        self,
        kind: Kind[T],
        default: T,
        meaning: str,
        *,
        section: str,
        secret: bool = False,
        shown_default: str | None = None,
    ) -> None:
        if secret and not isinstance(kind, Text | Items):
            # Text and Items never fail to parse, so no error message can carry a secret's value.
            raise TypeError("a secret setting must be Text or Items")
        self.kind = kind
        self.default = default
        self.meaning = meaning
        self.section = section  # the table of docs/configuration.md it appears in
        self.secret = secret  # NAME_FILE is accepted too
        self.shown_default = shown_default  # the docs' default, when the value alone misleads

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, instance: None, owner: type) -> Setting[T]: ...
    @overload
    def __get__(self, instance: SettingGroup, owner: type) -> T: ...
    def __get__(self, instance: SettingGroup | None, owner: type) -> Setting[T] | T:
        if instance is None:
            return self
        return cast(T, instance._read(self))

    def from_environment(self, environ: Mapping[str, str]) -> T:
        return read_variable(environ, self.name, self.kind, self.default, secret=self.secret)


def read_variable(
    environ: Mapping[str, str], name: str, kind: Kind[T], default: T, *, secret: bool = False
) -> T:
    """The variable's value, or `default` when it is unset (or blank, for most kinds)."""
    raw = _raw_secret(environ, name) if secret else environ.get(name)
    if raw is None or (kind.blank_is_unset and not raw.strip()):
        return copy.copy(default)  # a list default is never shared with a caller
    return kind.parse(name, raw)


def _raw_secret(environ: Mapping[str, str], name: str) -> str | None:
    """A secret from NAME, or from the file named by NAME_FILE (never both)."""
    file_name = environ.get(f"{name}_FILE")
    if file_name and name in environ:
        raise ConfigError(f"Set either {name} or {name}_FILE, not both.")
    if not file_name:
        return environ.get(name)
    try:
        return Path(file_name).read_text().strip()
    except OSError as exc:
        raise ConfigError(f"{name}_FILE: cannot read {file_name!r}: {exc}") from exc


class SettingGroup:
    """Settings declared together; an instance reads their values from one source."""

    def __init__(self, read: Callable[[Setting[Any]], object]) -> None:
        self._read = read

    @classmethod
    def declared(cls) -> list[Setting[Any]]:
        return [value for value in vars(cls).values() if isinstance(value, Setting)]

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> Self:
        """Every value parsed now (the first bad one raises ConfigError), then read from them."""
        values = {setting.name: setting.from_environment(environ) for setting in cls.declared()}
        return cls(lambda setting: values[setting.name])

    def values(self) -> dict[str, Any]:
        """Every setting's name and value."""
        return {setting.name: getattr(self, setting.name) for setting in self.declared()}


# --- The declarations -------------------------------------------------------------------------

STORE = "store"
BROKER = "broker"
GATEWAY = "gateway"
RATE_LIMIT = "rate-limit"
SECTIONS = (STORE, BROKER, GATEWAY, RATE_LIMIT)

DEFAULT_DATABASE_URL = "sqlite:///broker.sqlite3"
# Flagged by `manage.py check --deploy` (security.W009) because of its prefix: never run with it.
INSECURE_DEFAULT_SECRET_KEY = "django-insecure-webhook-broker-development-key-do-not-deploy"  # noqa: S105
LOG_FORMATS = ("text", "json")
GATEWAY_AUTH_MODES = ("none", "hmac")


class ServerEnvironment(SettingGroup):
    """Variables that configure Django and the processes (broker/settings.py); code reads the
    Django settings built from them, not these."""

    DATABASE_URL = Setting(
        Text(),
        DEFAULT_DATABASE_URL,
        "the store. `sqlite:///relative.db`, `sqlite:////absolute/path.db`, or"
        " `postgres://user:password@host:port/name?option=value` (query options such as"
        " `sslmode=require` go to libpq; `postgres:///name` uses the local socket)."
        " Other schemes are refused",
        section=STORE,
    )
    DATABASE_POOL = Setting(
        Flag(),
        True,
        "PostgreSQL: a pool of connections per process, shared by its threads"
        " ([below](#database-connections)); `false`: a connection per thread, kept"
        " `DATABASE_CONN_MAX_AGE` seconds. SQLite never has a pool",
        section=STORE,
    )
    DATABASE_POOL_MAX_SIZE = Setting(
        Integer(minimum=2),
        4,
        "the most connections one process (a gunicorn worker, runserver, a dispatcher, a"
        " django-q2 process) opens",
        section=STORE,
    )
    DATABASE_POOL_TIMEOUT = Setting(
        Number(minimum=0.1, maximum=3600.0),
        5.0,
        "seconds a request waits for a free connection of the pool before it is answered"
        " `503 database unavailable`",
        section=STORE,
        shown_default="`5`",
    )
    DATABASE_CONN_MAX_AGE: Setting[int | None] = Setting(
        Integer(minimum=0),
        None,  # broker/env.py: 60 without the pool, and nothing but 0 with it
        "only with `DATABASE_POOL=false` (or SQLite): seconds a thread keeps its connection"
        " (0: a new one per request). With the pool, setting it is an error: Django allows no"
        " persistent connections with a pool",
        section=STORE,
        shown_default="`60` without the pool",
    )
    DATABASE_PREPARED_STATEMENTS = Setting(
        Flag(),
        True,
        "PostgreSQL: server-side binding and prepared statements (halves the database's CPU per"
        " broadcast); set `false` behind a pooler in transaction mode that cannot carry them",
        section=STORE,
    )
    DJANGO_SECRET_KEY = Setting(
        Text(),
        INSECURE_DEFAULT_SECRET_KEY,
        "Django's signing key; `manage.py check --deploy` flags the default (security.W009)",
        section=STORE,
        secret=True,
        shown_default="an insecure development key",
    )
    DJANGO_DEBUG = Setting(Flag(), False, "Django debug mode; never in production", section=STORE)
    DJANGO_ALLOWED_HOSTS = Setting(
        Items(),
        ["localhost", "127.0.0.1", "[::1]"],
        "host names the broker answers to",
        section=STORE,
    )
    DJANGO_CSRF_TRUSTED_ORIGINS = Setting(
        Items(),
        [],
        "origins (`https://broker.example.com`) allowed to post forms, when behind a proxy",
        section=STORE,
    )
    DJANGO_HTTPS = Setting(
        Flag(),
        False,
        "served over TLS: secure cookies, redirect to HTTPS (except `/_status`), HSTS, and trust"
        " of `X-Forwarded-Proto: https` from the proxy",
        section=STORE,
    )
    DJANGO_HSTS_SECONDS: Setting[int | None] = Setting(
        Integer(minimum=0),
        None,  # broker/settings.py: a year with DJANGO_HTTPS, else 0
        "HSTS max-age",
        section=STORE,
        shown_default="`31536000` with HTTPS, else `0`",
    )
    DJANGO_STATIC_ROOT = Setting(
        Text(),
        "",  # broker/settings.py: staticfiles/ in the directory the process runs in
        "where `collectstatic` writes",
        section=STORE,
        shown_default="`staticfiles/` in the directory the process runs in",
    )
    DJANGO_LOG_LEVEL = Setting(
        Text(), "INFO", "root log level (logs go to standard error)", section=STORE
    )
    BROKER_LOG_FORMAT = Setting(
        Choice(LOG_FORMATS),
        "text",
        "log lines as text, or with `json` one JSON object per line, fields as keys (the"
        " container image sets it): [observability.md](observability.md#logs)",
        section=STORE,
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


class BrokerSettings(SettingGroup):
    """The broker's own settings (names from docs/configuration.md), which code reads through
    `broker.conf.broker_settings`; each is also read from the environment variable of its name."""

    BROKER_ADMIN_TOKENS = Setting(
        Items(),
        [],
        "comma-separated bearer tokens accepted as admin on the API",
        section=BROKER,
        secret=True,
    )
    BROKER_OPEN_ADMIN_API = Setting(
        Flag(), False, "webhook-broker's open admin API, for trusted networks only", section=BROKER
    )
    BROKER_PUBLIC_STATUS = Setting(
        Flag(),
        True,
        "`/_status` answers anyone (load balancer probes; it shows only health and version);"
        " `false`: admins only",
        section=BROKER,
    )
    BROKER_PUBLIC_METRICS = Setting(
        Flag(),
        False,
        "`/metrics` answers anyone; by default admins only (Prometheus can send a bearer token)",
        section=BROKER,
    )
    BROKER_ALLOW_PRIVATE_CALLBACKS = Setting(
        Flag(),
        False,
        "allow callback URLs on private, loopback or link-local addresses",
        section=BROKER,
    )
    BROKER_DELIVERY_TIMEOUT_SECONDS = Setting(
        Integer(minimum=1),
        30,
        "push request timeout; also the base of every lease",
        section=BROKER,
    )
    BROKER_CONSUMER_TOKEN_HEADER = Setting(
        Text(),
        "X-Broker-Consumer-Token",
        "the header that carries the consumer's token on push deliveries",
        section=BROKER,
    )
    BROKER_DELIVERY_USER_AGENT = Setting(
        Text(),
        "",  # jobs/dispatch.py: webhook-broker-django/<version>
        "the `User-Agent` of push deliveries (webhook-broker's `[consumer-connection]"
        " user-agent`; set `Webhook Message Broker` for receivers that filter on its value)",
        section=BROKER,
        shown_default="`webhook-broker-django/<version>`",
    )
    BROKER_RATIONAL_DELAY_SECONDS = Setting(
        Integer(minimum=0), 2, "grace added to every lease", section=BROKER
    )
    BROKER_RETRY_DELAYS = Setting(
        Integers(minimum=0),
        [30, 120, 600, 1800, 3600, 7200, 21600, 43200],
        "seconds before each retry: 8 retries (9 attempts) over about 22 hours",
        section=BROKER,
    )
    BROKER_RETRY_JITTER = Setting(
        Number(minimum=0.0, maximum=1.0),
        0.2,
        "± fraction applied to each delay (0 disables)",
        section=BROKER,
    )
    BROKER_CIRCUIT_FAILURE_THRESHOLD = Setting(
        Integer(minimum=0),
        5,
        "consecutive failures that open a consumer's circuit (0 disables)",
        section=BROKER,
    )
    BROKER_CIRCUIT_COOLDOWN_SECONDS = Setting(
        Integer(minimum=1),
        30,
        "first cooldown of an open circuit; doubles up to 3600",
        section=BROKER,
    )
    BROKER_MAX_JOB_AGE_SECONDS = Setting(
        Integer(minimum=0),
        3 * 86400,
        "a push job still undelivered this long after it was queued (published, released,"
        " requeued or replayed) goes DEAD as `expired`; a consumer's `maxJobAge` overrides it;"
        " 0: no limit ([dispatcher.md](dispatcher.md#age-limit))",
        section=BROKER,
        shown_default="`259200` (3 days)",
    )
    BROKER_MIN_SCHEDULE_DELAY_SECONDS = Setting(
        Integer(minimum=0),
        120,
        "earliest allowed `X-Broker-Scheduled-For`, in seconds from now (`412` if sooner); not"
        " applied to `publish(scheduled_for=…)` (see [scheduled.md](scheduled.md))",
        section=BROKER,
    )
    BROKER_PAYLOAD_OFFLOAD_BYTES = Setting(
        Integer(minimum=1),
        262144,
        "payloads above this (256 KiB) are kept in the payload storage instead of the database;"
        " at or below, in the message row",
        section=BROKER,
    )
    BROKER_MAX_PAYLOAD_BYTES = Setting(
        Integer(minimum=1), 5242880, "larger payloads are refused (413)", section=BROKER
    )
    BROKER_PAYLOAD_STORAGE = Setting(
        Text(),
        "broker_payloads",
        "the key of Django's `STORAGES` that holds offloaded payloads (see"
        " [below](#payload-storage))",
        section=BROKER,
    )
    BROKER_ENCRYPTION_KEYS = Setting(
        Items(),
        [],
        "Fernet keys, newest first, that encrypt consumer tokens and signing secrets at rest"
        " ([below](#encryption-keys))",
        section=BROKER,
        secret=True,
        shown_default="derived from `DJANGO_SECRET_KEY`",
    )
    BROKER_RETENTION_DAYS = Setting(
        Integer(minimum=0),
        30,
        "housekeeping deletes fully delivered messages older than this, with their jobs and"
        " attempts (0 keeps them for ever); also `spark_etl archive`'s age limit",
        section=BROKER,
    )
    BROKER_GATEWAY_AUTH_MODE = Setting(
        Choice(GATEWAY_AUTH_MODES),
        "none",
        "`none`: no check; `hmac`: every request outside the exempt paths needs a valid"
        " `X-Broker-Signature`",
        section=GATEWAY,
    )
    BROKER_GATEWAY_HMAC_SECRET = Setting(
        Text(),
        "",
        "the shared secret, base64 (`openssl rand -base64 32`); required, and must decode, with"
        " `hmac` (start-up stops otherwise, without echoing it)",
        section=GATEWAY,
        secret=True,
    )
    BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS = Setting(
        Integer(minimum=1),
        300,
        "how far `t` may be from the broker's clock, either way",
        section=GATEWAY,
    )
    BROKER_GATEWAY_AUTH_EXEMPT_PATHS = Setting(
        Items(),
        ["/_status", "/metrics"],
        "comma-separated path prefixes that need no signature (probes and Prometheus cannot"
        " sign); empty: none",
        section=GATEWAY,
    )
    BROKER_BROADCAST_RATE_LIMIT = Setting(
        Number(minimum=0.0, maximum=1e6),
        0.0,
        "HTTP broadcasts per second allowed per producer, sustained (`0.5` is one every two"
        " seconds); `0` turns the limiter off",
        section=RATE_LIMIT,
        shown_default="`0` (off)",
    )
    BROKER_BROADCAST_BURST = Setting(
        Integer(minimum=0),
        0,
        "broadcasts a producer may send at once after a quiet spell",
        section=RATE_LIMIT,
        shown_default="`0` (= one second's worth, at least 1)",
    )


def declared_settings() -> list[Setting[Any]]:
    return BrokerSettings.declared() + ServerEnvironment.declared()


# --- DATABASE_URL -----------------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseUrl:
    """DATABASE_URL's parts; empty strings and None where it says nothing (libpq's defaults)."""

    engine: str  # "sqlite" or "postgresql"
    name: str
    user: str = ""
    password: str = ""
    host: str = ""
    port: int | None = None
    options: dict[str, str] = field(default_factory=dict)  # the query: libpq options


def parse_database_url(url: str) -> DatabaseUrl:
    """`sqlite:///relative.sqlite3`, `sqlite:////absolute/path.sqlite3`, `sqlite://:memory:`, or
    `postgres://user:password@host:port/name?sslmode=require`. Messages never echo the URL,
    which may hold a password."""
    parts = urlsplit(url)
    if parts.scheme == "sqlite":
        return DatabaseUrl(engine="sqlite", name=_sqlite_name(parts))
    if parts.scheme in {"postgres", "postgresql"}:
        return _postgres_url(parts)
    raise ConfigError(
        f"DATABASE_URL scheme {parts.scheme!r} is not supported (use sqlite:// or postgres://)."
    )


def _sqlite_name(parts: SplitResult) -> str:
    if parts.netloc == ":memory:":
        return ":memory:"
    if parts.path.startswith("/") and len(parts.path) > 1:
        return parts.path[1:]  # sqlite:///x.db -> "x.db"; sqlite:////abs/x.db -> "/abs/x.db"
    raise ConfigError("DATABASE_URL for SQLite needs a file: sqlite:///broker.sqlite3")


def _postgres_url(parts: SplitResult) -> DatabaseUrl:
    if not parts.path.strip("/"):
        raise ConfigError("DATABASE_URL for PostgreSQL needs a database name.")
    try:
        port = parts.port
    except ValueError:
        raise ConfigError("DATABASE_URL has an invalid port.") from None
    return DatabaseUrl(
        engine="postgresql",
        name=unquote(parts.path.strip("/")),
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        host=parts.hostname or "",
        port=port,
        options=dict(parse_qsl(parts.query)),
    )


# --- docs/configuration.md ----------------------------------------------------------------------

# A generated table sits between `<!-- settings: SECTION -->` and `<!-- /settings -->`.
_GENERATED = re.compile(r"(<!-- settings: ([a-z-]+) -->\n).*?(<!-- /settings -->)", re.DOTALL)


def markdown_table(section: str) -> str:
    rows = [
        "| variable | default | meaning |",
        "|---|---|---|",
        *(_markdown_row(s) for s in declared_settings() if s.section == section),
    ]
    return "\n".join(rows) + "\n"


def _markdown_row(setting: Setting[Any]) -> str:
    variable = f"`{setting.name}`"
    if setting.secret:
        variable += f" / `{setting.name}_FILE`"
    meaning = setting.meaning
    if bounds := setting.kind.bounds():
        meaning += f"; {bounds}"
    return f"| {variable} | {_shown_default(setting)} | {meaning} |"


def _shown_default(setting: Setting[Any]) -> str:
    if setting.shown_default is not None:
        return setting.shown_default
    value = setting.default
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        value = ",".join(str(item) for item in value)
    return f"`{value}`" if value != "" else "empty"


def with_generated_tables(document: str) -> str:
    """The document with every generated table rewritten from the declarations."""
    return _GENERATED.sub(
        lambda match: match.group(1) + markdown_table(match.group(2)) + match.group(3), document
    )


def generated_sections(document: str) -> Iterator[str]:
    return (match.group(2) for match in _GENERATED.finditer(document))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m broker.settings_catalog",
        description="Rewrite the generated settings tables of a Markdown file (or check them).",
    )
    parser.add_argument("document", type=Path, help="e.g. docs/configuration.md")
    parser.add_argument("--check", action="store_true", help="only report whether it is current")
    options = parser.parse_args(argv)
    current = options.document.read_text()
    generated = with_generated_tables(current)
    if generated == current:
        return 0
    if options.check:
        print(f"{options.document} is out of date: run {parser.prog} {options.document}")
        return 1
    options.document.write_text(generated)
    print(f"{options.document} rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
