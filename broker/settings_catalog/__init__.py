"""Every environment variable the broker reads, declared once: name, type, default, bounds,
whether it is a secret, and one line of meaning.

This package imports nothing from Django, so `spark_etl` (which runs under spark-submit) reads the
same variables the same way. Everything else derives from it:

- `broker/settings.py` builds Django's settings from `ServerEnvironment` and `BrokerSettings`;
- `broker.conf.broker_settings` is a `BrokerSettings` reading Django's settings at each access,
  typed, so `broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS` is an `int` to mypy;
- the tables of docs/configuration.md are generated from it:
  `python -m broker.settings_catalog docs/configuration.md` rewrites them, `--check` only compares
  (tests/deploy/test_settings_catalog.py fails when they drift).

A value that cannot be parsed or is out of range raises `ConfigError`, one line naming the
variable; a secret's value is never part of the message.

Its modules, each imported from here:

- `kinds`: how a raw string becomes a typed value (`Text`, `Flag`, `Integer`…), and `ConfigError`;
- `setting`: `Setting`, `SettingGroup`, `read_variable` (secrets from `NAME_FILE` too), the
  sections of docs/configuration.md;
- `server_environment` and `broker_settings`: the declarations, `ServerEnvironment` (Django and
  the processes) and `BrokerSettings` (the broker's own, `broker.conf.broker_settings`);
- `database_url`: DATABASE_URL's forms (`parse_database_url`);
- `doc_tables`: the tables of docs/configuration.md, and the command that writes or checks them.
"""

from broker.settings_catalog.broker_settings import GATEWAY_AUTH_MODES, BrokerSettings
from broker.settings_catalog.database_url import DatabaseUrl, parse_database_url
from broker.settings_catalog.doc_tables import (
    declared_settings,
    generated_sections,
    main,
    markdown_table,
    with_generated_tables,
)
from broker.settings_catalog.kinds import (
    Choice,
    ConfigError,
    Flag,
    Integer,
    Integers,
    Items,
    Kind,
    Number,
    Text,
)
from broker.settings_catalog.server_environment import (
    DATABASE_JIT_MODES,
    DEFAULT_DATABASE_URL,
    INSECURE_DEFAULT_SECRET_KEY,
    LOG_FORMATS,
    ServerEnvironment,
)
from broker.settings_catalog.setting import (
    BROKER,
    GATEWAY,
    RATE_LIMIT,
    READ_REPLICA,
    SECTIONS,
    STORE,
    Setting,
    SettingGroup,
    read_variable,
)

__all__ = [
    "BROKER",
    "DATABASE_JIT_MODES",
    "DEFAULT_DATABASE_URL",
    "GATEWAY",
    "GATEWAY_AUTH_MODES",
    "INSECURE_DEFAULT_SECRET_KEY",
    "LOG_FORMATS",
    "RATE_LIMIT",
    "READ_REPLICA",
    "SECTIONS",
    "STORE",
    "BrokerSettings",
    "Choice",
    "ConfigError",
    "DatabaseUrl",
    "Flag",
    "Integer",
    "Integers",
    "Items",
    "Kind",
    "Number",
    "ServerEnvironment",
    "Setting",
    "SettingGroup",
    "Text",
    "declared_settings",
    "generated_sections",
    "main",
    "markdown_table",
    "parse_database_url",
    "read_variable",
    "with_generated_tables",
]
