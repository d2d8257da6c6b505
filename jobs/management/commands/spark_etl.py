"""`manage.py spark_etl report|archive`: the Spark pipeline (spark_etl/) against this project's
database, with its retention setting and its payload storage.

The package itself knows nothing of Django; this wrapper only translates the settings.
"""

from __future__ import annotations

from argparse import ArgumentTypeError
from datetime import datetime
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser
from django.db import connection

from broker import payloads
from broker.conf import broker_settings
from spark_etl import MISSING_PYSPARK, pyspark_installed


def _moment(text: str) -> datetime:
    from spark_etl.config import moment

    try:
        return moment(text)
    except ArgumentTypeError as error:
        raise CommandError(str(error)) from None


def _read_payload(name: str) -> bytes | None:
    try:
        return payloads.read(name)
    except payloads.PayloadMissing:
        return None


class Command(BaseCommand):
    help = "Run the spark_etl pipeline: `report` (delivery analytics) or `archive` (to Parquet)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("job", choices=["report", "archive"])
        parser.add_argument("--since", type=_moment)
        parser.add_argument("--until", type=_moment)
        parser.add_argument("--master", help="Spark master URL (default: local[*])")
        parser.add_argument("--output", help="Parquet root (default: SPARK_ETL_OUTPUT)")

    def handle(self, *args: Any, **options: Any) -> None:
        if not pyspark_installed():
            raise CommandError(MISSING_PYSPARK)
        database = database_of_settings()

        from spark_etl import config as etl_config
        from spark_etl import io, pipeline

        config = etl_config.from_environment(
            database=database,
            retention_days=broker_settings.BROKER_RETENTION_DAYS,
            **{key: options[key] for key in ("master", "output") if options[key]},
        )
        owns_session = _active_session() is None
        spark = io.build_session(config)
        try:
            result: object
            if options["job"] == "report":
                result = pipeline.run_report(
                    spark, config, since=options["since"], until=options["until"]
                )
            else:
                files = pipeline.PayloadFiles(read=_read_payload, delete=payloads.delete)
                result = pipeline.run_archive(
                    spark, config, since=options["since"], until=options["until"], payloads=files
                )
        finally:
            if owns_session:  # a session this process already ran (tests) is not ours to stop
                spark.stop()
        self.stdout.write(str(result))


def _active_session() -> object:
    from pyspark.sql import SparkSession

    return SparkSession.getActiveSession()


def database_of_settings() -> Any:
    from spark_etl.config import Database

    database = connection.settings_dict  # the test database's name, under tests
    return Database(
        host=database.get("HOST") or "127.0.0.1",
        port=int(database.get("PORT") or 5432),
        name=database["NAME"],
        user=database.get("USER") or "postgres",
        password=database.get("PASSWORD") or "",
    )
