"""Jobs (one per message and consumer) and the record of every push attempt (docs/data-model.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from django.db import models, transaction
from django.db.models import OuterRef, Q
from django.db.models.functions import Now
from django.utils import timezone

from broker.models import Message
from broker.xids import key_of_xid, public_key_xid
from consumers.models import Consumer
from jobs.states import (
    DEAD,
    DELIVERED,
    INFLIGHT,
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
        return self.filter(status=source).update(status=target, **changes)

    def requeue_dead(self) -> int:
        return self.transition(DEAD, QUEUED, **_requeue_changes())

    def replay_delivered(self) -> int:
        """Deliver these DELIVERED jobs again (broker/replay.py): QUEUED, due now, attempts reset
        as by a requeue; their DeliveryAttempt rows stay, so the history shows both deliveries."""
        return self.transition(DELIVERED, QUEUED, **_requeue_changes())

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


def _requeue_changes() -> dict[str, Any]:
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
    # Which time partition holds the job on PostgreSQL (jobs/partitions.py): when it was
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
        self.move(DEAD, QUEUED, **_requeue_changes())

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


class DeliveryAttempt(models.Model):
    """One push attempt: what was sent when, and what came back."""

    # No constraint in the database: on PostgreSQL both tables are partitioned (jobs/partitions.py)
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


class DispatcherHeartbeat(models.Model):
    """One row per running dispatcher, refreshed every few seconds (UI and /_status)."""

    dispatcher_id = models.CharField(max_length=255, unique=True)
    hostname = models.CharField(max_length=255)
    pid = models.PositiveIntegerField()
    started_at = models.DateTimeField()
    last_beat_at = models.DateTimeField()
    in_flight = models.PositiveIntegerField(default=0)
    delivered = models.PositiveBigIntegerField(default=0)  # attempts answered 2xx since start
    failed = models.PositiveBigIntegerField(default=0)  # attempts that failed since start

    def __str__(self) -> str:
        return self.dispatcher_id


class DeliveryStats(models.Model):
    """Push attempts of one consumer in one minute or one hour: the rollup behind the dashboard's
    rates, success rates, latencies and charts (jobs/stats.py recounts it from
    DeliveryAttempt)."""

    class Span(models.IntegerChoices):
        MINUTE = 60
        HOUR = 3600

    # No FK index: the unique (consumer, span, period_start) constraint leads with it.
    consumer = models.ForeignKey(
        Consumer, on_delete=models.CASCADE, related_name="delivery_stats", db_index=False
    )
    span = models.PositiveIntegerField(choices=Span.choices)  # seconds
    period_start = models.DateTimeField()
    attempts = models.PositiveIntegerField(default=0)
    delivered = models.PositiveIntegerField(default=0)  # answered 2xx
    failed = models.PositiveIntegerField(default=0)  # anything else
    # Publish-to-delivery latency of the delivered attempts: {bucket number: count}, buckets as
    # jobs.stats.latency_bucket defines them; histograms add up, so any period's percentiles can
    # be estimated from its rows.
    latency_histogram = models.JSONField(default=dict)

    class Meta:
        verbose_name_plural = "delivery stats"
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "span", "period_start"], name="delivery_stats_unique"
            ),
        ]
        indexes = [
            # Every read and delete: one span's rows from (or before) a time, all consumers.
            models.Index(fields=["span", "period_start"], name="delivery_stats_period_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_id} {self.period_start:%Y-%m-%d %H:%M} ({self.span} s)"


class DeliveryReport(models.Model):
    """One figure row of the `spark_etl report` (docs/spark_etl.md): one consumer of one channel
    over one UTC hour or day of publishing. Written only by the pipeline (spark_etl/transforms.py
    defines the figures); the operator UI's reports page charts it."""

    class Grain(models.TextChoices):
        HOUR = "hour"
        DAY = "day"

    grain = models.CharField(max_length=4, choices=Grain.choices)
    period_start = models.DateTimeField()
    # Public IDs, not foreign keys: the report outlives archived messages and deleted consumers.
    channel_id = models.CharField(max_length=255)
    consumer_id = models.CharField(max_length=255)
    messages = models.BigIntegerField()
    jobs = models.BigIntegerField()
    delivered = models.BigIntegerField()
    dead = models.BigIntegerField()
    success_rate = models.FloatField(null=True)  # delivered / (delivered + dead)
    first_attempt_success_rate = models.FloatField(null=True)
    mean_attempts = models.FloatField(null=True)
    latency_p50_ms = models.FloatField(null=True)  # publish -> delivery, delivered jobs
    latency_p95_ms = models.FloatField(null=True)
    latency_p99_ms = models.FloatField(null=True)
    top_failures = models.TextField(blank=True, default="")  # "503:12,timeout:4"

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["grain", "channel_id", "consumer_id", "period_start"],
                name="delivery_report_unique",
            ),
        ]
        indexes = [
            # The reports page: one grain over a time range, all consumers (charts and totals);
            # also the pipeline's replacement of a recomputed range.
            models.Index(fields=["grain", "period_start"], name="delivery_report_period_idx"),
        ]

    def __str__(self) -> str:
        period = f"{self.period_start:%Y-%m-%d %H:%M}"
        return f"{self.channel_id}/{self.consumer_id} {self.grain} {period}"


