"""Leases of INFLIGHT jobs: handing jobs to pull consumers, and sweeping expired leases.

A lease that runs out means whoever held the job (a dispatcher that died, a pull worker that
vanished) will not report back: the job returns to QUEUED, or goes DEAD when it has used all its
attempts (docs/dispatcher.md; docs/configuration.md). Attempts were counted when the job went
INFLIGHT.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta

from django.db import transaction
from django.db.models import F
from django.utils import timezone

from broker.models import Message
from broker.payloads import PayloadMissing
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue.rules import heads_of_their_keys, lease_expiry
from jobs.states import DEAD, INFLIGHT, QUEUED, JobStatus

SWEEP_BATCH = 500
# The message's fields a claim answers with (QueuedJobSerializer), in the model's order of fields,
# as `Model.from_db` takes them.
CLAIMED_MESSAGE_FIELDS = tuple(
    field.attname
    for field in Message._meta.concrete_fields
    if field.attname in {"public_id", "payload", "payload_file", "content_type", "headers"}
)
LEASE_EXPIRED = "lease expired before the outcome was reported"


def sweep_expired_leases(now: datetime | None = None, batch: int = SWEEP_BATCH) -> int:
    """Return expired INFLIGHT jobs to QUEUED (or DEAD when out of attempts); how many moved."""
    now = now or timezone.now()
    expired = list(
        Job.objects.filter(status=INFLIGHT, lease_expires_at__lt=now).values_list(
            "pk", "consumer_id", "attempts"
        )[:batch]
    )
    if not expired:
        return 0
    limits = {
        consumer.pk: consumer.max_attempts
        for consumer in Consumer.objects.filter(pk__in={row[1] for row in expired})
    }
    exhausted = [pk for pk, consumer_id, attempts in expired if attempts >= limits[consumer_id]]
    retryable = [pk for pk, consumer_id, attempts in expired if attempts < limits[consumer_id]]
    # The lease condition again: a job re-leased since we looked is not touched.
    still_expired = Job.objects.filter(lease_expires_at__lt=now)
    moved = still_expired.filter(pk__in=exhausted).transition(
        INFLIGHT, DEAD, lease_expires_at=None, last_error=f"{LEASE_EXPIRED}; no attempts left"
    )
    moved += still_expired.filter(pk__in=retryable).transition(
        INFLIGHT, QUEUED, lease_expires_at=None, next_attempt_at=now, last_error=LEASE_EXPIRED
    )
    return moved


def claim_for_pull(consumer: Consumer, limit: int, lease_seconds: int | None = None) -> list[Job]:
    """Atomically move up to `limit` of the consumer's due jobs QUEUED -> INFLIGHT, under a lease
    of `lease_seconds` (None: the delivery timeout and its grace, as for push).

    SKIP LOCKED lets competing workers take different jobs instead of waiting on each other; the
    conditional transition guarantees that no job is handed out twice even without it (SQLite).
    An ordered consumer gets only the head of each ordering key, as push consumers do.
    """
    now = timezone.now()
    due = Job.objects.filter(consumer=consumer, status=QUEUED, next_attempt_at__lte=now)
    if consumer.ordering == Consumer.Ordering.ORDERED:
        due = heads_of_their_keys(due)
    with transaction.atomic():
        candidates = (
            due.select_for_update(skip_locked=True)
            .order_by("-priority", "pk")
            .values_list("pk", flat=True)[:limit]
        )
        ids = list(candidates)
        Job.objects.filter(pk__in=ids).transition(
            QUEUED,
            INFLIGHT,
            attempts=F("attempts") + 1,
            lease_expires_at=_pull_lease(now, lease_seconds),
            incremental_timeout=0,
        )
    return _with_payloads(_claimed(ids))


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


def _pull_lease(now: datetime, lease_seconds: int | None) -> datetime:
    if lease_seconds is None:
        return lease_expiry(now)
    return now + timedelta(seconds=lease_seconds)


def _claimed(ids: list[int]) -> list[Job]:
    """The claimed jobs still INFLIGHT, best first, each with its message as far as a worker is
    given it. Read as values and made into models here: through select_related, building them
    cost more than the claim's statements. The message's other fields load if ever touched."""
    job_fields = [field.attname for field in Job._meta.concrete_fields]
    rows = (
        Job.objects.filter(pk__in=ids, status=INFLIGHT)
        .order_by("-priority", "pk")
        .values_list(*job_fields, *(f"message__{name}" for name in CLAIMED_MESSAGE_FIELDS))
    )
    jobs = []
    for row in rows:
        job = Job.from_db(rows.db, job_fields, row[: len(job_fields)])
        message = [job.message_id, *row[len(job_fields) :]]
        job.message = Message.from_db(rows.db, ["id", *CLAIMED_MESSAGE_FIELDS], message)
        jobs.append(job)
    return jobs


def _with_payloads(jobs: Iterable[Job]) -> list[Job]:
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
