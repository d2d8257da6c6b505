"""Spark's side of the I/O: the session, JDBC reads and writes, Parquet, and the filesystem.

Reads go through JDBC with the query's time window or id list pushed down into PostgreSQL, and
are split into `read_partitions` slices of a numeric key so several executors read at once.
Filesystem operations use Hadoop's FileSystem API, so the same code works on a local directory,
HDFS or an object store.
"""

from __future__ import annotations

import os
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import DataFrame, SparkSession

from spark_etl.config import EtlConfig

APP_NAME = "webhook-broker spark_etl"


def build_session(config: EtlConfig) -> SparkSession:
    """A SparkSession for the pipeline, or the one already running in this process.

    Under spark-submit the master and jars come from its command line; run directly, the master is
    `config.master` or local[*], and the JDBC driver is Debian's jar.
    """
    builder = SparkSession.builder.appName(APP_NAME)
    submitted = "PYSPARK_GATEWAY_PORT" in os.environ  # spark-submit started this driver
    if config.master:
        builder = builder.master(config.master)
    elif not submitted:
        builder = builder.master("local[*]")
    if Path(config.jdbc_jar).exists():
        builder = builder.config("spark.jars", config.jdbc_jar)
    builder = (
        builder.config("spark.sql.session.timeZone", "UTC")  # report buckets are UTC days/hours
        .config("spark.sql.sources.partitionOverwriteMode", "dynamic")
        .config("spark.ui.showConsoleProgress", "false")
    )
    if (config.master or "local").startswith("local") and not submitted:
        # Spark's default of 200 shuffle partitions is made for clusters: on one machine the
        # report's dozen shuffles would each run 200 tiny tasks.
        builder = builder.config("spark.sql.shuffle.partitions", "8")
    for key, value in config.spark_conf.items():
        builder = builder.config(key, value)
    return builder.getOrCreate()


def sql_time(moment: datetime) -> str:
    """A timestamptz literal for a pushed-down window (our own datetimes, never user text)."""
    return f"'{moment.isoformat()}'::timestamptz"


def read_query(
    spark: SparkSession,
    config: EtlConfig,
    query: str,
    *,
    partition_column: str | None = None,
    bounds: tuple[int, int] | None = None,
) -> DataFrame:
    """The rows of `query`, read in `read_partitions` slices of `partition_column` between the
    inclusive `bounds` (one slice when there are no bounds)."""
    reader = (
        spark.read.format("jdbc")
        .option("url", config.database.jdbc_url)
        .option("dbtable", f"({query}) AS source")
        .option("fetchsize", str(config.fetch_size))
    )
    for key, value in config.database.jdbc_properties().items():
        reader = reader.option(key, value)
    if partition_column and bounds and bounds[1] > bounds[0] and config.read_partitions > 1:
        reader = (
            reader.option("partitionColumn", partition_column)
            .option("lowerBound", str(bounds[0]))
            .option("upperBound", str(bounds[1] + 1))
            .option("numPartitions", str(config.read_partitions))
        )
    return reader.load()


def write_table(frame: DataFrame, config: EtlConfig, table: str) -> None:
    """Replace the content of `table` (created when missing) with `frame`."""
    writer = (
        frame.write.format("jdbc")
        .mode("overwrite")
        .option("url", config.database.jdbc_url)
        .option("dbtable", table)
        .option("truncate", "true")  # keep the table (and its grants) between runs
        .option("batchsize", "5000")
    )
    for key, value in config.database.jdbc_properties().items():
        writer = writer.option(key, value)
    writer.save()


def write_parquet(frame: DataFrame, path: str, partition_by: list[str], mode: str) -> None:
    frame.write.mode(mode).partitionBy(*partition_by).parquet(path)


# --- the filesystem, through Hadoop -----------------------------------------------------------


def _filesystem(spark: SparkSession, path: str) -> tuple[Any, Any]:
    jvm: Any = spark._jvm
    hadoop_path = jvm.org.apache.hadoop.fs.Path(path)
    conf = spark._jsc.hadoopConfiguration()  # py4j's gateway is how PySpark reaches Hadoop
    return hadoop_path.getFileSystem(conf), hadoop_path


def exists(spark: SparkSession, path: str) -> bool:
    fs, hadoop_path = _filesystem(spark, path)
    return bool(fs.exists(hadoop_path))


def delete(spark: SparkSession, path: str) -> None:
    """Delete a file or a directory tree; nothing when it is not there."""
    fs, hadoop_path = _filesystem(spark, path)
    fs.delete(hadoop_path, True)


def rename(spark: SparkSession, source: str, target: str) -> None:
    """Move `source` to `target` (one atomic rename of a directory on a local filesystem and on
    HDFS), creating the target's parent first."""
    fs, source_path = _filesystem(spark, source)
    _, target_path = _filesystem(spark, target)
    fs.mkdirs(target_path.getParent())
    if not fs.rename(source_path, target_path):
        raise OSError(f"could not rename {source} to {target}")
