"""Jobs: one per message and consumer, their queryset's conditional moves, and their public IDs."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from broker.models import Message
from broker.xids import key_of_xid, public_key_xid
from consumers.models import Consumer
from jobs.partitions import pending
from jobs.states import (
    DEAD,
    DELIVERED,
    INFLIGHT,
    PENDING,
    QUEUED,
    ForbiddenTransition,
    JobStatus,
    TransitionConflict,
    check_transition,
)


class JobQuerySet(models.QuerySet["Job"]):
    def transition(self, source: JobStatus, target: JobStatus, **changes: Any) -> int:
        """Move every job of this queryset that is still `source` to `target`.

        One conditional UPDATE: concurrent actors can never both win, and the returned row count
        says how many jobs this caller moved. `status_changed_at` is now unless `changes` says.
        """
        check_transition(source, target)
        changes.setdefault("status_changed_at", timezone.now())
        if target not in PENDING or source in PENDING:
            return self.filter(status=source).update(status=target, **changes)
        with transaction.atomic():  # a requeue, a replay: announced at its commit
            pending.jobs_reopened()
            return self.filter(status=source).update(status=target, **changes)

    def requeue_dead(self) -> int:
        return self.transition(DEAD, QUEUED, **requeue_changes())

    def replay_delivered(self) -> int:
        """Deliver these DELIVERED jobs again (broker/replay.py): QUEUED, due now, attempts reset
        as by a requeue; their DeliveryAttempt rows stay, so the history shows both deliveries."""
        return self.transition(DELIVERED, QUEUED, **requeue_changes())

    def with_public_id(self, public_id: str) -> JobQuerySet:
        """The job named by `public_id` (Job.public_id), found by its primary key; none if the ID
        is malformed or names another job's key with a different creation second."""
        named = named_by(public_id)
        if named is None:
            return self.none()
        key, created = named
        return self.filter(
            pk=key, created_at__gte=created, created_at__lt=created + timedelta(seconds=1)
        )


def named_by(public_id: str) -> tuple[int, datetime] | None:
    """The key and the creation second of the job `public_id` names; None if it is malformed."""
    parts = key_of_xid(public_id)
    if parts is None:
        return None
    seconds, key = parts
    return key, datetime.fromtimestamp(seconds, tz=UTC)


def requeue_changes() -> dict[str, Any]:
    """A job back in the queue as new work: no attempt used, due now, a full age limit again,
    and no last error (it would say that the attempts were used up, or that it expired)."""
    now = timezone.now()
    return {
        "attempts": 0,
        "next_attempt_at": now,
        "lease_expires_at": None,
        "enqueued_at": now,
        "last_error": "",
    }


