"""The pull consumers' operations through the ORM (jobs/queue/postgres_pull.py does them in one
statement each on PostgreSQL): the same rules, a few statements each."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import models, transaction
from django.db.models import Case, F, Value, When

from consumers.models import Consumer
from jobs.models import Job
from jobs.queue.leases import CLAIMED_JOB_FIELDS, CLAIMED_MESSAGE_FIELDS, claimed_job
from jobs.queue.rules import heads_of_their_keys
from jobs.queue.types import HELD_COLUMNS, HeldRow, NamedJob, PullMove
from jobs.states import INFLIGHT, QUEUED, JobStatus

# A report's read of each job: its key and creation time (its public ID), state, and HELD_COLUMNS.
REPORTED_COLUMNS = ("pk", "created_at", "status", *HELD_COLUMNS)


class PortablePullOperations:
    """The pull operations of jobs/queue's implementation on any database Django supports."""

    def claim_for_pull(
        self, consumer: Consumer, limit: int, lease_until: datetime, now: datetime
    ) -> list[Job]:
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
                status_changed_at=now,
                attempts=F("attempts") + 1,
                lease_expires_at=lease_until,
                incremental_timeout=0,
            )
        return _claimed(ids)

    def acknowledge_pull_job(
        self, job: NamedJob, target: str, reason: str, now: datetime
    ) -> HeldRow | None:
        named = Job.objects.filter(
            pk=job.key,
            consumer_id=job.consumer_id,
            created_at__gte=job.created_from,
            created_at__lt=job.created_until,
        )
        row = named.filter(status=INFLIGHT).values_list(*HELD_COLUMNS).first()
        if row is None:
            return None
        moved = named.transition(
            INFLIGHT,
            JobStatus(target),
            status_changed_at=now,
            lease_expires_at=None,
            last_error=reason,
        )
        return row if moved else None

    def lock_reported(self, consumer: Consumer, keys: list[int]) -> list[Sequence[Any]]:
        rows = (
            Job.objects.filter(consumer=consumer, pk__in=keys)
            .select_for_update(of=("self",))
            .order_by("pk")
            .values_list(*REPORTED_COLUMNS)
        )
        return list(rows)

    def apply_pull_moves(self, moves: Sequence[PullMove], now: datetime) -> int:
        """One conditional UPDATE per target, each job's own values by CASE."""
        moved = 0
        for target in {move.target for move in moves}:
            alike = [move for move in moves if move.target == target]
            changes: dict[str, Any] = {"lease_expires_at": None, "status_changed_at": now}
            changes["last_error"] = _per_job(alike, "reason", models.TextField())
            if target == QUEUED:
                changes["next_attempt_at"] = _per_job(alike, "due_at", models.DateTimeField())
            moved += Job.objects.filter(pk__in=[move.key for move in alike]).transition(
                INFLIGHT, target, **changes
            )
        return moved


def _claimed(ids: list[int]) -> list[Job]:
    """The claimed jobs still INFLIGHT, read as values and made into models (cheaper than
    select_related's)."""
    rows = Job.objects.filter(pk__in=ids, status=INFLIGHT).values_list(
        *CLAIMED_JOB_FIELDS, *(f"message__{name}" for name in CLAIMED_MESSAGE_FIELDS)
    )
    return [claimed_job(rows.db, row) for row in rows]


def _per_job(moves: list[PullMove], name: str, field: models.Field[Any, Any]) -> Any:
    """The moves' value of `name`: the value itself when they share it, else a CASE by job."""
    values = {move.key: getattr(move, name) for move in moves}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    whens = [When(pk=pk, then=Value(value, output_field=field)) for pk, value in values.items()]
    return Case(*whens, output_field=field)
