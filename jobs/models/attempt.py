"""The record of every push attempt, and the deletion of jobs with their attempts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import OuterRef, Subquery

from jobs.models.job import Job


class DeliveryAttempt(models.Model):
    """One push attempt: what was sent when, and what came back."""

    # No constraint in the database: on PostgreSQL both tables are partitioned (jobs/partitions/)
    # and a job's key includes its partition's time. Attempts are written only by the job's
    # holder, and go with their job (Django's cascade) or with their partition.
    job = models.ForeignKey(
        Job,
        on_delete=models.CASCADE,
        related_name="delivery_attempts",
        db_index=False,
        db_constraint=False,
    )
    attempt_number = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    duration_ms = models.FloatField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)  # None: no response
    # "http-status", "timeout", "connection", "payload-missing", ... ; "" for a 2xx.
    error_class = models.CharField(max_length=40, blank=True, default="")
    response_excerpt = models.TextField(blank=True, default="")  # first few KiB of the body
    # [[name, value], ...] in the order sent and received (a list: jsonb would reorder an
    # object's keys), secrets masked and bounded as jobs/delivery.py's `kept_headers` does:
    # those the request was sent with, and those of the final answer ([] without one). The
    # database default serves attempts recorded before them and rows written in SQL.
    request_headers = models.JSONField(default=list, blank=True, db_default=[])
    response_headers = models.JSONField(default=list, blank=True, db_default=[])
    dispatcher_id = models.CharField(max_length=255)
    # The job's consumer, copied so that a consumer's recent attempts are one index range (the
    # UI's consumer page); no foreign key: the job's already ties the row to its consumer, and
    # a check per inserted attempt would cost the dispatcher. Null for attempts recorded before
    # it existed.
    consumer_id = models.BigIntegerField(null=True, blank=True)

    class Meta:
        indexes = [
            # A job's attempt history, in order (UI and API); the FK index is this one.
            models.Index(fields=["job", "started_at"], name="attempt_job_idx"),
            # A consumer's attempts, newest first (the UI's consumer page and dashboard). It
            # carries what the page's filters test, so that looking through a consumer's newest
            # 10,000 attempts reads the index alone (PostgreSQL; elsewhere a plain index).
            models.Index(
                fields=["consumer_id", "-started_at"],
                include=["id", "status_code", "error_class"],
                name="attempt_consumer_idx",
            ),
            # The delivery statistics refresh (jobs/stats.py): attempts started in the last
            # few minutes, WHERE started_at >= t0 AND started_at < t1.
            models.Index(fields=["started_at"], name="attempt_started_idx"),
        ]

    def __str__(self) -> str:
        return f"attempt {self.attempt_number} of job {self.job_id}"

    def save(self, *args: Any, **kwargs: Any) -> None:
        if self.consumer_id is None:  # the dispatcher sets it; anyone else gets the job's
            self.consumer_id = self.job.consumer_id
        super().save(*args, **kwargs)


# The clocks of the hosts that write jobs (the API's) and attempts (the dispatchers') differ a
# little: a job's attempts are looked for from this long before its creation.
CLOCK_ALLOWANCE = timedelta(days=1)


def attempts_of_outer_job() -> models.QuerySet[DeliveryAttempt]:
    """The attempts of the job an outer query is at (OuterRef), for a subquery. A job's attempts
    started after it was created, so they are looked for from then on: on PostgreSQL the
    subquery then reads only the attempt partitions since (pruned as it runs), where by the job
    alone it probes every partition's index for every row. (No upper bound: an attempt is
    stamped when it starts and may be recorded long after, by a dispatcher that was stalled.)"""
    return DeliveryAttempt.objects.filter(
        job=OuterRef("pk"), started_at__gte=OuterRef("created_at") - CLOCK_ALLOWANCE
    )


LAST_ATTEMPT_FIELDS = ("attempt_number", "started_at", "duration_ms", "status_code", "error_class")


def with_last_attempt(jobs: models.QuerySet[Job]) -> models.QuerySet[Job]:
    """The jobs, each annotated `last_<field>` of its latest attempt (None before its first),
    for the few jobs of one message: a subquery per field, each reading the attempt partitions
    since the job was created."""
    latest = attempts_of_outer_job().order_by("-started_at", "-pk")
    fields = {f"last_{name}": Subquery(latest.values(name)[:1]) for name in LAST_ATTEMPT_FIELDS}
    return jobs.annotate(**fields)


def delete_jobs(jobs: models.QuerySet[Job]) -> int:
    """Delete these jobs with their attempts; return how many jobs (not rows) went.

    For a bounded set, such as a pull worker's one job: their keys are read and bound. A whole
    dead-letter queue goes in batches instead (jobs/dlq_actions.py). The jobs are locked first
    (PostgreSQL), so one that another request moves meanwhile is neither deleted nor stripped of
    its attempts; none is loaded as a model (Django's delete() loads every one).
    """
    with transaction.atomic():
        keys = list(jobs.select_for_update(of=("self",)).values_list("pk", flat=True))
        if not keys:
            return 0
        DeliveryAttempt.objects.filter(job_id__in=keys)._raw_delete(jobs.db)
        return Job.objects.filter(pk__in=keys)._raw_delete(jobs.db)
