"""The age limit of push jobs: none waits for ever (SPEC §12).

A consumer whose circuit stays open, or whose retries are spread wider than its age limit, would
otherwise hold its jobs QUEUED for as long as it is down, neither delivered nor visibly dead. A
job still QUEUED `BROKER_MAX_JOB_AGE_SECONDS` (or its consumer's `maxJobAge`) after it joined the
queue (`Job.enqueued_at`: its message published or released, or the job requeued or replayed) goes
DEAD with a `last_error` starting with "expired", where the DLQ tools can requeue it.

Pull consumers' jobs wait to be taken and do not expire; nor do those of a paused consumer, which
an operator holds back on purpose (docs/dispatcher.md). INFLIGHT jobs finish their attempt first.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db.models import Case, QuerySet, TextField, Value, When
from django.db.models.functions import Concat
from django.utils import timezone

from broker.conf import broker_settings
from consumers.models import Consumer
from jobs.models import Job
from jobs.states import DEAD, QUEUED

EXPIRED = "expired"
EXPIRY_BATCH = 500


def expire_old_jobs(now: datetime | None = None, batch: int = EXPIRY_BATCH) -> int:
    """Move up to `batch` jobs per age limit that are past it to DEAD; return how many moved."""
    now = now or timezone.now()
    waiting = Job.objects.filter(
        status=QUEUED, consumer__type=Consumer.Type.PUSH, consumer__paused=False
    )
    expired = 0
    default = broker_settings.BROKER_MAX_JOB_AGE_SECONDS
    if default:
        expired += _expire(waiting.filter(consumer__max_job_age__isnull=True), default, now, batch)
    own_limits = Consumer.objects.filter(
        type=Consumer.Type.PUSH, paused=False, max_job_age__gt=0
    ).values_list("pk", "max_job_age")
    for consumer_id, seconds in own_limits:
        if seconds:  # always, by the filter; says so to the type checker
            expired += _expire(waiting.filter(consumer_id=consumer_id), seconds, now, batch)
    return expired


def _expire(jobs: QuerySet[Job], seconds: int, now: datetime, batch: int) -> int:
    cutoff = now - timedelta(seconds=seconds)
    ids = list(jobs.filter(enqueued_at__lt=cutoff).values_list("pk", flat=True)[:batch])
    if not ids:
        return 0
    reason = f"{EXPIRED}: not delivered within {seconds} s of being queued"
    # The job's own last error says why it was not delivered: kept after the reason.
    last_error = Case(
        When(last_error="", then=Value(reason)),
        default=Concat(Value(f"{reason}; last error: "), "last_error"),
        output_field=TextField(),
    )
    # The status condition of the transition, and the age again: a job claimed or requeued
    # since it was read is left alone.
    return Job.objects.filter(pk__in=ids, enqueued_at__lt=cutoff).transition(
        QUEUED, DEAD, last_error=last_error
    )
