"""A requeue or purge of one consumer's dead-letter queue, run in batches under a lease."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from django.db import models
from django.db.models import Q
from django.utils import timezone

from consumers.models import Consumer
from jobs.models.job import job_public_id, named_by


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
