"""The `archive` job: finished messages older than the retention, with their jobs and attempts, to
Parquet in verified batches, then deleted from PostgreSQL (docs/spark_etl.md, "archive").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from spark_etl import batch_store, io, partition_store, store, tables
from spark_etl.archive_partitions import PartitionArchiver
from spark_etl.config import EtlConfig
from spark_etl.parquet_staging import Checkpoint, ParquetStaging, no_checkpoint

logger = logging.getLogger(__name__)

ARCHIVE_TABLES = tuple(tables.ARCHIVED.values())  # published in this order, messages last
# The offloaded payloads one archive batch may hold in the driver's memory at once.
MAX_OFFLOADED_BYTES_PER_BATCH = 256 * 1024 * 1024

ReadPayload = Callable[[str], bytes | None]
DeletePayload = Callable[[str], None]


class ArchiveBusy(RuntimeError):
    """Another archive run holds the lock."""


@dataclass
class ArchiveResult:
    batches: int = 0
    messages: int = 0  # deleted from PostgreSQL after being archived
    kept: list[int] = field(default_factory=list)  # archived but kept (a job changed meanwhile)
    abandoned: int = 0
    partitions: list[str] = field(default_factory=list)  # archived and dropped
    partition_rows: int = 0  # the jobs and attempts archived with them

    def __str__(self) -> str:
        return (
            f"archive: {self.messages} messages archived and deleted in {self.batches} batches"
            f" ({len(self.kept)} kept, {self.abandoned} batches abandoned);"
            f" {len(self.partitions)} partitions archived and dropped"
            f" ({self.partition_rows} jobs and attempts)"
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
    """The archive by batches of messages, with their jobs and attempts (batch_store.py), after
    whole time partitions where the tables are partitioned (archive_partitions.py)."""

    spark: SparkSession
    config: EtlConfig
    conn: store.Connection
    payloads: PayloadFiles
    parquet: ParquetStaging
    partitions: PartitionArchiver
    result: ArchiveResult = field(default_factory=ArchiveResult)
    partitioned: bool = False  # the jobs table is partitioned by time: set by `run`

    def run(self, cutoff: datetime, since: datetime | None) -> ArchiveResult:
        # First whatever a crashed run left half done, from the step where it stopped.
        for partition in partition_store.unfinished_partitions(self.conn):
            self.partitions.finish(partition)
        for batch in batch_store.unfinished_batches(self.conn):
            self.finish(batch)
        self.partitioned = partition_store.is_partitioned(self.conn, tables.JOB)
        if self.partitioned:
            self.partitions.archive_jobs(cutoff, since)
        # Then messages, with their jobs; on partitioned tables, those whose jobs went with their
        # partitions, or never had one, or have them in the DEFAULT partition only.
        after = 0
        while planned := self.plan(cutoff, since, after):
            after = max(planned.message_ids)
            self.finish(planned)
        if self.partitioned:
            self.partitions.archive_attempts(cutoff)
        self.result.partitions = self.partitions.dropped
        self.result.partition_rows = self.partitions.rows
        return self.result

    def plan(
        self, cutoff: datetime, since: datetime | None, after: int
    ) -> batch_store.Batch | None:
        rows = batch_store.eligible_messages(
            self.conn, cutoff, since, after, self.config.archive_batch, self.partitioned
        )
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
        batch = batch_store.plan_batch(self.conn, cutoff, ids, files)
        self.parquet.checkpoint("planned")
        return batch

    def finish(self, batch: batch_store.Batch) -> None:
        logger.info(
            "archive: batch %s (%s messages) from %s", batch.key, batch.messages, batch.state
        )
        if batch.state == batch_store.PLANNED and not self.write(batch):
            return
        if batch.state == batch_store.WRITTEN:
            self.publish(batch)
        if batch.state == batch_store.PUBLISHED:
            self.delete_rows(batch)
        if batch.state == batch_store.DELETED:
            self.delete_payloads(batch)
        self.result.batches += 1

    def write(self, batch: batch_store.Batch) -> bool:
        """Write the batch to its staging directory and check it against the manifest."""
        self.parquet.stage(batch.key, self.read_batch(batch))
        self.parquet.checkpoint("staged")
        expected = {"messages": batch.messages, "jobs": batch.jobs, "attempts": batch.attempts}
        self.parquet.verify(batch.key, expected)
        if batch_store.changed_since_planned(self.conn, batch):
            # Rows changed after the plan; these messages are planned again by a later run.
            self.parquet.remove(batch.key)
            batch_store.set_state(self.conn, batch, batch_store.ABANDONED)
            self.result.abandoned += 1
            return False
        batch_store.set_state(self.conn, batch, batch_store.WRITTEN)
        self.parquet.checkpoint("written")
        return True

    def read_batch(self, batch: batch_store.Batch) -> dict[str, DataFrame]:
        in_batch = f"SELECT unnest(message_ids) FROM {tables.ARCHIVE_BATCH} WHERE id = {batch.id}"  # noqa: S608
        placed = "m.channel_id AS channel, (m.received_at AT TIME ZONE 'UTC')::date AS date"
        messages = self.read_of_batch(
            batch,
            f"SELECT m.*, {placed} FROM {tables.MESSAGE} m WHERE m.id IN ({in_batch})",  # noqa: S608
            partition_column="id",
        )
        jobs = self.read_of_batch(
            batch,
            f"SELECT j.*, {placed} FROM {tables.JOB} j JOIN {tables.MESSAGE} m"  # noqa: S608
            f" ON m.id = j.message_id WHERE j.message_id IN ({in_batch})",
        )
        attempts = self.read_of_batch(
            batch,
            f"SELECT a.*, j.message_id, {placed} FROM {tables.ATTEMPT} a"  # noqa: S608
            f" JOIN {tables.JOB} j ON j.id = a.job_id"
            f" JOIN {tables.MESSAGE} m ON m.id = j.message_id"
            f" WHERE j.message_id IN ({in_batch})",
        )
        return {
            "messages": self.with_offloaded_payloads(messages, batch),
            "jobs": jobs,
            "attempts": attempts,
        }

    def read_of_batch(
        self, batch: batch_store.Batch, sql: str, partition_column: str = "message_id"
    ) -> DataFrame:
        """Rows of the batch's messages, read in partitions over the batch's message ID range."""
        return io.read_query(
            self.spark, self.config, sql, partition_column=partition_column, bounds=batch.bounds
        )

    def with_offloaded_payloads(self, messages: DataFrame, batch: batch_store.Batch) -> DataFrame:
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

    def publish(self, batch: batch_store.Batch) -> None:
        self.parquet.publish_tables(batch.key, ARCHIVE_TABLES)
        batch_store.set_state(self.conn, batch, batch_store.PUBLISHED)
        self.parquet.checkpoint("published")

    def delete_rows(self, batch: batch_store.Batch) -> None:
        chunk = self.config.delete_chunk
        for start in range(0, len(batch.message_ids), chunk):
            deleted, kept = batch_store.delete_archived(
                self.conn, batch, batch.message_ids[start : start + chunk]
            )
            self.result.messages += deleted
            self.result.kept.extend(kept)
            self.parquet.checkpoint("deleted chunk")
        batch_store.set_state(self.conn, batch, batch_store.DELETED)
        self.parquet.checkpoint("deleted")

    def delete_payloads(self, batch: batch_store.Batch) -> None:
        # A file a message still names (one kept above) stays.
        rows = self.conn.execute(
            f"SELECT payload_file FROM {tables.MESSAGE} WHERE payload_file = ANY(%s)",  # noqa: S608
            [batch.payload_files],
        )
        still_named = {row[0] for row in rows}
        for name in batch.payload_files:
            if name not in still_named:
                self.payloads.remove(name)
        self.parquet.remove(batch.key)
        batch_store.set_state(self.conn, batch, batch_store.DONE)
        self.parquet.checkpoint("done")


def run_archive(
    spark: SparkSession,
    config: EtlConfig,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    now: datetime | None = None,
    payloads: PayloadFiles | None = None,
    checkpoint: Checkpoint = no_checkpoint,
) -> ArchiveResult:
    """Archive messages received before `until` (default: `retention_days` ago) whose jobs are
    all DELIVERED or DEAD, with their jobs and attempts, then delete them from PostgreSQL. On the
    partitioned tables, jobs and attempts go by whole partitions first (`Archiver.run`)."""
    if until is None:
        if not config.retention_days:
            return ArchiveResult()  # retention 0 keeps everything
        until = (now or datetime.now(UTC)) - timedelta(days=config.retention_days)
    with store.connect(config) as conn, batch_store.archive_lock(conn) as locked:
        if not locked:
            raise ArchiveBusy("another archive run is in progress")
        store.ensure_tables(conn)
        batch_store.register_archive(conn, until)
        parquet = ParquetStaging(spark, config, checkpoint)
        archiver = Archiver(
            spark,
            config,
            conn,
            payloads or PayloadFiles(config.payload_dir),
            parquet,
            PartitionArchiver(spark, config, conn, parquet),
        )
        return archiver.run(until, since)
