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

from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from broker.conf import broker_settings
from consumers.models import Consumer
from jobs.queue.queries import statement
from jobs.states import DEAD, QUEUED, check_transition

EXPIRED = "expired"
EXPIRY_BATCH = 500  # per consumer and sweep: a sweep stays short, the next one goes on


def expire_old_jobs(now: datetime | None = None, batch: int = EXPIRY_BATCH) -> int:
    """Move the jobs past their age limit to DEAD; return how many moved.

    One statement: one index probe per push consumer that is not paused
    (job_consumer_queued_age_idx), so a sweep costs the same however long the queues are.
    """
    check_transition(QUEUED, DEAD)
    parameters: dict[str, Any] = {
        "now": now or timezone.now(),
        "changed_at": timezone.now(),
        "batch": batch,
        "default_seconds": broker_settings.BROKER_MAX_JOB_AGE_SECONDS,
        "expired": EXPIRED,
    }
    with connection.cursor() as cursor:
        cursor.execute(statement("expire_old_jobs"), parameters)
        return int(cursor.rowcount)


def restart_age(consumer: Consumer, now: datetime | None = None) -> int:
    """Count the age of the consumer's waiting jobs from now (it was resumed, or became a push
    consumer): time it could not receive in is not held against them."""
    with connection.cursor() as cursor:
        cursor.execute(
            statement("restart_age"), {"consumer": consumer.pk, "now": now or timezone.now()}
        )
        return int(cursor.rowcount)
