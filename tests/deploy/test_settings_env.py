"""Configuration from the environment fails loudly on bad values (docs/configuration.md)."""

from __future__ import annotations

import pytest
from django.core.exceptions import ImproperlyConfigured

from broker.env import env_bool, env_list, parse_database_url
from tests.processes import run_manage


@pytest.mark.parametrize(("raw", "expected"), [("true", True), ("Yes", True), ("0", False)])
def test_env_bool_accepts_common_spellings(monkeypatch, raw, expected):
    monkeypatch.setenv("FLAG", raw)

    assert env_bool("FLAG", not expected) is expected


def test_unset_or_empty_values_take_the_default(monkeypatch):
    monkeypatch.delenv("UNSET", raising=False)
    monkeypatch.setenv("EMPTY", " ")

    assert env_bool("UNSET", True) is True
    assert env_bool("EMPTY", True) is True
    assert env_list("UNSET", ["a"]) == ["a"]


def test_a_bad_value_raises_naming_the_variable(monkeypatch):
    monkeypatch.setenv("VALUE", "maybe")

    with pytest.raises(ImproperlyConfigured, match="VALUE='maybe' is not a boolean"):
        env_bool("VALUE", False)


def test_list_parses_commas(monkeypatch):
    monkeypatch.setenv("HOSTS", "a.example.com, b.example.com")

    assert env_list("HOSTS", []) == ["a.example.com", "b.example.com"]


@pytest.mark.parametrize(
    ("url", "engine", "name"),
    [
        ("postgres://u:p%40ss@db.internal:6432/broker", "django.db.backends.postgresql", "broker"),
        ("postgresql:///broker", "django.db.backends.postgresql", "broker"),
    ],
)
def test_database_url_selects_the_store(url, engine, name):
    database = parse_database_url(url)

    assert (database["ENGINE"], database["NAME"]) == (engine, name)


def test_postgres_url_parts_and_options():
    database = parse_database_url("postgres://u:p%40ss@db.internal:6432/broker?sslmode=require")

    assert (database["USER"], database["PASSWORD"]) == ("u", "p@ss")
    assert (database["HOST"], database["PORT"]) == ("db.internal", "6432")
    assert database["OPTIONS"]["sslmode"] == "require"


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("mysql://root@localhost/broker", "scheme 'mysql' is not supported"),
        ("sqlite:///broker.sqlite3", "store is PostgreSQL, and SQLite is no longer supported"),
        ("postgres://localhost", "needs a database name"),
        ("postgres://localhost:99999/broker", "invalid port"),
    ],
)
def test_bad_database_urls_are_refused(url, message):
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_database_url(url)


def test_the_process_refuses_to_start_with_a_bad_setting():
    result = run_manage("check", BROKER_RETRY_JITTER="lots")

    assert result.returncode != 0
    assert "BROKER_RETRY_JITTER='lots' is not a number" in result.stderr


def test_broker_settings_fall_back_to_defaults_in_a_host_project(settings):
    from broker.conf import broker_settings

    del settings.BROKER_MAX_PAYLOAD_BYTES  # a project that installed the apps without setting it
    settings.BROKER_RETRY_JITTER = 0.5

    assert broker_settings.BROKER_MAX_PAYLOAD_BYTES == 5 * 1024 * 1024
    assert broker_settings.BROKER_RETRY_JITTER == 0.5
    with pytest.raises(AttributeError):
        broker_settings.BROKER_TYPO  # type: ignore[attr-defined]  # noqa: B018


def test_a_default_database_other_than_postgresql_is_a_system_error(monkeypatch):
    from django.db import connections

    from broker.checks import check_database

    assert check_database(None) == []

    # A host project's own DATABASES (docs/outbox.md): the broker's queue is PostgreSQL's SQL.
    monkeypatch.setattr(connections["default"], "vendor", "sqlite")

    [error] = check_database(None)
    assert error.id == "broker.E004"
    assert "PostgreSQL" in error.msg
