"""The archive's Parquet: each batch or partition of the archive written to a staging directory of
its own, checked against the rows planned, then published into the archive, one rename per table.
A re-run after a crash finds the same directories (named by the manifest's key) and goes on."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from pyspark.errors import AnalysisException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F  # noqa: N812

from spark_etl import io
from spark_etl.config import EtlConfig

Checkpoint = Callable[[str], None]


def no_checkpoint(step: str) -> None:
    """Where a step ends; tests pass a function that crashes the run there."""


class ArchiveMismatch(RuntimeError):
    """What was written is not what was planned."""


@dataclass
class ParquetStaging:
    spark: SparkSession
    config: EtlConfig
    checkpoint: Checkpoint = no_checkpoint

    def staging(self, key: str, table: str) -> str:
        return f"{self.config.archive_path}/_staging/{key}/{table}"

    def published(self, key: str, table: str) -> str:
        return f"{self.config.archive_path}/{table}/batch={key}"

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

    def publish_tables(self, key: str, names: tuple[str, ...]) -> None:
        """Move each table's staging directory into the archive: one rename each. A re-run skips
        the tables a crashed run had moved already."""
        for table in names:
            target = self.published(key, table)
            if io.exists(self.spark, target):
                continue
            io.rename(self.spark, self.staging(key, table), target)
            self.checkpoint(f"published {table}")

    def remove(self, key: str) -> None:
        io.delete(self.spark, f"{self.config.archive_path}/_staging/{key}")
