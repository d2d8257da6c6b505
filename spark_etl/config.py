"""Settings of the pipeline, read from the environment (no Django: this runs under spark-submit).

The broker's own variables (DATABASE_URL, BROKER_RETENTION_DAYS, BROKER_PAYLOAD_DIR) are read as
the broker reads them, through broker/settings_catalog/ (which imports no Django either); the
SPARK_ETL_* ones with the same parsers.

The manage.py wrapper (`jobs/management/commands/spark_etl.py`) builds the same `EtlConfig`
from
Django's database settings instead, so both ways of running read the same store.
"""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from broker.settings_catalog import (
    BrokerSettings,
    Integer,
    ServerEnvironment,
    parse_database_url,
    read_variable,
)
from broker.settings_catalog import ConfigError as ConfigError  # what spark_etl raises
from spark_etl import tables

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"  # Debian's libpostgresql-jdbc-java


@dataclass(frozen=True)
class Database:
    host: str
    port: int
    name: str
    user: str
    password: str = ""

    @classmethod
    def from_url(cls, url: str) -> Database:
        """postgres://user:password@host:port/name (the broker's DATABASE_URL)."""
        parsed = parse_database_url(url)
        # JDBC needs a host and a port where libpq has defaults of its own.
        return cls(
            host=parsed.host or "127.0.0.1",
            port=parsed.port or 5432,
            name=parsed.name,
            user=parsed.user or "postgres",
            password=parsed.password,
        )

    @property
    def jdbc_url(self) -> str:
        return f"jdbc:postgresql://{self.host}:{self.port}/{self.name}"

    def jdbc_properties(self) -> dict[str, str]:
        return {"user": self.user, "password": self.password, "driver": "org.postgresql.Driver"}

    def psycopg_kwargs(self) -> dict[str, Any]:
        return {
            "host": self.host,
            "port": self.port,
            "dbname": self.name,
            "user": self.user,
            "password": self.password,
        }


@dataclass(frozen=True)
class EtlConfig:
    database: Database
    # Where the Parquet goes: any path Hadoop understands (a local directory, hdfs://, s3a://).
    output: str = "spark-output"
    master: str | None = None  # None: spark-submit's --master, or local[*] when run directly
    jdbc_jar: str = DEFAULT_JDBC_JAR
    # Parallel JDBC reads of one table, each over a slice of its numeric key.
    read_partitions: int = 4
    fetch_size: int = 10_000
    # archive: messages received more than this many days ago (0: archive nothing).
    retention_days: int = BrokerSettings.BROKER_RETENTION_DAYS.default
    # archive: messages per batch (one Parquet directory, one manifest row).
    archive_batch: int = 100_000
    # archive: messages per DELETE transaction within a batch.
    delete_chunk: int = 2_000
    # report: a nightly run recomputes this many hours before the last run's end, because jobs
    # of recent messages are still being retried (the default retry schedule spans about a day).
    settle_hours: int = 48
    report_table: str = tables.REPORT
    # Offloaded payloads (docs/delivery.md, "Large payloads") when run without Django: the
    # filesystem storage's directory.
    payload_dir: str | None = None
    spark_conf: dict[str, str] = field(default_factory=dict)

    @property
    def report_path(self) -> str:
        return f"{self.output.rstrip('/')}/report"

    @property
    def archive_path(self) -> str:
        return f"{self.output.rstrip('/')}/archive"


def _int(name: str, default: int, minimum: int = 0) -> int:
    return read_variable(os.environ, name, Integer(minimum=minimum), default)


def _spark_conf(name: str) -> dict[str, str]:
    """ "spark.driver.memory=2g,spark.sql.shuffle.partitions=8" -> a dict."""
    conf = {}
    for item in filter(None, (part.strip() for part in os.environ.get(name, "").split(","))):
        key, equals, value = item.partition("=")
        if not equals or not key.strip():
            raise ConfigError(f"{name} takes key=value pairs separated by commas, not {item!r}")
        conf[key.strip()] = value.strip()
    return conf


def from_environment(**overrides: Any) -> EtlConfig:
    """The configuration from SPARK_ETL_* variables and the broker's own DATABASE_URL,
    BROKER_RETENTION_DAYS and BROKER_PAYLOAD_DIR; keyword arguments win."""
    if "database" in overrides:
        database = overrides["database"]
    elif url := os.environ.get("DATABASE_URL", ""):
        database = Database.from_url(url)
    else:
        raise ConfigError("set DATABASE_URL (postgres://user@host:port/name)")
    values: dict[str, Any] = {
        "database": database,
        "output": os.environ.get("SPARK_ETL_OUTPUT", "spark-output"),
        "master": os.environ.get("SPARK_ETL_MASTER") or None,
        "jdbc_jar": os.environ.get("SPARK_ETL_JDBC_JAR", DEFAULT_JDBC_JAR),
        "read_partitions": _int("SPARK_ETL_READ_PARTITIONS", 4, minimum=1),
        "retention_days": BrokerSettings.BROKER_RETENTION_DAYS.from_environment(os.environ),
        "archive_batch": _int("SPARK_ETL_ARCHIVE_BATCH", 100_000, minimum=1),
        "settle_hours": _int("SPARK_ETL_SETTLE_HOURS", 48),
        "spark_conf": _spark_conf("SPARK_ETL_CONF"),
        "payload_dir": ServerEnvironment.BROKER_PAYLOAD_DIR.from_environment(os.environ)
        or str(Path(__file__).resolve().parent.parent / "payloads"),
    }
    values.update(overrides)
    return EtlConfig(**values)


def moment(text: str) -> datetime:
    """An ISO 8601 date or time; UTC when it names no zone."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an ISO 8601 time: {text!r}") from None
    return value if value.tzinfo else value.replace(tzinfo=UTC)
