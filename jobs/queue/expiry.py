"""The age limit of push jobs: none waits for ever (docs/delivery.md, "Expiry").

A consumer whose circuit stays open, or whose retries are spread wider than its age limit, would
otherwise hold its jobs QUEUED for as long as it is down, neither delivered nor visibly dead. A
job still QUEUED `BROKER_MAX_JOB_AGE_SECONDS` (or its consumer's `maxJobAge`) after it joined the
queue (`Job.enqueued_at`: its message published or released, or the job requeued or replayed) goes
DEAD with a `last_error` starting with "expired", where the DLQ tools can requeue it.

Pull consumers' jobs wait to be taken and do not expire; nor do those of a paused consumer, which
an operator holds back on purpose, and its jobs' age starts again when it is resumed (as when a
pull consumer becomes a push one). INFLIGHT jobs finish their attempt first. docs/dispatcher.md.
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
EXPIRY_BATCH = 500  # per consumer and sweep: a sweep stays short, the next one goes on


def expire_old_jobs(now: datetime | None = None, batch: int = EXPIRY_BATCH) -> int:
    """Move the jobs past their age limit to DEAD; return how many moved.

    One index probe per push consumer that is not paused (job_consumer_queued_age_idx), so a
    sweep costs the same however long the queues are.
    """
    now = now or timezone.now()
    default = broker_settings.BROKER_MAX_JOB_AGE_SECONDS
    limits = Consumer.objects.filter(type=Consumer.Type.PUSH, paused=False).values_list(
        "pk", "max_job_age"
    )
    expired = 0
    for consumer_id, own_limit in limits:
        seconds = default if own_limit is None else own_limit
        if seconds:  # 0: no limit
            expired += _expire(consumer_id, seconds, now, batch)
    return expired


def restart_age(consumer: Consumer, now: datetime | None = None) -> int:
    """Count the age of the consumer's waiting jobs from now (it was resumed, or became a push
    consumer): time it could not receive in is not held against them."""
    return Job.objects.filter(consumer=consumer, status=QUEUED).update(
        enqueued_at=now or timezone.now()
    )


def waiting_since_before(consumer_id: int, cutoff: datetime) -> QuerySet[Job]:
    """The consumer's QUEUED jobs that joined the queue before `cutoff`."""
    return Job.objects.filter(consumer_id=consumer_id, status=QUEUED, enqueued_at__lt=cutoff)


def _expire(consumer_id: int, seconds: int, now: datetime, batch: int) -> int:
    cutoff = now - timedelta(seconds=seconds)
    ids = list(waiting_since_before(consumer_id, cutoff).values_list("pk", flat=True)[:batch])
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
