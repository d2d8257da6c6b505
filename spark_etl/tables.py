"""Every table spark_etl reads or writes, and what the archive's deletions must do to the rows
that refer to the rows it deletes: in this one place.

The package runs without Django, so it cannot ask the models; tests/spark/test_tables.py checks
this module against them: each name against the model's `_meta.db_table`, each reference against
the field's `on_delete`, and that every foreign key to an archived table is listed here.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

# --- the broker's tables (Django models) --------------------------------------------------------

MESSAGE = "broker_message"  # broker.Message
PERIODIC = "broker_periodicmessage"  # broker.PeriodicMessage
CONSUMER = "consumers_consumer"  # consumers.Consumer
JOB = "jobs_job"  # jobs.Job
ATTEMPT = "jobs_deliveryattempt"  # jobs.DeliveryAttempt
REPORT = "jobs_deliveryreport"  # jobs.DeliveryReport, EtlConfig.report_table's default

# --- the pipeline's own tables (store.py creates the first three; Spark the last) -------------

WATERMARK = "spark_etl_watermark"
ARCHIVE_BATCH = "spark_etl_archive_batch"
ARCHIVE_PARTITION = "spark_etl_archive_partition"
# The watermark row each archive run writes. Once it exists, the broker's housekeeping leaves the
# old time partitions of jobs and attempts to the archive (jobs/partitions/).
ARCHIVE_REGISTRATION = "archive"
REPORT_STAGING = "spark_etl_report_staging"

# --- the archive ---------------------------------------------------------------------------------

# The tables the archive copies to Parquet and then deletes from, each with its directory under
# the archive root, in the order a batch is published: messages last.
ARCHIVED: dict[str, str] = {ATTEMPT: "attempts", JOB: "jobs", MESSAGE: "messages"}


class OnDelete(Enum):  # named as Django names them
    CASCADE = "cascade"  # the referring rows are deleted too
    SET_NULL = "set null"  # the referring rows stay, their column set to NULL


@dataclass(frozen=True)
class Reference:
    """Rows of `table` whose `column` holds the id of a row being deleted."""

    table: str
    column: str
    on_delete: OnDelete


# For each archived table, the references to its rows and what a deletion does to them. The
# broker's foreign keys carry no ON DELETE in PostgreSQL (Django applies `on_delete` itself), so
# the archive, deleting in SQL, does it: batch_store.delete_archived follows this mapping.
ARCHIVE_DELETES: dict[str, tuple[Reference, ...]] = {
    MESSAGE: (
        # A job is the message's delivery to one consumer: archived and deleted with it.
        Reference(JOB, "message_id", OnDelete.CASCADE),
        # A schedule outlives the messages it published; it only forgets the last one.
        Reference(PERIODIC, "last_message_id", OnDelete.SET_NULL),
    ),
    JOB: (
        # Attempts are the job's history: archived and deleted with it.
        Reference(ATTEMPT, "job_id", OnDelete.CASCADE),
    ),
    ATTEMPT: (),  # nothing refers to an attempt
}
