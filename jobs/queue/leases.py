"""Leases of INFLIGHT jobs: what pull consumers are handed, and sweeping expired leases.

A lease that runs out means whoever held the job (a dispatcher that died, a pull worker that
vanished) will not report back: the job returns to QUEUED, or goes DEAD when it has used all its
attempts (docs/dispatcher.md; docs/configuration.md). Attempts were counted when the job went
INFLIGHT.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from broker.models import Message
from broker.payloads import PayloadMissing
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue.queries import CLAIMED_JOB_FIELDS, CLAIMED_MESSAGE_FIELDS, statement
from jobs.queue.rules import lease_expiry
from jobs.states import DEAD, INFLIGHT, QUEUED, JobStatus, check_transition

SWEEP_BATCH = 500
LEASE_EXPIRED = "lease expired before the outcome was reported"


def sweep_expired_leases(now: datetime | None = None, batch: int = SWEEP_BATCH) -> int:
    """Return expired INFLIGHT jobs to QUEUED (or DEAD when out of attempts); how many moved."""
    now = now or timezone.now()
    with connection.cursor() as cursor:
        # The usual case, every second: one look, no transaction.
        cursor.execute(statement("any_expired_lease"), {"now": now})
        if not cursor.fetchone()[0]:
            return 0
    with transaction.atomic():
        return _sweep(now, batch)


def _sweep(now: datetime, batch: int) -> int:
    check_transition(INFLIGHT, QUEUED)
    check_transition(INFLIGHT, DEAD)
    with connection.cursor() as cursor:
        cursor.execute(statement("lock_expired_leases"), {"now": now, "batch": batch})
        expired = cursor.fetchall()
    if not expired:
        return 0
    limits = {
        consumer.pk: consumer.max_attempts
        for consumer in Consumer.objects.filter(pk__in={row[2] for row in expired})
    }
    spent = [attempts >= limits[consumer_id] for _, _, consumer_id, attempts in expired]
    parameters: dict[str, Any] = {
        "now": now,
        "changed_at": timezone.now(),
        "jobs": [row[0] for row in expired],
        "partitions": [row[1] for row in expired],
        "targets": [(DEAD if out else QUEUED).value for out in spent],
        "reasons": [
            f"{LEASE_EXPIRED}; no attempts left" if out else LEASE_EXPIRED for out in spent
        ],
    }
    with connection.cursor() as cursor:
        cursor.execute(statement("end_expired_leases"), parameters)
        return int(cursor.rowcount)


def take_for_pull(job: Job, incremental_timeout: int = 0) -> None:
    """A pull consumer moves one job to INFLIGHT itself, QUEUED or DEAD (a retry of a dead job):
    one attempt more, under a lease longer by `incremental_timeout` seconds."""
    job.move(
        JobStatus(job.status),  # the table allows QUEUED and DEAD; anything else is refused
        INFLIGHT,
        attempts=F("attempts") + 1,
        lease_expires_at=lease_expiry(timezone.now(), incremental_timeout),
        incremental_timeout=incremental_timeout,
    )


def claimed_job(db: str, row: Sequence[Any]) -> Job:
    """A claimed job as a model with its message, from a row of CLAIMED_JOB_FIELDS then
    CLAIMED_MESSAGE_FIELDS. The other fields load if ever touched. Raw SQL gives a memoryview
    payload and jsonb as text (Django reads it so and leaves parsing to JSONField)."""
    split = len(CLAIMED_JOB_FIELDS)
    job = Job.from_db(db, CLAIMED_JOB_FIELDS, row[:split])
    message = dict(zip(CLAIMED_MESSAGE_FIELDS, row[split:], strict=True))
    message["payload"] = bytes(message["payload"])
    if isinstance(message["headers"], str):
        message["headers"] = json.loads(message["headers"])
    job.message = Message.from_db(db, CLAIMED_MESSAGE_FIELDS, list(message.values()))
    return job


def with_readable_payloads(jobs: Iterable[Job]) -> list[Job]:
    """The jobs whose payload can be read; those whose offloaded payload is gone go DEAD instead
    of to the worker, as a push delivery would (docs/delivery.md, "Large payloads").

    Offloaded payloads are read after the claim's transaction, so no lock is held over storage
    I/O, and kept on their message for the response.
    """
    readable = []
    for job in jobs:
        try:
            if job.message.payload_file:
                job.message.read_payload()
        except PayloadMissing as exc:
            Job.objects.filter(pk=job.pk).transition(
                INFLIGHT, DEAD, lease_expires_at=None, last_error=str(exc)
            )
        else:
            readable.append(job)
    return readable
