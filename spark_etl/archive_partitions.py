"""The archive by whole time partitions (partition_store.py says how): partitions of jobs past the
cutoff, then partitions of attempts, each detached, written to Parquet, checked, published and
dropped, one step at a time, a re-run going on from the step a crash stopped at."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime

from pyspark.sql import DataFrame, SparkSession

from spark_etl import batch_store, io, partition_store, tables
from spark_etl.config import EtlConfig
from spark_etl.parquet_staging import ParquetStaging
from spark_etl.store import Connection

logger = logging.getLogger("spark_etl.archive")


@dataclass
class PartitionArchiver:
    spark: SparkSession
    config: EtlConfig
    conn: Connection
    parquet: ParquetStaging
    dropped: list[str] = field(default_factory=list)  # the partitions archived and dropped
    rows: int = 0  # the jobs and attempts archived with them

    def archive_jobs(self, cutoff: datetime, since: datetime | None) -> None:
        """Each partition of jobs wholly before `cutoff` (and from `since` on) whose every job is
        finished. One with unfinished jobs waits: housekeeping carries its queued jobs forward
        within the hour, and an in-flight job finishes."""
        for partition in partition_store.ranged_partitions(self.conn, tables.JOB):
            too_old = since is not None and (partition.start is None or partition.start < since)
            ready = partition.end <= cutoff and not too_old
            if ready and partition_store.detach(self.conn, partition, unfinished_jobs=True):
                self.finish(partition)

    def archive_attempts(self, cutoff: datetime) -> None:
        """Each partition of attempts wholly before `cutoff`, once every partition of jobs that
        starts before its end is archived: the attempts of archived jobs went to Parquet with
        them, and those of the jobs still here (carried forward) go now, with this partition."""
        jobs = partition_store.ranged_partitions(self.conn, tables.JOB)
        if any(partition.start is None for partition in jobs):
            return  # the initial partition holds jobs of any age
        oldest_jobs = min(
            (partition.start for partition in jobs if partition.start), default=cutoff
        )
        for partition in partition_store.ranged_partitions(self.conn, tables.ATTEMPT):
            ready = partition.end <= min(cutoff, oldest_jobs)
            if ready and partition_store.detach(self.conn, partition, unfinished_jobs=False):
                self.finish(partition)

    def finish(self, partition: partition_store.Partition) -> None:
        """Write a detached partition to Parquet, check it, publish it, drop it: each step once,
        a re-run going on from the step a crash stopped at."""
        logger.info(
            "archive: partition %s (%s rows) from %s",
            partition.name,
            partition.rows,
            partition.state,
        )
        key = partition.name
        if partition.state == partition_store.DETACHED:
            frames, expected = self.read(partition)
            self.parquet.stage(key, frames)
            self.parquet.checkpoint("partition staged")
            self.parquet.verify(key, expected)
            partition_store.set_partition_state(self.conn, partition, batch_store.WRITTEN)
            self.parquet.checkpoint("partition written")
        if partition.state == batch_store.WRITTEN:
            self.parquet.publish_tables(key, self.published_tables(partition))
            partition_store.set_partition_state(self.conn, partition, batch_store.PUBLISHED)
            self.parquet.checkpoint("partition published")
        if partition.state == batch_store.PUBLISHED:
            attempts_default = (
                f"{tables.ATTEMPT}_default" if partition.parent == tables.JOB else None
            )
            partition_store.drop_detached(self.conn, partition, attempts_default)
            self.parquet.remove(key)
            self.dropped.append(partition.name)
            self.rows += partition.rows
            self.parquet.checkpoint("partition dropped")

    def read(
        self, partition: partition_store.Partition
    ) -> tuple[dict[str, DataFrame], dict[str, int]]:
        """The Parquet frames of a detached partition, with the rows each must have. A partition
        of jobs: its jobs, and every attempt of theirs still here. A partition of attempts: those
        of jobs still here (the others went with their jobs)."""
        placed = "m.channel_id AS channel, (m.received_at AT TIME ZONE 'UTC')::date AS date"
        detached = f'"{partition.name}"'
        bounds = partition_store.id_bounds(self.conn, partition.name, "id")
        if partition.parent == tables.ATTEMPT:
            attempts = (
                f"SELECT a.*, j.message_id, {placed} FROM {detached} a"  # noqa: S608
                f" JOIN {tables.JOB} j ON j.id = a.job_id"
                f" JOIN {tables.MESSAGE} m ON m.id = j.message_id"
            )
            return self.frames({"attempts": (attempts, "id")}, bounds)
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
            f" WHERE a.started_at >= {partition_store.attempts_since(self.conn, partition.name)}"
        )
        return self.frames({"jobs": (jobs, "id"), "attempts": (attempts, "job_id")}, bounds)

    def frames(
        self, queries: dict[str, tuple[str, str]], bounds: tuple[int, int] | None
    ) -> tuple[dict[str, DataFrame], dict[str, int]]:
        frames = {
            table: io.read_query(
                self.spark, self.config, query, partition_column=column, bounds=bounds
            )
            for table, (query, column) in queries.items()
        }
        expected = {
            table: partition_store.count_rows(self.conn, query)
            for table, (query, _) in queries.items()
        }
        return frames, expected

    @staticmethod
    def published_tables(partition: partition_store.Partition) -> tuple[str, ...]:
        return ("attempts", "jobs") if partition.parent == tables.JOB else ("attempts",)
