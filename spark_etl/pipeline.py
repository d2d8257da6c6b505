"""The two jobs (docs/spark_etl.md), what `__main__` and the manage.py wrapper call:
`run_report` (delivery analytics, report.py) and `run_archive` (Parquet, then delete; archive.py).

Both take a SparkSession and an EtlConfig; `__main__` and the manage.py wrapper build those.
"""

from __future__ import annotations

from spark_etl.archive import ArchiveBusy, ArchiveResult, PayloadFiles, run_archive
from spark_etl.parquet_staging import ArchiveMismatch
from spark_etl.report import ReportResult, run_report

__all__ = [
    "ArchiveBusy",
    "ArchiveMismatch",
    "ArchiveResult",
    "PayloadFiles",
    "ReportResult",
    "run_archive",
    "run_report",
]
