"""spark_etl's configuration from the environment (plain Python: no Spark, no database)."""

from __future__ import annotations

import pytest

from spark_etl.config import ConfigError, Database, from_environment


def test_database_url_becomes_jdbc_and_psycopg_settings():
    database = Database.from_url("postgres://broker:s%40cret@db.internal:6543/broker_prod")
    assert database.jdbc_url == "jdbc:postgresql://db.internal:6543/broker_prod"
    assert database.jdbc_properties()["password"] == "s@cret"
    assert database.psycopg_kwargs()["user"] == "broker"


def test_environment_settings(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1/broker")
    monkeypatch.setenv("BROKER_RETENTION_DAYS", "7")
    monkeypatch.setenv("SPARK_ETL_CONF", "spark.driver.memory=2g, spark.sql.shuffle.partitions=8")
    config = from_environment(output="/data/etl")
    assert config.retention_days == 7
    assert config.archive_path == "/data/etl/archive"
    assert config.spark_conf == {
        "spark.driver.memory": "2g",
        "spark.sql.shuffle.partitions": "8",
    }


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("DATABASE_URL", "sqlite:///broker.sqlite3", "postgres://"),
        ("BROKER_RETENTION_DAYS", "a month", "integer"),
        ("SPARK_ETL_ARCHIVE_BATCH", "0", "at least 1"),
        ("SPARK_ETL_CONF", "spark.driver.memory", "key=value"),
    ],
)
def test_bad_settings_are_named(monkeypatch, name, value, message):
    monkeypatch.setenv("DATABASE_URL", "postgres://postgres@127.0.0.1/broker")
    monkeypatch.setenv(name, value)
    with pytest.raises(ConfigError, match=message):
        from_environment()
