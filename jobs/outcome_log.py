"""A log line per delivery outcome (docs/observability.md): each push attempt once its outcome is
recorded (`Dispatcher.complete`, the one place that records them), and each report of a pull
consumer that moves its job to DELIVERED or DEAD, or gives it back to the queue (a retry).

Logger `broker.deliveries`: INFO, or WARNING when the job goes DEAD, with the reason. The fields
go with `extra=` (keys of the object with BROKER_LOG_FORMAT=json) and are said in the message
too. None is secret: public IDs, the status, the error class and the job's last error, which
never holds the callback URL (`describe_error` in jobs/delivery.py) nor an answer's body (a
pull worker's last error is what the worker itself reported).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.utils import timezone

from broker.logs import one_line
from broker.tracing import parse
from jobs.delivery import AttemptResult
from jobs.models import Job
from jobs.retry import Outcome, Verdict

logger = logging.getLogger("broker.deliveries")


def log_attempt(result: AttemptResult, outcome: Outcome) -> None:
    """The line of one push attempt and what it did to its job."""
    level = logging.WARNING if outcome.verdict is Verdict.DEAD else logging.INFO
    if not logger.isEnabledFor(level):
        return
    names = result.names
    fields: dict[str, Any] = {
        "job_id": names.job if names else "",
        "message_id": names.message if names else "",
        "channel": names.channel if names else "",
        "consumer": names.consumer if names else "",
        "consumer_type": "push",
        "attempt": result.attempt,
        "outcome": outcome.verdict.value,
        "status_code": result.status_code,
        "error_class": result.error_class,
        "duration_ms": round(result.duration_ms, 1),
    }
    if outcome.due_at is not None:
        fields["retry_at"] = outcome.due_at.isoformat()
    if names and names.trace_id:
        fields["trace_id"] = names.trace_id
    if outcome.reason:
        fields["reason"] = one_line(outcome.reason)
    _log(level, fields)


@dataclass(frozen=True)
class PullReport:
    """What the log line of a pull consumer's report says of its job, read before the move
    changes it: `taken_at` is when the consumer took the job."""

    job_id: str
    message_id: str
    channel: str
    consumer: str
    attempt: int
    taken_at: datetime
    traceparent: str | None = None
    tracestate: str | None = None

    @classmethod
    def of(cls, job: Job) -> PullReport:
        """From the job with its message and consumer."""
        message = job.message
        return cls(
            job.public_id,
            message.public_id,
            message.channel_id,
            job.consumer.public_id,
            job.attempts,
            job.status_changed_at,
            message.traceparent,
            message.tracestate,
        )

    def log(self, verdict: Verdict, reason: str = "", due_at: datetime | None = None) -> None:
        """The line of the report: `duration_ms` is how long the consumer held the job. Nothing is
        built when the line would not be written."""
        level = logging.WARNING if verdict is Verdict.DEAD else logging.INFO
        if not logger.isEnabledFor(level):
            return
        held_ms = (timezone.now() - self.taken_at).total_seconds() * 1000
        fields: dict[str, Any] = {
            "job_id": self.job_id,
            "message_id": self.message_id,
            "channel": self.channel,
            "consumer": self.consumer,
            "consumer_type": "pull",
            "attempt": self.attempt,
            "outcome": verdict.value,
            "status_code": None,
            "error_class": "",
            "duration_ms": round(held_ms, 1),
        }
        if due_at is not None:
            fields["retry_at"] = due_at.isoformat()
        trace = parse(self.traceparent, self.tracestate)
        if trace:
            fields["trace_id"] = trace.trace_id
        if reason:
            fields["reason"] = one_line(reason)  # a worker's own words may hold line breaks
        _log(level, fields)


def _log(level: int, fields: dict[str, Any]) -> None:
    # `reason` comes last in the text: everything after `reason=` is the reason.
    said = " ".join(f"{key}={'-' if value is None else value}" for key, value in fields.items())
    logger.log(level, "delivery %s", said, extra=fields)
