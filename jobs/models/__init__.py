"""The jobs app's models (docs/data-model.md): jobs (one per message and consumer), the record of
every push attempt, what monitoring reads, and dead-letter actions. Every caller and migration
imports them from here (`from jobs.models import Job`)."""

from jobs.models.attempt import (
    CLOCK_ALLOWANCE,
    DeliveryAttempt,
    attempts_of_outer_job,
    delete_jobs,
    with_last_attempt,
)
from jobs.models.dead_letter import DeadLetterAction

# requeue_changes: what a requeue writes, which jobs/queue/dead_jobs.py's batches write too.
from jobs.models.job import Job, JobQuerySet, job_public_id, named_by, requeue_changes
from jobs.models.monitoring import (
    DeliveryReport,
    DeliveryStats,
    DispatcherHeartbeat,
    JobStatusSummary,
)

__all__ = [
    "CLOCK_ALLOWANCE",
    "DeadLetterAction",
    "DeliveryAttempt",
    "DeliveryReport",
    "DeliveryStats",
    "DispatcherHeartbeat",
    "Job",
    "JobQuerySet",
    "JobStatusSummary",
    "attempts_of_outer_job",
    "delete_jobs",
    "job_public_id",
    "named_by",
    "requeue_changes",
    "with_last_attempt",
]
