"""The job state machine (docs/data-model.md): the one place that says which status changes are
allowed."""

from __future__ import annotations

from django.db import models


class JobStatus(models.TextChoices):
    QUEUED = "QUEUED"
    INFLIGHT = "INFLIGHT"
    DELIVERED = "DELIVERED"
    DEAD = "DEAD"


QUEUED, INFLIGHT, DELIVERED, DEAD = JobStatus
PENDING = (QUEUED, INFLIGHT)  # statuses of a job that is still on its way
PENDING_SQL = "(" + ", ".join(f"'{status.value}'" for status in PENDING) + ")"  # status IN ...

ALLOWED_TRANSITIONS: frozenset[tuple[JobStatus, JobStatus]] = frozenset(
    {
        (QUEUED, INFLIGHT),  # a dispatcher claims it, or a pull consumer takes it
        (INFLIGHT, DELIVERED),  # 2xx, or a pull consumer reports success
        (INFLIGHT, QUEUED),  # retryable failure with attempts left, or the lease expired
        (INFLIGHT, DEAD),  # attempts exhausted, non-retryable outcome, pull consumer gave up
        (QUEUED, DEAD),  # expired: undelivered past its age limit (jobs/queue/expiry.py)
        (DEAD, QUEUED),  # requeue from the dead-letter queue
        (DEAD, INFLIGHT),  # a pull consumer retries a dead job
        (DELIVERED, QUEUED),  # replay: deliver an already delivered message again
    }
)


class ForbiddenTransition(ValueError):
    """The table above does not allow this change; nothing was changed."""

    def __init__(self, source: str, target: str) -> None:
        super().__init__(f"A job cannot go from {source} to {target}.")
        self.source = source
        self.target = target


class TransitionConflict(RuntimeError):
    """The job was no longer in the expected status: another actor changed it first."""

    def __init__(self, job_id: int, source: str, target: str) -> None:
        super().__init__(f"Job {job_id} is no longer {source}; it was not moved to {target}.")
        self.job_id = job_id


def check_transition(source: str, target: str) -> None:
    if (source, target) not in ALLOWED_TRANSITIONS:
        raise ForbiddenTransition(source, target)
