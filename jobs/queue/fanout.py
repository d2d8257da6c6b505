"""Fan-out through the ORM: one QUEUED job per consumer for a message (portable publish and
release, and the new jobs of a replay)."""

from __future__ import annotations

from datetime import datetime

from broker.models import Message
from jobs.models import Job


def add_jobs(message: Message, consumer_ids: list[int], now: datetime) -> None:
    """One QUEUED job per consumer, due at `now`, with the message's priority and ordering key.

    Jobs are made in the order of `consumer_ids`; within a consumer, job IDs give the order in
    which an ordered consumer receives a key's messages.
    """
    Job.objects.bulk_create(new_jobs(message, consumer_ids, now))


def new_jobs(message: Message, consumer_ids: list[int], now: datetime) -> list[Job]:
    """The unsaved jobs `add_jobs` makes (a batch's are saved together)."""
    return [
        Job(
            message_id=message.pk,
            consumer_id=consumer_id,
            priority=message.priority,
            ordering_key=message.ordering_key,
            next_attempt_at=now,
            created_at=now,
            status_changed_at=now,
            enqueued_at=now,
        )
        for consumer_id in consumer_ids
    ]