def job_public_id(key: int, created_at: datetime) -> str:
    """Job.public_id from a row's key and creation time (for queries that fetch only those)."""
    return public_key_xid(created_at.timestamp(), key)


class JobStatusSummary(models.Model):
    """One consumer's jobs in one status as the last refresh counted them (jobs/status_summary.py):
    what /job-status, /dlq-status and /metrics answer for a status too large to count on every
    read. Replaced whole by each refresh."""

    # No constraint in the database: a consumer deleted while a refresh counts would fail its
    # insert. Rows of a deleted consumer are simply not shown, and the next refresh drops them.
    consumer = models.ForeignKey(
        Consumer,
        on_delete=models.DO_NOTHING,
        db_constraint=False,
        db_index=False,  # the unique (consumer, status) constraint leads with it
        related_name="+",
    )
    status = models.CharField(max_length=9, choices=JobStatus.choices)
    count = models.PositiveBigIntegerField()
    # The oldest and newest of those jobs: by enqueued_at for QUEUED jobs, else status_changed_at
    # (jobs/status_summary.py says why).
    oldest = models.DateTimeField()
    newest = models.DateTimeField()
    refreshed_at = models.DateTimeField()  # when the refresh that counted them began

    class Meta:
        verbose_name_plural = "job status summaries"
        constraints = [
            models.UniqueConstraint(
                fields=["consumer", "status"], name="job_status_summary_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.consumer_id} {self.status}: {self.count}"


class DeadLetterAction(models.Model):
    """A requeue or purge of one consumer's dead-letter queue, done in batches of one short
    transaction each (jobs/dlq_actions.py): what it takes, how far it got, and who runs it.

    It takes the consumer's jobs that died at or after `since` (all, without it) and before
    `died_before` (when it was asked: a job that dies later, a requeued one dying again among
    them, is left for another action). The batches walk them in the order they died, and
    `resume_from` is where the next one starts. Whoever runs the batches holds the lease
    (`runner` until `lease_expires_at`), which every batch renews: a runner that vanishes leaves
    a lease that runs out, and housekeeping goes on from `resume_from`.
    """

    class Kind(models.TextChoices):
        REQUEUE = "requeue"
        PURGE = "purge"

    class State(models.TextChoices):
        RUNNING = "running"
        DONE = "done"
        FAILED = "failed"  # failed MAX_FAILURES times in a row (jobs/dlq_actions.py)

    # No related name: a consumer's actions are only ever looked up by their key.
    consumer = models.ForeignKey(Consumer, on_delete=models.CASCADE, related_name="+")
    kind = models.CharField(max_length=7, choices=Kind.choices)
    state = models.CharField(max_length=7, choices=State.choices, default=State.RUNNING)
    since = models.DateTimeField(null=True, blank=True)
    died_before = models.DateTimeField()
    resume_from = models.DateTimeField()
    done = models.PositiveBigIntegerField(default=0)  # jobs requeued or deleted so far
    # Counted once, when the action is handed to housekeeping: done + those left then.
    estimated_total = models.PositiveBigIntegerField(null=True, blank=True)
    batches = models.PositiveIntegerField(default=0)
    failures = models.PositiveSmallIntegerField(default=0)  # in a row; a batch done resets it
    error = models.TextField(blank=True, default="")  # the last failure's
    runner = models.CharField(max_length=32, blank=True, default="")
    lease_expires_at = models.DateTimeField()
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            # Housekeeping's look for actions whose runner is gone: RUNNING, lease run out.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(state="running"),
                name="dead_letter_action_lease_idx",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} of {self.consumer_id}'s dead jobs ({self.state}, {self.done} done)"

    # What a runner's writes change: read back after each (not the consumer, kept cached).
    PROGRESS = (
        "state", "resume_from", "done", "estimated_total", "batches", "failures", "error",
        "runner", "lease_expires_at", "updated_at", "finished_at",
    )  # fmt: skip

    @property
    def public_id(self) -> str:
        """Its ID in URLs: an xid of its creation second and key, as a job's (Job.public_id)."""
        return job_public_id(self.pk, self.created_at)

    @classmethod
    def named(cls, public_id: str) -> models.QuerySet[DeadLetterAction]:
        """The action `public_id` names; none if it is malformed or names another."""
        named = named_by(public_id)
        if named is None:
            return cls.objects.none()
        key, created = named
        return cls.objects.filter(
            pk=key, created_at__gte=created, created_at__lt=created + timedelta(seconds=1)
        )

    @property
    def finished(self) -> bool:
        return self.state != self.State.RUNNING

    def record_batch(
        self, taken: int, last_died_at: datetime | None, *, last: bool, lease: timedelta
    ) -> bool:
        """Count a batch of `taken` jobs, in the batch's transaction, and renew the lease for
        `lease` (or finish, after the `last` batch). False, with nothing written, if this runner
        no longer holds the action: the caller then undoes its batch."""
        now = timezone.now()
        changes: dict[str, Any] = {
            "done": models.F("done") + taken,
            "batches": models.F("batches") + 1,
            "resume_from": last_died_at or self.resume_from,
            "failures": 0,
            "updated_at": now,
            "lease_expires_at": now + lease,
        }
        if last:
            changes.update(state=self.State.DONE, finished_at=now, runner="")
        return self._write(changes)

    def record_failure(self, error: str, *, give_up_after: int) -> None:
        """A batch failed (and was undone): say why, and free the action for a retry, or give
        up once it failed `give_up_after` times in a row. Nothing if it is no longer ours."""
        now = timezone.now()
        failed = self.failures + 1 >= give_up_after
        changes: dict[str, Any] = {
            "failures": models.F("failures") + 1,
            "error": error,
            "updated_at": now,
            "lease_expires_at": now,  # anyone may retry it at once
            "runner": "",
        }
        if failed:
            changes.update(state=self.State.FAILED, finished_at=now)
        self._write(changes)

    def release(self, estimated_total: int | None = None) -> bool:
        """Give the action up to whoever claims it next (housekeeping), with an estimate of its
        total if it has none; False if it was no longer this runner's."""
        changes: dict[str, Any] = {"lease_expires_at": timezone.now(), "runner": ""}
        if self.estimated_total is None and estimated_total is not None:
            changes["estimated_total"] = estimated_total
        return self._write(changes)

    @classmethod
    def claim(cls, pk: int, runner: str, lease: timedelta) -> DeadLetterAction | None:
        """Take the action `pk` for `runner` if it is RUNNING and no one holds it (its lease ran
        out, or was given up); the action, or None. A conditional UPDATE: two claimers at once
        cannot both win."""
        now = timezone.now()
        free = cls.objects.filter(pk=pk, state=cls.State.RUNNING, lease_expires_at__lte=now)
        if not free.update(runner=runner, lease_expires_at=now + lease, updated_at=now):
            return None
        return cls.objects.get(pk=pk)

    def _write(self, changes: dict[str, Any]) -> bool:
        """Write `changes` if this runner still holds the action, and read back what they made;
        False if it does not (then it holds nothing any more)."""
        mine = DeadLetterAction.objects.filter(
            pk=self.pk, state=self.State.RUNNING, runner=self.runner
        )
        if not self.runner or not mine.update(**changes):  # "": given up, no one's
            self.runner = ""
            return False
        self.refresh_from_db(fields=self.PROGRESS)
        return True
