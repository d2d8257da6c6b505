"""The `archive` job: finished messages older than the retention, with their jobs and attempts, to
Parquet in verified batches, then deleted from PostgreSQL (docs/spark_etl.md, "archive").
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from spark_etl import io, store, tables
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
    spark: SparkSession
    config: EtlConfig
    conn: store.Connection
    payloads: PayloadFiles
    checkpoint: Checkpoint = _no_checkpoint
    result: ArchiveResult = field(default_factory=ArchiveResult)
    partitioned: bool = False  # the jobs table is partitioned by time: set by `run`

    def staging(self, key: str, table: str) -> str:
        return f"{self.config.archive_path}/_staging/{key}/{table}"

    def published(self, key: str, table: str) -> str:
        return f"{self.config.archive_path}/{table}/batch={key}"

    def run(self, cutoff: datetime, since: datetime | None) -> ArchiveResult:
        # First whatever a crashed run left half done, from the step where it stopped.
        for partition in store.unfinished_partitions(self.conn):
            self.finish_partition(partition)
        for batch in store.unfinished_batches(self.conn):
            self.finish(batch)
        self.partitioned = store.is_partitioned(self.conn, tables.JOB)
        if self.partitioned:
            self.archive_job_partitions(cutoff, since)
        # Then messages, with their jobs; on partitioned tables, those whose jobs went with their
        # partitions, or never had one, or have them in the DEFAULT partition only.
        after = 0
        while planned := self.plan(cutoff, since, after):
            after = max(planned.message_ids)
            self.finish(planned)
        if self.partitioned:
            self.archive_attempt_partitions(cutoff)
        return self.result

    def plan(self, cutoff: datetime, since: datetime | None, after: int) -> store.Batch | None:
        rows = store.eligible_messages(
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
        self.stage(batch.key, self.read_batch(batch))
        self.checkpoint("staged")
        expected = {"messages": batch.messages, "jobs": batch.jobs, "attempts": batch.attempts}
        self.verify(batch.key, expected)
        if store.changed_since_planned(self.conn, batch):
            # Rows changed after the plan; these messages are planned again by a later run.
            self.remove_staging(batch.key)
            store.set_state(self.conn, batch, store.ABANDONED)
            self.result.abandoned += 1
            return False
        store.set_state(self.conn, batch, store.WRITTEN)
        self.checkpoint("written")
        return True

    def read_batch(self, batch: store.Batch) -> dict[str, DataFrame]:
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
        self, batch: store.Batch, sql: str, partition_column: str = "message_id"
    ) -> DataFrame:
        """Rows of the batch's messages, read in partitions over the batch's message ID range."""
        return io.read_query(
            self.spark, self.config, sql, partition_column=partition_column, bounds=batch.bounds
        )

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

    def stage(self, key: str, frames: dict[str, DataFrame]) -> None:
        for table, frame in frames.items():
            io.write_parquet(frame, self.staging(key, table), ["channel", "date"], "overwrite")

    def verify(self, key: str, expected: dict[str, int]) -> None:
        """Each staged table holds the expected number of rows, each with an id of its own."""
        for table, count in expected.items():
            try:
                written = self.spark.read.parquet(self.staging(key, table))
            except AnalysisException:  # no file at all: Spark writes none for an empty frame
                if count == 0 and io.exists(self.spark, self.staging(key, table)):
                    continue
                raise
            found = written.agg(
                F.count(F.lit(1)).alias("rows"), F.count_distinct("id").alias("ids")
            ).first()
            assert found is not None  # noqa: S101 (an aggregate has a row)
            if found["rows"] != count or found["ids"] != count:
                raise ArchiveMismatch(
                    f"batch {key}: {table} has {found['rows']} rows"
                    f" ({found['ids']} ids) in Parquet, {count} planned"
                )

    def publish(self, batch: store.Batch) -> None:
        self.publish_tables(batch.key, ARCHIVE_TABLES)
        store.set_state(self.conn, batch, store.PUBLISHED)
        self.checkpoint("published")

    def publish_tables(self, key: str, names: tuple[str, ...]) -> None:
        """Move each table's staging directory into the archive: one rename each. A re-run skips
        the tables a crashed run had moved already."""
        for table in names:
            target = self.published(key, table)
            if io.exists(self.spark, target):
                continue
            io.rename(self.spark, self.staging(key, table), target)
            self.checkpoint(f"published {table}")

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
        self.remove_staging(batch.key)
        store.set_state(self.conn, batch, store.DONE)
        self.checkpoint("done")

    def remove_staging(self, key: str) -> None:
        io.delete(self.spark, f"{self.config.archive_path}/_staging/{key}")

    # --- whole partitions (store.py, "the archive by time partition") --------------------------

    def archive_job_partitions(self, cutoff: datetime, since: datetime | None) -> None:
        """Each partition of jobs wholly before `cutoff` (and from `since` on) whose every job is
        finished. One with unfinished jobs waits: housekeeping carries its queued jobs forward
        within the hour, and an in-flight job finishes."""
        for partition in store.ranged_partitions(self.conn, tables.JOB):
            too_old = since is not None and (partition.start is None or partition.start < since)
            ready = partition.end <= cutoff and not too_old
            if ready and store.detach(self.conn, partition, unfinished_jobs=True):
                self.finish_partition(partition)

    def archive_attempt_partitions(self, cutoff: datetime) -> None:
        """Each partition of attempts wholly before `cutoff`, once every partition of jobs that
        starts before its end is archived: the attempts of archived jobs went to Parquet with
        them, and those of the jobs still here (carried forward) go now, with this partition."""
        jobs = store.ranged_partitions(self.conn, tables.JOB)
        if any(partition.start is None for partition in jobs):
            return  # the initial partition holds jobs of any age
        oldest_jobs = min(
            (partition.start for partition in jobs if partition.start), default=cutoff
        )
        for partition in store.ranged_partitions(self.conn, tables.ATTEMPT):
            ready = partition.end <= min(cutoff, oldest_jobs)
            if ready and store.detach(self.conn, partition, unfinished_jobs=False):
                self.finish_partition(partition)

    def finish_partition(self, partition: store.Partition) -> None:
        """Write a detached partition to Parquet, check it, publish it, drop it: each step once,
        a re-run going on from the step a crash stopped at."""
        logger.info(
            "archive: partition %s (%s rows) from %s",
            partition.name,
            partition.rows,
            partition.state,
        )
        key = partition.name
        if partition.state == store.DETACHED:
            frames, expected = self.read_partition(partition)
            self.stage(key, frames)
            self.checkpoint("partition staged")
            self.verify(key, expected)
            store.set_partition_state(self.conn, partition, store.WRITTEN)
            self.checkpoint("partition written")
        if partition.state == store.WRITTEN:
            self.publish_tables(key, self.partition_tables(partition))
            store.set_partition_state(self.conn, partition, store.PUBLISHED)
            self.checkpoint("partition published")
        if partition.state == store.PUBLISHED:
            attempts_default = (
                f"{tables.ATTEMPT}_default" if partition.parent == tables.JOB else None
            )
            store.drop_detached(self.conn, partition, attempts_default)
            self.remove_staging(key)
            self.result.partitions.append(partition.name)
            self.result.partition_rows += partition.rows
            self.checkpoint("partition dropped")

    def read_partition(
        self, partition: store.Partition
    ) -> tuple[dict[str, DataFrame], dict[str, int]]:
        """The Parquet frames of a detached partition, with the rows each must have. A partition
        of jobs: its jobs, and every attempt of theirs still here. A partition of attempts: those
        of jobs still here (the others went with their jobs)."""
        placed = "m.channel_id AS channel, (m.received_at AT TIME ZONE 'UTC')::date AS date"
        detached = f'"{partition.name}"'
        bounds = store.id_bounds(self.conn, partition.name, "id")
        if partition.parent == tables.ATTEMPT:
            attempts = (
                f"SELECT a.*, j.message_id, {placed} FROM {detached} a"  # noqa: S608
                f" JOIN {tables.JOB} j ON j.id = a.job_id"
                f" JOIN {tables.MESSAGE} m ON m.id = j.message_id"
            )
            return self.partition_frames({"attempts": (attempts, "id")}, bounds)
        jobs = (
            f"SELECT j.*, {placed} FROM {detached} j"  # noqa: S608
            f" JOIN {tables.MESSAGE} m ON m.id = j.message_id"
        )
        # A job's attempts start after it was created (by another host's clock: the allowance),
        # so the attempt partitions before the oldest job's creation are not read.
        attempts = (
            f"SELECT a.*, j.message_id, {placed} FROM {tables.ATTEMPT} a"  # noqa: S608
            f" JOIN {detached} j ON j.id = a.job_id"
            f" JOIN {tables.MESSAGE} m ON m.id = j.message_id"
            f" WHERE a.started_at >= {store.attempts_since(self.conn, partition.name)}"
        )
        return self.partition_frames(
            {"jobs": (jobs, "id"), "attempts": (attempts, "job_id")}, bounds
        )

    def partition_frames(
        self, queries: dict[str, tuple[str, str]], bounds: tuple[int, int] | None
    ) -> tuple[dict[str, DataFrame], dict[str, int]]:
        frames = {
            table: io.read_query(
                self.spark, self.config, query, partition_column=column, bounds=bounds
            )
            for table, (query, column) in queries.items()
        }
        expected = {
            table: store.count_rows(self.conn, query) for table, (query, _) in queries.items()
        }
        return frames, expected

    @staticmethod
    def partition_tables(partition: store.Partition) -> tuple[str, ...]:
        return ("attempts", "jobs") if partition.parent == tables.JOB else ("attempts",)


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
    all DELIVERED or DEAD, with their jobs and attempts, then delete them from PostgreSQL. On the
    partitioned tables, jobs and attempts go by whole partitions first (`Archiver.run`)."""
    if until is None:
        if not config.retention_days:
            return ArchiveResult()  # retention 0 keeps everything
        until = (now or datetime.now(UTC)) - timedelta(days=config.retention_days)
    with store.connect(config) as conn:
        store.ensure_tables(conn)
        if not store.try_archive_lock(conn):
            raise ArchiveBusy("another archive run is in progress")
        store.register_archive(conn, until)
        archiver = Archiver(
            spark, config, conn, payloads or PayloadFiles(config.payload_dir), checkpoint
        )
        return archiver.run(until, since)
