"""The circuit breaker of push consumers (docs/delivery.md, "Circuit breaker"): a consumer that is
down is left alone. This module owns the rule; its SQL is in jobs/queue/sql/circuit.sql.

After BROKER_CIRCUIT_FAILURE_THRESHOLD attempts in a row find the consumer unavailable (no
answer, a 5xx, 429 or 408: jobs/retry.py `is_unavailable`), its circuit opens for
BROKER_CIRCUIT_COOLDOWN_SECONDS: the claim takes none of its jobs (sql/circuit.sql, `receiving`), so
none of them uses an attempt. When the cooldown is over the circuit is half-open: the claim takes
one job, the probe (sql/circuit.sql, `in_flight_cap`). Any answer that is not unavailability (a 2xx,
or a 4xx of the consumer's own: `answered`) closes the circuit; an unavailable probe opens it
again for twice as long (at most MAX_COOLDOWN_SECONDS) and gets its attempt back, so a consumer
that is down for days does not push its jobs into the dead-letter queue one probe at a time
(they expire after their age limit instead: jobs/queue/expiry.py).

The state lives in three consumer columns (`state` reads them), changed by the statement that
records a batch's outcomes (sql/outcomes.sql, `record_outcomes`, and its part
`consumer_outcomes`), in the same transaction; `consumer_parameters` gives it what this rule
needs, and `opened` reads back what it did. An operator may close a circuit at any time (`close`).

A recording never waits for a consumer's row (issue 36): a row another transaction holds (another
dispatcher's recording, a claim booking rate limit slots, an operator's edit, a process frozen
mid-transaction) is skipped. Its failures then go uncounted and its circuit is not closed by this
batch: the consumer's next attempts count, or close it, again. No recording, and so no
dispatcher, is ever held up by another's, and publishers never wait for any of them (the locks
are FOR NO KEY UPDATE, which the foreign-key checks of new jobs do not wait for).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime

from django.db import connection

from broker.conf import broker_settings
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.queue.queries import statement
from jobs.retry import Outcome, Verdict

logger = logging.getLogger(__name__)
MAX_COOLDOWN_SECONDS = 3600
# The states of a circuit, as the API, the UI and the metrics name them: closed (delivering),
# open (holding back until circuit_open_until), half-open (the cooldown is over: the next claim
# sends one probe).
CLOSED, OPEN, HALF_OPEN = STATES = ("closed", "open", "half-open")


def state(consumer: Consumer, now: datetime) -> str:
    """The consumer's circuit state now: one of STATES."""
    if consumer.circuit_open_until is None:
        return CLOSED
    return OPEN if now < consumer.circuit_open_until else HALF_OPEN


def close(consumer: Consumer) -> None:
    """Close the circuit now (an operator's decision); delivery resumes with the next claim."""
    with connection.cursor() as cursor:
        cursor.execute(statement("close_circuit"), {"consumer": consumer.pk})
    consumer.circuit_failures = 0
    consumer.circuit_open_until = None
    consumer.circuit_cooldown_seconds = 0


def answered(results: Sequence[AttemptResult], outcomes: dict[int, Outcome]) -> set[int]:
    """The consumers that showed themselves up in a batch: they answered, and not with
    "unavailable" (a 2xx, or a 4xx of their own). Their circuits close, and their failures in
    the batch do not count towards them."""
    return {
        r.consumer_id
        for r in results
        if r.status_code is not None and not outcomes[r.job_id].unavailable
    }


def counts_as_unavailable(result: AttemptResult, outcome: Outcome, up: set[int]) -> bool:
    """Whether an attempt of a batch counts towards its consumer's circuit: it found the
    consumer unavailable, and the consumer is not `up` (it answered elsewhere in the batch)."""
    return (
        outcome.unavailable
        and outcome.verdict is not Verdict.DELIVERED
        and result.consumer_id not in up
    )


def consumer_parameters() -> dict[str, int]:
    """The rule's settings, as the recording statement takes them (read at each recording, so
    that a change of them applies at once)."""
    return {
        "threshold": broker_settings.BROKER_CIRCUIT_FAILURE_THRESHOLD,
        "cooldown": broker_settings.BROKER_CIRCUIT_COOLDOWN_SECONDS,
        "max_cooldown": MAX_COOLDOWN_SECONDS,
    }


def opened(
    consumers: Sequence[int] | None,
    names: Sequence[str] | None,
    seconds: Sequence[int] | None,
    probes: Sequence[bool] | None,
    until: Sequence[datetime] | None,
) -> dict[int, datetime]:
    """The circuits a recording opened, as its statement returns them (arrays, or nulls for
    none): each is logged; returned are those whose probe failed, with when they half-open
    again."""
    reopened = {}
    for consumer_id, name, cooldown, probe, open_until in zip(
        consumers or [], names or [], seconds or [], probes or [], until or [], strict=True
    ):
        logger.warning("circuit of consumer %s open for %d s", name, cooldown)
        if probe:
            reopened[consumer_id] = open_until
    return reopened


# How a failed probe's job's last error ends (`probe_reason`); the operator UI's job page reads
# it to tell a probe given back from other attempts (broker/ui/attempt_history.py).
PROBE_NOT_COUNTED = "circuit open again, attempt not counted"


def probe_reason(result: AttemptResult) -> str:
    """The last error of a failed probe's job: waiting for the circuit to half-open again, its
    attempt not counted (never that attempts were used up: the job is QUEUED)."""
    return f"{result.error}; {PROBE_NOT_COUNTED}"


def probe_outcome(result: AttemptResult, half_opens_at: datetime) -> Outcome:
    """What became of a failed probe whose circuit opened again: the job waits for it, and the
    attempt is given back."""
    return Outcome(Verdict.RETRY, probe_reason(result), half_opens_at, refund=True)
