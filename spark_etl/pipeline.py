"""The two jobs: `report` (delivery analytics) and `archive` (Parquet, then delete),
docs/spark_etl.md.

Both take a SparkSession and an EtlConfig; `__main__` and the manage.py wrapper build those.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from spark_etl import io, store, tables, transforms
from spark_etl.config import EtlConfig

logger = logging.getLogger(__name__)

ARCHIVE_TABLES = tuple(tables.ARCHIVED.values())  # published in this order, messages last
# The offloaded payloads one archive batch may hold in the driver's memory at once.
MAX_OFFLOADED_BYTES_PER_BATCH = 256 * 1024 * 1024

Checkpoint = Callable[[str], None]
ReadPayload = Callable[[str], bytes | None]
DeletePayload = Callable[[str], None]


def _no_checkpoint(step: str) -> None:
    """Where a step ends; tests pass a function that crashes the run there."""


def utc_now() -> datetime:
    return datetime.now(UTC)


def floor_hour(moment: datetime) -> datetime:
    return moment.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def floor_day(moment: datetime) -> datetime:
    return floor_hour(moment).replace(hour=0)


# --- report ---------------------------------------------------------------------------------


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
        since, until = report_window(conn, config, since, until, now or utc_now())
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


# --- archive --------------------------------------------------------------------------------


class ArchiveBusy(RuntimeError):
    """Another archive run holds the lock."""


class ArchiveMismatch(RuntimeError):
    """What was written is not what was planned."""


@dataclass
class ArchiveResult:
    batches: int = 0
    messages: int = 0  # deleted from PostgreSQL after being archived
    kept: list[int] = field(default_factory=list)  # archived but kept (a job changed meanwhile)
    abandoned: int = 0

    def __str__(self) -> str:
        return (
            f"archive: {self.messages} messages archived and deleted in {self.batches} batches"
            f" ({len(self.kept)} kept, {self.abandoned} batches abandoned)"
        )


@dataclass
class PayloadFiles:
    """Reads and deletes offloaded payloads. Without Django: files in `directory` (the default
    filesystem storage); the manage.py wrapper passes Django's storage functions instead."""

    directory: str | None = None
    read: ReadPayload | None = None
    delete: DeletePayload | None = None

    def read_bytes(self, name: str) -> bytes | None:
        if self.read is not None:
            return self.read(name)
        try:
            return (Path(self.directory or ".") / name).read_bytes()
        except FileNotFoundError:
            return None  # archived with its name and no content, as the broker would deliver it

    def remove(self, name: str) -> None:
        if self.delete is not None:
            self.delete(name)
        else:
            (Path(self.directory or ".") / name).unlink(missing_ok=True)


