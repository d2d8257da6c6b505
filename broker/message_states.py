"""A message's status and the changes it may go through, like jobs/states.py for jobs.

A message is inserted ACKNOWLEDGED or DISPATCHED (published now) or SCHEDULED (for later); its
status changes only when jobs are made for it: by the release of a scheduled message, or by a
replay that gives a consumer who joined later its first job.
"""

from __future__ import annotations

from django.db import models


class MessageStatus(models.TextChoices):
    # Stored, but the channel had no consumer to fan out to.
    ACKNOWLEDGED = "ACKNOWLEDGED"
    # Jobs exist for every consumer the channel had when they were made (in the transaction
    # that made the message DISPATCHED).
    DISPATCHED = "DISPATCHED"
    # Published for later (docs/scheduled.md): no jobs yet. At `scheduled_for` it is released:
    # its jobs are created and it becomes DISPATCHED (or ACKNOWLEDGED), in one transaction.
    SCHEDULED = "SCHEDULED"


ACKNOWLEDGED, DISPATCHED, SCHEDULED = MessageStatus

ALLOWED_MESSAGE_TRANSITIONS: frozenset[tuple[MessageStatus, MessageStatus]] = frozenset(
    {
        (SCHEDULED, DISPATCHED),  # released, with a job per consumer the channel has then
        (SCHEDULED, ACKNOWLEDGED),  # released while the channel has no consumer
        (ACKNOWLEDGED, DISPATCHED),  # a replay made a job for a consumer that joined since
    }
)


class ForbiddenMessageTransition(ValueError):
    def __init__(self, source: str, target: str) -> None:
        super().__init__(f"A message cannot go from {source} to {target}.")


def check_message_transition(source: str, target: str) -> None:
    if (source, target) not in ALLOWED_MESSAGE_TRANSITIONS:
        raise ForbiddenMessageTransition(source, target)
