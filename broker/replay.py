"""Replay: deliver an already delivered message again, to one consumer or to all (docs/api.md).

For each consumer it is asked for, the message's job is:
- DELIVERED: moved back to QUEUED by the state machine's replay transition (one conditional
  UPDATE, `jobs.queue.replay_delivered`): due now, attempts reset, its attempt history kept;
- missing because the consumer joined the channel after the publish: created by the queue's
  fan-out, `jobs.queue.add_jobs`, if the consumer subscribes to the message's event type
  (broker/event_types.py); missing although the consumer is older than the message (its job was
  deleted: a dead job purged or deleted by an operator; or the consumer was not subscribed to the
  message's type then): skipped, since bringing back what an operator threw away is not what
  "replay" asks for;
- QUEUED or INFLIGHT: left alone, it is on its way already; DEAD: left alone, that is what a
  requeue is for (dead-letter queue). These are reported as skipped, with the reason.

An ordered consumer's job (docs/delivery.md, "Ordering") is replayed only while no other job of its
ordering key is pending (QUEUED or INFLIGHT): its id does not change, so queued again among later
jobs of the key it would overtake them, and a dispatcher claiming one of them at that moment could
deliver two of the key at once. While the key is busy it is skipped, with that reason; once the key
is idle the replayed job is its only pending job.

The whole replay is one transaction holding the message's row lock: two replays of one message
cannot both create the same new job, and the jobs, the message's status and the dispatchers'
wake-up (NOTIFY, as a publish sends) commit together. See docs/api.md, "Replay".
"""

from __future__ import annotations

from dataclasses import dataclass, field

from django.db import transaction
from django.utils import timezone

from broker import event_types, payloads
from broker.message_states import ACKNOWLEDGED, DISPATCHED
from broker.models import Message
from consumers.models import Consumer
from jobs import queue
from jobs.models import Job
from jobs.queue.rules import key_busy
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED

SKIP_REASONS: dict[str, str] = {
    QUEUED: "already queued: it will be delivered",
    INFLIGHT: "being delivered right now",
    DEAD: "dead: requeue it from the dead-letter queue instead",
}
KEY_BUSY = "ordered consumer: later messages of its ordering key are pending; replay once they are"
JOB_DELETED = (
    "it has no job of this message: deleted (dead and purged, or by an operator), or it was not"
    " subscribed to the message's event type when it was published"
)
NOT_SUBSCRIBED = "not subscribed to the message's event type"


# What a replay reads of the message (never the payload).
REPLAY_FIELDS = [
    "channel_id",
    "status",
    "payload_file",
    "priority",
    "ordering_key",
    "event_type",
    "received_at",
]


class NotReplayable(Exception):
    """The message cannot be delivered again at all (not released yet, payload lost)."""


@dataclass
class Skipped:
    consumer: str  # the consumer's public ID
    status: str  # its job's status
    reason: str


@dataclass
class ReplayResult:
    """What a replay did, per consumer (public IDs)."""

    replayed: list[str] = field(default_factory=list)  # DELIVERED jobs queued again
    created: list[str] = field(default_factory=list)  # consumers that had no job: one made now
    skipped: list[Skipped] = field(default_factory=list)

    @property
    def queued(self) -> list[str]:
        """Every consumer the message is on its way to again because of this replay."""
        return self.replayed + self.created

    def summary(self) -> str:
        """One sentence for the UI and for a 409."""
        parts = []
        if self.replayed:
            parts.append(f"replayed to {', '.join(self.replayed)}")
        if self.created:
            parts.append(f"new job for {', '.join(self.created)}")
        parts += [f"{s.consumer} skipped ({s.reason})" for s in self.skipped]
        return "; ".join(parts) or "the channel has no consumer"


def replay(message: Message, consumer: Consumer | None = None) -> ReplayResult:
    """Queue `message` again for `consumer`, or for every consumer of its channel when None.

    Raises NotReplayable when the message is still scheduled or its offloaded payload is gone.
    A result with nothing queued (every job skipped) changes nothing.
    """
    if consumer is not None and consumer.channel_id != message.channel_id:
        raise ValueError(f"Consumer {consumer.public_id!r} is not a consumer of {message}.")
    with transaction.atomic():
        rows = Message.objects.select_for_update().only(*REPLAY_FIELDS).filter(pk=message.pk)
        locked = rows.first()
        if locked is None:  # purged, archived or cancelled since it was looked up
            raise NotReplayable("The message no longer exists.")
        _check_replayable(locked)
        targets = [consumer] if consumer else list(_consumers_of(locked))
        result = _replay_to(locked, targets)
        if result.queued:
            _mark_dispatched(locked)
            queue.wake_dispatchers()
    return result


def _check_replayable(message: Message) -> None:
    if message.status == Message.Status.SCHEDULED:
        raise NotReplayable("The message is scheduled and not released yet: nothing to replay.")
    # Replaying it would only make its jobs DEAD with payload-missing at the next attempt.
    if message.payload_file and not payloads.payload_storage().exists(message.payload_file):
        raise NotReplayable(f"{payloads.PAYLOAD_MISSING}: the offloaded payload is gone.")


def _consumers_of(message: Message) -> list[Consumer]:
    return list(
        Consumer.objects.filter(channel_id=message.channel_id)
        .only("pk", "public_id", "ordering", "created_at", "event_types")
        .order_by("pk")
    )


def _replay_to(message: Message, consumers: list[Consumer]) -> ReplayResult:
    jobs = {
        job.consumer_id: job
        for job in Job.objects.filter(message=message, consumer__in=consumers).only(
            "pk", "consumer_id", "status", "ordering_key"
        )
    }
    result = ReplayResult()
    to_replay: list[int] = []
    to_create: list[int] = []
    for consumer in consumers:
        job = jobs.get(consumer.pk)
        if job is None and not event_types.matches(consumer.event_types, message.event_type):
            result.skipped.append(Skipped(consumer.public_id, "", NOT_SUBSCRIBED))
        elif job is None and consumer.created_at > message.received_at:
            to_create.append(consumer.pk)
            result.created.append(consumer.public_id)
        elif job is None:
            result.skipped.append(Skipped(consumer.public_id, "", JOB_DELETED))
        elif job.status != DELIVERED:
            result.skipped.append(Skipped(consumer.public_id, job.status, SKIP_REASONS[job.status]))
        elif key_busy(consumer, job.ordering_key):
            result.skipped.append(Skipped(consumer.public_id, job.status, KEY_BUSY))
        else:
            to_replay.append(job.pk)
            result.replayed.append(consumer.public_id)
    # A DELIVERED job changes only by a replay, and replays of this message wait for our lock:
    # the conditional UPDATE moves exactly the jobs read as DELIVERED above.
    queue.replay_delivered(to_replay)
    queue.add_jobs(message, to_create, timezone.now())
    return result


def _mark_dispatched(message: Message) -> None:
    """A message published while its channel had no consumer (ACKNOWLEDGED) has jobs now."""
    if message.status == ACKNOWLEDGED:
        Message.objects.filter(pk=message.pk).transition(
            ACKNOWLEDGED, DISPATCHED, dispatched_at=timezone.now()
        )