class Job(models.Model):
    Status = JobStatus

    # No FK index on message: the unique (message, consumer) constraint leads with it.
    message = models.ForeignKey(
        Message, on_delete=models.CASCADE, related_name="jobs", db_index=False
    )
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="jobs")
    status = models.CharField(max_length=9, choices=JobStatus.choices, default=QUEUED)
    priority = models.IntegerField(default=0)  # copied from the message so claims need no join
    ordering_key = models.CharField(max_length=255, blank=True, default="")  # copied, likewise
    # Times this job was handed out (push claim, pull take, retry of a dead job); reset on requeue.
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(
        default=timezone.now
    )  # not claimable before this (backoff)
    lease_expires_at = models.DateTimeField(null=True, blank=True)  # set while INFLIGHT
    # The dispatcher that holds it (its DispatcherHeartbeat's dispatcher_id), while a push
    # claim's INFLIGHT: if that dispatcher dies, its jobs go back to the queue at once rather
    # than when their leases run out (jobs/queue/leases.py). Null for pull consumers' jobs.
    claimed_by = models.CharField(max_length=255, null=True, blank=True)  # noqa: DJ001 (none: no holder)
    incremental_timeout = models.PositiveIntegerField(default=0)  # pull: extra lease seconds
    last_error = models.TextField(blank=True, default="")
    created_at = models.DateTimeField(default=timezone.now)
    status_changed_at = models.DateTimeField(default=timezone.now)
    # When the job last joined the queue as new work: created (its message published or
    # released), requeued from the DLQ or replayed. Its age limit counts from here
    # (jobs/queue/expiry.py).
    # The database default serves the fan-out statements and bulk loads written in SQL.
    enqueued_at = models.DateTimeField(default=timezone.now, db_default=Now())
    # Which time partition holds the job on PostgreSQL (jobs/partitions/): when it was
    # inserted, or when retention last carried it forward unfinished. Never the job's identity.
    partition_at = models.DateTimeField(db_default=Now(), editable=False)

    objects = JobQuerySet.as_manager()

    class Meta:
        constraints = [
            # On PostgreSQL the constraint also holds partition_at (a partitioned table's unique
            # keys must include its partition key); a message's jobs are made in one statement.
            models.UniqueConstraint(fields=["message", "consumer"], name="job_per_consumer_unique"),
        ]
        indexes = [
            # Pull queued-jobs and claim of one consumer: priority desc, then oldest (lowest id)
            # first; also per-consumer queue depth.
            models.Index(
                fields=["consumer", "-priority", "id"],
                condition=Q(status=QUEUED),
                name="job_consumer_queued_idx",
            ),
            # DLQ listing, /dlq-status counts per consumer, and "requeue since T".
            models.Index(
                fields=["consumer", "status_changed_at"],
                condition=Q(status=DEAD),
                name="job_consumer_dead_idx",
            ),
            # The operator UI's dead jobs across consumers, newest first, keyset-paginated.
            models.Index(
                fields=["-status_changed_at", "-id"],
                condition=Q(status=DEAD),
                name="job_dead_recent_idx",
            ),
            # Per-consumer in-flight counts for the maxInFlight cap of the push claim.
            models.Index(
                fields=["consumer"], condition=Q(status=INFLIGHT), name="job_consumer_inflight_idx"
            ),
            # Push claim of one consumer's due jobs: priority desc, then due time.
            models.Index(
                fields=["consumer", "-priority", "next_attempt_at"],
                condition=Q(status=QUEUED),
                name="job_consumer_due_idx",
            ),
            # Ordered consumers (docs/delivery.md, "Ordering"): the head of each key is its pending
            # job with the lowest id; the claim walks the keys of a consumer through this index.
            models.Index(
                fields=["consumer", "ordering_key", "id"],
                condition=Q(status__in=[QUEUED, INFLIGHT]),
                name="job_consumer_key_pending_idx",
            ),
            # Sweep of expired leases: INFLIGHT jobs WHERE lease_expires_at < now.
            models.Index(
                fields=["lease_expires_at"], condition=Q(status=INFLIGHT), name="job_lease_idx"
            ),
            # Expiry (jobs/queue/expiry.py): one consumer's QUEUED jobs WHERE enqueued_at < its
            # limit.
            models.Index(
                fields=["consumer", "enqueued_at"],
                condition=Q(status=QUEUED),
                name="job_consumer_queued_age_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"job {self.public_id} ({self.status})"

    @property
    def public_id(self) -> str:
        """Its ID on every public surface: an xid of its creation second and key (broker/xids)."""
        return job_public_id(self.pk, self.created_at)

    def mark_delivered(self) -> None:
        self.move(INFLIGHT, DELIVERED, lease_expires_at=None, last_error="")

    def mark_dead(self, reason: str) -> None:
        self.move(INFLIGHT, DEAD, lease_expires_at=None, last_error=reason)

    def requeue(self) -> None:
        self.move(DEAD, QUEUED, **requeue_changes())

    def move(self, source: JobStatus, target: JobStatus, **changes: Any) -> None:
        """Move this job from `source` to `target` if it is still `source`; TransitionConflict if
        another actor moved it first. The instance then holds what the move wrote."""
        check_transition(source, target)
        if self.status != source:
            raise ForbiddenTransition(self.status, target)
        changes = {"status_changed_at": timezone.now(), **changes}
        if not Job.objects.filter(pk=self.pk).transition(source, target, **changes):
            raise TransitionConflict(self.pk, source, target)
        # The values written are known: only those the database computed (F("attempts") + 1)
        # are read back, instead of the whole row.
        computed = [name for name, value in changes.items() if hasattr(value, "resolve_expression")]
        for name, value in changes.items():
            if name not in computed:
                setattr(self, name, value)
        self.status = target
        if computed:
            self.refresh_from_db(fields=computed)


def job_public_id(key: int, created_at: datetime) -> str:
    """Job.public_id from a row's key and creation time (for queries that fetch only those)."""
    return public_key_xid(created_at.timestamp(), key)
