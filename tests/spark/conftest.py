"""One SparkSession (local[2]) for the whole test run, and the pipeline's configuration for the
test database.

Spark tests need Java 17 and Debian's PostgreSQL JDBC driver; without one of them they skip,
naming what to install (tests/tools.py; a failure under BROKER_TESTS_REQUIRE_TOOLS=1). They use
transactional tests (committed rows) because Spark reads the database through JDBC connections of
its own.
"""

from __future__ import annotations

import logging
import os

import pytest
from django.db import connection

from spark_etl import tables
from spark_etl.config import Database, EtlConfig

# What a SparkSession of the tests needs (it loads the JDBC driver at its start).
needs_spark = pytest.mark.needs_tool("pyspark", "java", "jdbc-driver")
# Module-level marks of the Spark tests on small frames, with no database.
spark_only = [needs_spark]
# Module-level marks of the Spark tests against the test database.
spark_test = [*spark_only, pytest.mark.django_db(transaction=True)]


def test_database() -> Database:
    settings = connection.settings_dict
    return Database(
        host=settings["HOST"] or "127.0.0.1",
        port=int(settings["PORT"] or 5432),
        name=settings["NAME"],
        user=settings["USER"] or "postgres",
        password=settings["PASSWORD"] or "",
    )


SPARK_CONF = {
    "spark.sql.shuffle.partitions": "2",  # small data: a task per core and stage, not 200
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "1g",
}


@pytest.fixture(scope="session")
def spark():
    from spark_etl import io

    session = io.build_session(
        EtlConfig(database=Database("", 0, "", ""), master="local[2]", spark_conf=SPARK_CONF)
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
    # py4j logs from finalizers at interpreter exit, after pytest closed the streams.
    logging.getLogger("py4j").setLevel(logging.CRITICAL)


@pytest.fixture
def etl_config(tmp_path, spark):
    """The pipeline's configuration for this test's database, with fresh bookkeeping tables."""
    config = EtlConfig(
        database=test_database(),
        output=str(tmp_path / "spark-output"),
        master="local[2]",
        read_partitions=2,
        payload_dir=os.environ["BROKER_PAYLOAD_DIR"],
        spark_conf=SPARK_CONF,
    )
    # pytest-django empties Django's tables between tests, not the pipeline's own. Dropped after
    # the test too: the archive's registration would leave retention to it in later tests.
    drop_pipeline_tables()
    yield config
    drop_pipeline_tables()


def drop_pipeline_tables() -> None:
    with connection.cursor() as cursor:
        for table in (tables.WATERMARK, tables.ARCHIVE_BATCH, tables.ARCHIVE_PARTITION):
            cursor.execute(f"DROP TABLE IF EXISTS {table}")