@dataclass
class Archiver:
    spark: SparkSession
    config: EtlConfig
    conn: store.Connection
    payloads: PayloadFiles
    checkpoint: Checkpoint = _no_checkpoint
    result: ArchiveResult = field(default_factory=ArchiveResult)

    def staging(self, batch: store.Batch, table: str) -> str:
        return f"{self.config.archive_path}/_staging/{batch.key}/{table}"

    def published(self, batch: store.Batch, table: str) -> str:
        return f"{self.config.archive_path}/{table}/batch={batch.key}"

    def run(self, cutoff: datetime, since: datetime | None) -> ArchiveResult:
        # First whatever a crashed run left half done, from the step where it stopped.
        for batch in store.unfinished_batches(self.conn):
            self.finish(batch)
        after = 0
        while planned := self.plan(cutoff, since, after):
            after = max(planned.message_ids)
            self.finish(planned)
        return self.result

    def plan(self, cutoff: datetime, since: datetime | None, after: int) -> store.Batch | None:
        rows = store.eligible_messages(self.conn, cutoff, since, after, self.config.archive_batch)
        if not rows:
            return None
        ids: list[int] = []
        files: list[str] = []
        offloaded = 0
        for message_id, payload_file, size in rows:
            if payload_file:
                if ids and offloaded + size > MAX_OFFLOADED_BYTES_PER_BATCH:
                    break  # the rest goes in the next batch
                offloaded += size
                files.append(payload_file)
            ids.append(message_id)
        batch = store.plan_batch(self.conn, cutoff, ids, files)
        self.checkpoint("planned")
        return batch

    def finish(self, batch: store.Batch) -> None:
        logger.info(
            "archive: batch %s (%s messages) from %s", batch.key, batch.messages, batch.state
        )
        if batch.state == store.PLANNED and not self.write(batch):
            return
        if batch.state == store.WRITTEN:
            self.publish(batch)
        if batch.state == store.PUBLISHED:
            self.delete_rows(batch)
        if batch.state == store.DELETED:
            self.delete_payloads(batch)
        self.result.batches += 1

    def write(self, batch: store.Batch) -> bool:
        """Write the batch to its staging directory and check it against the manifest."""
        for table, frame in self.read_batch(batch).items():
            io.write_parquet(frame, self.staging(batch, table), ["channel", "date"], "overwrite")
        self.checkpoint("staged")
        self.verify(batch)
        if store.changed_since_planned(self.conn, batch):
            # Rows changed after the plan; these messages are planned again by a later run.
            io.delete(self.spark, f"{self.config.archive_path}/_staging/{batch.key}")
            store.set_state(self.conn, batch, store.ABANDONED)
            self.result.abandoned += 1
            return False
        store.set_state(self.conn, batch, store.WRITTEN)
        self.checkpoint("written")
        return True

    def read_batch(self, batch: store.Batch) -> dict[str, DataFrame]:
        in_batch = f"SELECT unnest(message_ids) FROM {tables.ARCHIVE_BATCH} WHERE id = {batch.id}"  # noqa: S608
        placed = "m.channel_id AS channel, (m.received_at AT TIME ZONE 'UTC')::date AS date"
        messages = io.read_query(
            self.spark,
            self.config,
            f"SELECT m.*, {placed} FROM {tables.MESSAGE} m WHERE m.id IN ({in_batch})",  # noqa: S608
            partition_column="id",
            bounds=batch.bounds,
        )
        jobs = io.read_query(
            self.spark,
            self.config,
            f"SELECT j.*, {placed} FROM {tables.JOB} j JOIN {tables.MESSAGE} m"  # noqa: S608
            f" ON m.id = j.message_id WHERE j.message_id IN ({in_batch})",
            partition_column="message_id",
            bounds=batch.bounds,
        )
        attempts = io.read_query(
            self.spark,
            self.config,
            f"SELECT a.*, j.message_id, {placed} FROM {tables.ATTEMPT} a"  # noqa: S608
            f" JOIN {tables.JOB} j ON j.id = a.job_id"
            f" JOIN {tables.MESSAGE} m ON m.id = j.message_id"
            f" WHERE j.message_id IN ({in_batch})",
            partition_column="message_id",
            bounds=batch.bounds,
        )
        return {
            "messages": self.with_offloaded_payloads(messages, batch),
            "jobs": jobs,
            "attempts": attempts,
        }

    def with_offloaded_payloads(self, messages: DataFrame, batch: store.Batch) -> DataFrame:
        """The archive keeps every payload: offloaded ones are read from storage into the row."""
        if not batch.payload_files:
            return messages
        stored = self.spark.createDataFrame(
            [(name, self.payloads.read_bytes(name)) for name in batch.payload_files],
            "payload_file string, stored_payload binary",
        )
        columns = [
            F.when(F.col("payload_file") != "", F.col("stored_payload"))
            .otherwise(F.col("payload"))
            .alias("payload")
            if name == "payload"
            else F.col(name)
            for name in messages.columns
        ]
        return messages.join(F.broadcast(stored), "payload_file", "left").select(*columns)

    def verify(self, batch: store.Batch) -> None:
        expected = {"messages": batch.messages, "jobs": batch.jobs, "attempts": batch.attempts}
        key = {"messages": "id", "jobs": "id", "attempts": "id"}
        for table, count in expected.items():
            try:
                written = self.spark.read.parquet(self.staging(batch, table))
            except AnalysisException:  # no file at all: Spark writes none for an empty frame
                if count == 0 and io.exists(self.spark, self.staging(batch, table)):
                    continue
                raise
            found = written.agg(
                F.count(F.lit(1)).alias("rows"), F.count_distinct(key[table]).alias("ids")
            ).first()
            assert found is not None  # noqa: S101 (an aggregate has a row)
            if found["rows"] != count or found["ids"] != count:
                raise ArchiveMismatch(
                    f"batch {batch.key}: {table} has {found['rows']} rows"
                    f" ({found['ids']} ids) in Parquet, {count} planned"
                )

    def publish(self, batch: store.Batch) -> None:
        """Move each table's staging directory into the archive: one rename each. A re-run skips
        the tables a crashed run had moved already."""
        for table in ARCHIVE_TABLES:
            target = self.published(batch, table)
            if io.exists(self.spark, target):
                continue
            io.rename(self.spark, self.staging(batch, table), target)
            self.checkpoint(f"published {table}")
        store.set_state(self.conn, batch, store.PUBLISHED)
        self.checkpoint("published")

    def delete_rows(self, batch: store.Batch) -> None:
        chunk = self.config.delete_chunk
        for start in range(0, len(batch.message_ids), chunk):
            deleted, kept = store.delete_archived(
                self.conn, batch, batch.message_ids[start : start + chunk]
            )
            self.result.messages += deleted
            self.result.kept.extend(kept)
            self.checkpoint("deleted chunk")
        store.set_state(self.conn, batch, store.DELETED)
        self.checkpoint("deleted")

    def delete_payloads(self, batch: store.Batch) -> None:
        # A file a message still names (one kept above) stays.
        rows = self.conn.execute(
            f"SELECT payload_file FROM {tables.MESSAGE} WHERE payload_file = ANY(%s)",  # noqa: S608
            [batch.payload_files],
        )
        still_named = {row[0] for row in rows}
        for name in batch.payload_files:
            if name not in still_named:
                self.payloads.remove(name)
        io.delete(self.spark, f"{self.config.archive_path}/_staging/{batch.key}")
        store.set_state(self.conn, batch, store.DONE)
        self.checkpoint("done")


def run_archive(
    spark: SparkSession,
    config: EtlConfig,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
    payloads: PayloadFiles | None = None,
    checkpoint: Checkpoint = _no_checkpoint,
) -> ArchiveResult:
    """Archive messages received before `until` (default: `retention_days` ago) whose jobs are
    all DELIVERED or DEAD, with their jobs and attempts, then delete them from PostgreSQL."""
    if until is None:
        if not config.retention_days:
            return ArchiveResult()  # retention 0 keeps everything
        until = (now or utc_now()) - timedelta(days=config.retention_days)
    with store.connect(config) as conn:
        store.ensure_tables(conn)
        if not store.try_archive_lock(conn):
            raise ArchiveBusy("another archive run is in progress")
        archiver = Archiver(
            spark, config, conn, payloads or PayloadFiles(config.payload_dir), checkpoint
        )
        return archiver.run(until, since)
