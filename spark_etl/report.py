"""The `report` job: delivery analytics per channel, consumer and UTC hour and day, written as
Parquet and loaded into the dashboard's table (docs/spark_etl.md, "report").
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from spark_etl import io, store, tables, transforms
from spark_etl.config import EtlConfig

logger = logging.getLogger(__name__)


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def floor_day(moment: datetime) -> datetime:
    return floor_hour(moment).replace(hour=0)


@dataclass(frozen=True)
class ReportResult:
    since: datetime | None
    until: datetime
    rows: int

    def __str__(self) -> str:
        start = self.since.isoformat() if self.since else "the beginning"
        return f"report: {self.rows} rows for {start} to {self.until.isoformat()}"


def report_window(
    conn: store.Connection,
    config: EtlConfig,
    since: datetime | None,
    until: datetime | None,
    now: datetime,
) -> tuple[datetime | None, datetime]:
    """[since, until) to recompute: whole hours up to now; from the start of the day that was
    `settle_hours` before the last run's end (or from the beginning on the first run)."""
    end = floor_hour(until or now)
    if since is None:
        mark = store.watermark(conn, "report")
        if mark is None:
            return None, end
        since = mark - timedelta(hours=config.settle_hours)
    return floor_day(min(since, end)), end


def read_report_inputs(
    spark: SparkSession, config: EtlConfig, since: datetime | None, until: datetime
) -> tuple[DataFrame, DataFrame, DataFrame, DataFrame] | None:
    """messages, jobs, attempts, consumers of the window; None when it holds no message."""
    with store.connect(config) as conn:
        messages_range = store.message_bounds(conn, since, until)
        jobs_range = store.job_bounds(conn, messages_range) if messages_range else None
    if messages_range is None:
        return None
    window = f"received_at < {io.sql_time(until)}"
    if since is not None:
        window += f" AND received_at >= {io.sql_time(since)}"
    lo, hi = messages_range
    messages = io.read_query(
        spark,
        config,
        f"SELECT id, channel_id, received_at, scheduled_for FROM {tables.MESSAGE}"  # noqa: S608
        f" WHERE {window} AND id BETWEEN {lo} AND {hi}",
        partition_column="id",
        bounds=messages_range,
    )
    jobs = io.read_query(
        spark,
        config,
        f"SELECT id, message_id, consumer_id, status, attempts, status_changed_at FROM {tables.JOB}"  # noqa: S608
        f" WHERE message_id BETWEEN {lo} AND {hi}",
        partition_column="message_id",
        bounds=messages_range,
    )
    attempt_filter = (
        f"job_id BETWEEN {jobs_range[0]} AND {jobs_range[1]}" if jobs_range else "false"
    )
    attempts = io.read_query(
        spark,
        config,
        f"SELECT id, job_id, started_at, status_code, error_class FROM {tables.ATTEMPT}"  # noqa: S608
        f" WHERE {attempt_filter}",
        partition_column="job_id",
        bounds=jobs_range,
    )
    consumers = io.read_query(spark, config, f"SELECT id, public_id FROM {tables.CONSUMER}")  # noqa: S608
    return messages, jobs, attempts, consumers


def run_report(
    spark: SparkSession,
    config: EtlConfig,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
) -> ReportResult:
    """Recompute the report for a window: Parquet (partitioned by grain and date) and the
    dashboard's table, then move the watermark."""
    with store.connect(config) as conn:
        store.ensure_tables(conn)
        since, until = report_window(conn, config, since, until, now or datetime.now(UTC))
    logger.info("report: reading messages received from %s to %s", since, until)
    inputs = read_report_inputs(spark, config, since, until)
    if inputs is None:
        report = spark.createDataFrame([], EMPTY_REPORT_SCHEMA)
    else:
        messages, jobs, attempts, consumers = inputs
        # Both grains aggregate the same facts: read PostgreSQL once.
        facts = transforms.job_facts(messages, jobs, attempts, consumers).persist()
        failed = attempts.where(~transforms.is_success(F.col("status_code"))).persist()
        report = transforms.delivery_report(facts, failed).persist()
    started = time.monotonic()
    rows = report.count()
    logger.info("report: %s rows computed in %.1f s", rows, time.monotonic() - started)
    if rows:
        io.write_parquet(
            # One file per grain and date, not one per task and date.
            report.withColumn("date", F.to_date("period_start")).repartition("grain", "date"),
            config.report_path,
            ["grain", "date"],
            mode="overwrite",  # dynamic: only the dates recomputed are replaced
        )
    logger.info("report: Parquet written at %.1f s", time.monotonic() - started)
    io.write_table(report.coalesce(2), config, tables.REPORT_STAGING)  # two JDBC connections
    logger.info("report: staging table written at %.1f s", time.monotonic() - started)
    with store.connect(config) as conn:
        store.replace_report(
            conn,
            config.report_table,
            tables.REPORT_STAGING,
            since,
            until,
            transforms.REPORT_COLUMNS,
        )
    spark.catalog.clearCache()
    return ReportResult(since, until, rows)


EMPTY_REPORT_SCHEMA = (
    "grain string, period_start timestamp, channel_id string, consumer_id string,"
    " messages long, jobs long, delivered long, dead long, success_rate double,"
    " first_attempt_success_rate double, mean_attempts double, latency_p50_ms double,"
    " latency_p95_ms double, latency_p99_ms double, top_failures string"
)
