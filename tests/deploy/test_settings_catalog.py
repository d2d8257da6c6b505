"""Every setting declared once (the package broker/settings_catalog/), and everything else
(Django's settings, `broker_settings`, spark_etl, docs/configuration.md) derived from it."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from broker.conf import broker_settings
from broker.settings_catalog import (
    SECTIONS,
    BrokerSettings,
    Choice,
    ConfigError,
    Flag,
    Integer,
    Integers,
    Items,
    Number,
    ServerEnvironment,
    Text,
    declared_settings,
    generated_sections,
    parse_database_url,
    with_generated_tables,
)
from tests import ROOT
from tests.processes import operator_environment, run_manage

CONFIGURATION_DOC = ROOT / "docs" / "configuration.md"

# The kinds and bounds the settings had before the catalog (broker/settings.py's env_* calls): a
# change here is a change of behaviour, to be made on purpose.
EXPECTED_KINDS = {
    "BROKER_ADMIN_TOKENS": Items(),
    "BROKER_OPEN_ADMIN_API": Flag(),
    "BROKER_PUBLIC_STATUS": Flag(),
    "BROKER_PUBLIC_METRICS": Flag(),
    "BROKER_PRODUCER_CHANNELS": Choice(("open", "bound")),
    "BROKER_ALLOW_PRIVATE_CALLBACKS": Flag(),
    "BROKER_DELIVERY_TIMEOUT_SECONDS": Integer(minimum=1),
    "BROKER_DISPATCH_EVENT_LOOP": Choice(("asyncio", "uvloop")),
    "BROKER_CONSUMER_TOKEN_HEADER": Text(),
    "BROKER_DELIVERY_USER_AGENT": Text(),
    "BROKER_RATIONAL_DELAY_SECONDS": Integer(minimum=0),
    "BROKER_RETRY_DELAYS": Integers(minimum=0),
    "BROKER_RETRY_JITTER": Number(minimum=0.0, maximum=1.0),
    "BROKER_CIRCUIT_FAILURE_THRESHOLD": Integer(minimum=0),
    "BROKER_CIRCUIT_COOLDOWN_SECONDS": Integer(minimum=1),
    "BROKER_MAX_JOB_AGE_SECONDS": Integer(minimum=0),
    "BROKER_MIN_SCHEDULE_DELAY_SECONDS": Integer(minimum=0),
    "BROKER_PULL_WAITERS_PER_PROCESS": Integer(minimum=0),
    "BROKER_PAYLOAD_OFFLOAD_BYTES": Integer(minimum=1),
    "BROKER_MAX_PAYLOAD_BYTES": Integer(minimum=1),
    "BROKER_MAX_BATCH_MESSAGES": Integer(minimum=1),
    "BROKER_MAX_BATCH_BYTES": Integer(minimum=1),
    "BROKER_PAYLOAD_STORAGE": Text(),
    "BROKER_ENCRYPTION_KEYS": Items(),
    "BROKER_RETENTION_DAYS": Integer(minimum=0),
    "BROKER_PARTITION_DAYS": Integer(minimum=1),
    "BROKER_LIVE_COUNT_MAX_JOBS": Integer(minimum=0),
    "BROKER_LIVE_COUNT_MAX_STATUS_JOBS": Integer(minimum=0),
    "BROKER_UI_STATEMENT_TIMEOUT_SECONDS": Number(minimum=0.0, maximum=3600.0),
    "BROKER_GATEWAY_AUTH_MODE": Choice(("none", "hmac")),
    "BROKER_GATEWAY_HMAC_SECRET": Text(),
    "BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS": Integer(minimum=1),
    "BROKER_GATEWAY_AUTH_EXEMPT_PATHS": Items(),
    "BROKER_BROADCAST_RATE_LIMIT": Number(minimum=0.0, maximum=1e6),
    "BROKER_BROADCAST_BURST": Integer(minimum=0),
    "BROKER_SCHEMA_STEPS_PER_SECOND": Integer(minimum=0),
    "DATABASE_URL": Text(),
    "DATABASE_POOL": Flag(),
    "DATABASE_POOL_MAX_SIZE": Integer(minimum=2),
    "DATABASE_POOL_TIMEOUT": Number(minimum=0.1, maximum=3600.0),
    "DATABASE_CONN_MAX_AGE": Integer(minimum=0),
    "DATABASE_PREPARED_STATEMENTS": Flag(),
    "DATABASE_JIT": Choice(("off", "server")),
    "DATABASE_LOCK_TIMEOUT_SECONDS": Number(minimum=0.0, maximum=3600.0),
    "DATABASE_IDLE_IN_TRANSACTION_TIMEOUT_SECONDS": Number(minimum=0.0, maximum=86400.0),
    "BROKER_READ_DATABASE_URL": Text(),
    "DJANGO_SECRET_KEY": Text(),
    "DJANGO_DEBUG": Flag(),
    "DJANGO_ALLOWED_HOSTS": Items(),
    "DJANGO_CSRF_TRUSTED_ORIGINS": Items(),
    "DJANGO_HTTPS": Flag(),
    "DJANGO_HSTS_SECONDS": Integer(minimum=0),
    "DJANGO_STATIC_ROOT": Text(),
    "DJANGO_LOG_LEVEL": Text(),
    "BROKER_LOG_FORMAT": Choice(("text", "json")),
    "BROKER_PAYLOAD_DIR": Text(),
    "BROKER_HOUSEKEEPING_WORKERS": Integer(minimum=1),
}
SECRETS = {
    "BROKER_ADMIN_TOKENS",
    "BROKER_ENCRYPTION_KEYS",
    "BROKER_GATEWAY_HMAC_SECRET",
    "DJANGO_SECRET_KEY",
}


def kind_signature(kind: object) -> tuple[str, str]:
    return type(kind).__name__, repr(vars(kind))


def test_each_setting_keeps_its_kind_and_bounds():
    declared = {setting.name: setting for setting in declared_settings()}

    assert set(declared) == set(EXPECTED_KINDS)
    for name, kind in EXPECTED_KINDS.items():
        assert kind_signature(declared[name].kind) == kind_signature(kind), name
    assert {name for name, setting in declared.items() if setting.secret} == SECRETS


def test_every_setting_is_named_once_across_the_groups():
    names = [setting.name for setting in declared_settings()]

    assert len(names) == len(set(names))
    assert all(setting.section in SECTIONS for setting in declared_settings())


def test_unset_variables_take_the_declared_defaults():
    values = BrokerSettings.from_environment({}).values()

    assert values == {setting.name: setting.default for setting in BrokerSettings.declared()}
    assert values["BROKER_DELIVERY_TIMEOUT_SECONDS"] == 30
    assert values["BROKER_RETRY_DELAYS"] == [30, 120, 600, 1800, 3600, 7200, 21600, 43200]


def test_a_list_default_is_a_copy():
    first = BrokerSettings.BROKER_RETRY_DELAYS.from_environment({})
    first.append(1)

    assert BrokerSettings.BROKER_RETRY_DELAYS.from_environment({})[-1] == 43200


@pytest.mark.parametrize(
    ("environ", "name", "expected"),
    [
        ({"BROKER_DELIVERY_TIMEOUT_SECONDS": " 45 "}, "BROKER_DELIVERY_TIMEOUT_SECONDS", 45),
        ({"BROKER_DELIVERY_TIMEOUT_SECONDS": " "}, "BROKER_DELIVERY_TIMEOUT_SECONDS", 30),
        ({"BROKER_PUBLIC_STATUS": "off"}, "BROKER_PUBLIC_STATUS", False),
        ({"BROKER_RETRY_DELAYS": "5, 10,,60 "}, "BROKER_RETRY_DELAYS", [5, 10, 60]),
        ({"BROKER_RETRY_DELAYS": ""}, "BROKER_RETRY_DELAYS", []),
        ({"BROKER_GATEWAY_AUTH_EXEMPT_PATHS": ""}, "BROKER_GATEWAY_AUTH_EXEMPT_PATHS", []),
        ({"BROKER_GATEWAY_AUTH_MODE": " HMAC "}, "BROKER_GATEWAY_AUTH_MODE", "hmac"),
        ({"BROKER_ADMIN_TOKENS": "a, b,"}, "BROKER_ADMIN_TOKENS", ["a", "b"]),
        ({"BROKER_BROADCAST_RATE_LIMIT": "0.5"}, "BROKER_BROADCAST_RATE_LIMIT", 0.5),
        ({"BROKER_DELIVERY_USER_AGENT": "Webhook Message Broker"}, "BROKER_DELIVERY_USER_AGENT",
         "Webhook Message Broker"),
    ],
)  # fmt: skip
def test_values_from_the_environment(environ, name, expected):
    assert BrokerSettings.from_environment(environ).values()[name] == expected


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"BROKER_DELIVERY_TIMEOUT_SECONDS": "abc"},
            "BROKER_DELIVERY_TIMEOUT_SECONDS='abc' is not an integer.",
        ),
        (
            {"BROKER_DELIVERY_TIMEOUT_SECONDS": "0"},
            "BROKER_DELIVERY_TIMEOUT_SECONDS=0 must be at least 1.",
        ),
        ({"BROKER_RETRY_JITTER": "abc"}, "BROKER_RETRY_JITTER='abc' is not a number."),
        ({"BROKER_RETRY_JITTER": "1.5"}, "BROKER_RETRY_JITTER=1.5 must be between 0.0 and 1.0."),
        ({"BROKER_OPEN_ADMIN_API": "maybe"}, "BROKER_OPEN_ADMIN_API='maybe' is not a boolean"),
        ({"BROKER_GATEWAY_AUTH_MODE": "sha"}, "BROKER_GATEWAY_AUTH_MODE='sha' is not one of"),
        ({"BROKER_RETRY_DELAYS": "30,x"}, "BROKER_RETRY_DELAYS must be comma-separated integers."),
        ({"BROKER_RETRY_DELAYS": "30,-5"}, "BROKER_RETRY_DELAYS: every value must be at least 0"),
    ],
)
def test_bad_values_raise_one_line_naming_the_variable(environ, message):
    with pytest.raises(ConfigError) as error:
        BrokerSettings.from_environment(environ)

    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_secret_from_a_file_and_never_in_a_message(tmp_path):
    secret_file = tmp_path / "tokens"
    secret_file.write_text("from-file-token\n")

    tokens = BrokerSettings.BROKER_ADMIN_TOKENS.from_environment(
        {"BROKER_ADMIN_TOKENS_FILE": str(secret_file)}
    )
    with pytest.raises(ConfigError, match="either BROKER_ADMIN_TOKENS or") as error:
        BrokerSettings.BROKER_ADMIN_TOKENS.from_environment(
            {"BROKER_ADMIN_TOKENS": "inline-token", "BROKER_ADMIN_TOKENS_FILE": str(secret_file)}
        )

    assert tokens == ["from-file-token"]
    assert "inline-token" not in str(error.value)
    assert "from-file-token" not in str(error.value)


def test_an_unreadable_secret_file_is_named_and_nothing_secret_echoed(tmp_path):
    missing = str(tmp_path / "missing")

    with pytest.raises(ConfigError, match="DJANGO_SECRET_KEY_FILE: cannot read") as error:
        ServerEnvironment.DJANGO_SECRET_KEY.from_environment({"DJANGO_SECRET_KEY_FILE": missing})

    assert "\n" not in str(error.value)


def test_a_secret_setting_cannot_have_a_kind_that_fails_with_its_value():
    from broker.settings_catalog import Setting

    with pytest.raises(TypeError):
        Setting(Integer(), 0, "a secret number", section="broker", secret=True)


def test_broker_settings_read_django_settings_at_each_access(settings):
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 7
    first = broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 9

    assert (first, broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS) == (7, 9)


def test_broker_settings_are_the_declared_attributes():
    # The class attributes are the declarations; an undeclared name is an AttributeError (and,
    # for mypy, an attr-defined error).
    assert BrokerSettings.BROKER_DELIVERY_TIMEOUT_SECONDS.default == 30
    with pytest.raises(AttributeError):
        broker_settings.BROKER_TYPO  # type: ignore[attr-defined]  # noqa: B018


def test_the_shared_constants_are_the_ones_the_code_uses():
    from broker.gateway_auth import MODES
    from broker.logs import LOG_FORMATS

    assert BrokerSettings.BROKER_GATEWAY_AUTH_MODE.kind == Choice(MODES)
    assert ServerEnvironment.BROKER_LOG_FORMAT.kind == Choice(LOG_FORMATS)


def test_database_url_is_parsed_once_for_django_and_spark_etl():
    from broker.env import parse_database_url as django_database
    from spark_etl.config import Database

    url = "postgres://u:p%40ss@db.internal:6432/broker?sslmode=require"
    parsed = parse_database_url(url)
    django = django_database(url)
    spark = Database.from_url(url)

    assert (parsed.user, parsed.password, parsed.host, parsed.port) == (
        "u",
        "p@ss",
        "db.internal",
        6432,
    )
    assert (django["USER"], django["PASSWORD"], django["PORT"]) == ("u", "p@ss", "6432")
    assert (spark.user, spark.password, spark.port, spark.name) == ("u", "p@ss", 6432, "broker")


def test_spark_etl_never_echoes_a_database_url():
    from spark_etl.config import Database

    for url in ("mysql://root:hunter2@db/broker", "sqlite:///hunter2.sqlite3"):
        with pytest.raises(ConfigError) as error:
            Database.from_url(url)
        assert "hunter2" not in str(error.value)


def test_the_catalog_and_spark_etl_config_import_no_django():
    code = (
        "import sys, broker.settings_catalog, spark_etl.config\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'django'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )

    assert result.stdout.strip() == "[]"


# --- docs/configuration.md ---------------------------------------------------------------------


def test_configuration_doc_tables_are_generated_from_the_catalog():
    document = CONFIGURATION_DOC.read_text()

    assert with_generated_tables(document) == document, (
        "docs/configuration.md is out of date: run"
        " `.venv/bin/python -m broker.settings_catalog docs/configuration.md`"
    )
    assert sorted(generated_sections(document)) == sorted(SECTIONS)


def test_configuration_doc_names_only_declared_variables():
    declared = {setting.name for setting in declared_settings()}
    declared |= {f"{setting.name}_FILE" for setting in declared_settings() if setting.secret}
    declared.add("DJANGO_SETTINGS_MODULE")  # Django's own, set by manage.py and wsgi.py
    mentioned = set(
        re.findall(r"\b(?:BROKER|DJANGO|DATABASE)_[A-Z_]*[A-Z]\b", CONFIGURATION_DOC.read_text())
    )

    assert mentioned - declared == set()
    assert declared - mentioned == set()


def test_the_doc_check_command_reports_drift(tmp_path):
    stale = tmp_path / "configuration.md"
    stale.write_text("<!-- settings: gateway -->\n| old |\n<!-- /settings -->\n")
    command = [sys.executable, "-m", "broker.settings_catalog", "--check", str(stale)]

    before = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)
    subprocess.run([*command[:3], str(stale)], cwd=ROOT, capture_output=True, check=True)
    after = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, check=False)

    assert (before.returncode, after.returncode) == (1, 0)
    assert "BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS" in stale.read_text()


# --- Start-up: one line, not a traceback ----------------------------------------------------------


@pytest.mark.parametrize("command", ["check", "migrate", "dispatch", "qcluster", "runbroker"])
def test_manage_py_stops_with_one_line_on_a_bad_value(command):
    result = run_manage(command, BROKER_DELIVERY_TIMEOUT_SECONDS="abc")

    assert result.returncode == 2
    assert result.stderr == (
        "configuration error: BROKER_DELIVERY_TIMEOUT_SECONDS='abc' is not an integer.\n"
    )


@pytest.mark.parametrize(
    ("variables", "line"),
    [
        ({"DATABASE_URL": "mysql://root@db/broker"}, "DATABASE_URL scheme 'mysql' is not"),
        ({"BROKER_GATEWAY_AUTH_MODE": "hmac"}, "BROKER_GATEWAY_HMAC_SECRET must be"),
        ({"DATABASE_POOL_MAX_SIZE": "1", "DATABASE_URL": "postgres:///x"}, "DATABASE_POOL_MAX_"),
        ({"DATABASE_JIT": "maybe"}, "DATABASE_JIT='maybe' is not one of off, server."),
        (
            {"DATABASE_URL": "postgres:///x", "BROKER_READ_DATABASE_URL": "mysql://u:hunter2@r/x"},
            "BROKER_READ_DATABASE_URL scheme 'mysql' is not supported",
        ),
        (
            {"DATABASE_URL": "postgres:///x", "BROKER_READ_DATABASE_URL": "postgres://r:5/"},
            "BROKER_READ_DATABASE_URL for PostgreSQL needs a database name.",
        ),
        ({"DATABASE_URL": "sqlite:///hunter2.sqlite3"}, "DATABASE_URL is a sqlite:// URL"),
        (
            {"DJANGO_SECRET_KEY": "hunter2", "DJANGO_SECRET_KEY_FILE": "/hunter2"},
            "Set either DJANGO_SECRET_KEY or DJANGO_SECRET_KEY_FILE",
        ),
    ],
)
def test_other_start_up_errors_are_one_line_too(variables, line):
    result = run_manage("check", **variables)

    assert result.returncode == 2
    assert result.stderr.startswith(f"configuration error: {line}")
    assert result.stderr.count("\n") == 1
    assert "hunter2" not in result.stderr


def test_gunicorn_stops_with_one_line_on_a_bad_value(tmp_path):
    gunicorn = Path(sys.executable).parent / "gunicorn"
    result = subprocess.run(
        [
            str(gunicorn),
            "broker.wsgi",
            "--bind",
            f"unix:{tmp_path / 'broker.sock'}",
            "--control-socket",
            str(tmp_path / "gunicorn.ctl"),
        ],
        cwd=ROOT,
        env=operator_environment(BROKER_RETRY_JITTER="lots"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 4  # gunicorn's "App failed to load": it does not retry
    assert "configuration error: BROKER_RETRY_JITTER='lots' is not a number.\n" in result.stderr
    assert "Traceback" not in result.stderr
