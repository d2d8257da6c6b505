"""Recording what became of a batch of push attempts, and giving back jobs never sent.

Every outcome of a batch, 2xx answers and failures alike, is recorded by one statement, one
round trip (queries.sql, `record_outcomes`): an attempt row each, each job moved on by its
outcome, and the consumers' rows brought up to date (the circuit breaker: jobs/queue/circuit.py;
each consumer's newest failure; a 429's hold; a 410's pause). This module gives it its
parameters, from the results and the outcomes the retry policy decided (jobs/retry.py), and
reads its answer.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone

from jobs.delivery import AttemptResult
from jobs.queue import circuit
from jobs.queue.queries import statement
from jobs.queue.types import JobKey
from jobs.retry import Outcome, Verdict
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, check_transition

FAILURE_ANSWER_CHARS = 300  # of a failed attempt's answer, in its consumer's last_failure
TARGETS = {Verdict.DELIVERED: DELIVERED, Verdict.RETRY: QUEUED, Verdict.DEAD: DEAD}


def record_outcomes(
    results: list[AttemptResult], outcomes: dict[int, Outcome], dispatcher_id: str, now: datetime
) -> dict[int, Outcome]:
    """Record the attempts and move their jobs on by their outcomes, in one statement. Returns
    the outcomes applied, by job: a failure's job deleted meanwhile has none, and a failed probe
    whose circuit opened again has the probe's (circuit.probe_outcome)."""
    if not results:
        return {}
    for verdict in {outcome.verdict for outcome in outcomes.values()}:
        check_transition(INFLIGHT, TARGETS[verdict])
    parameters: dict[str, Any] = {
        "dispatcher": dispatcher_id,
        "now": now,
        **_job_parameters(results, outcomes),
        **_consumer_parameters(results, outcomes),
    }
    with connection.cursor() as cursor:
        cursor.execute(statement("record_outcomes"), parameters)
        present, *opened = cursor.fetchone()
    reopened = circuit.opened(*opened)
    present = set(present or [])
    applied = {}
    for result in results:
        outcome = outcomes[result.job_id]
        if outcome.verdict is not Verdict.DELIVERED:
            if result.job_id not in present:
                continue
            if outcome.unavailable and result.consumer_id in reopened:
                outcome = circuit.probe_outcome(result, reopened[result.consumer_id])
        applied[result.job_id] = outcome
    return applied


def _job_parameters(
    results: Sequence[AttemptResult], outcomes: dict[int, Outcome]
) -> dict[str, Any]:
    """Per attempt, in the results' order: its job's whole key and claim, its attempt row, and
    where its job goes."""
    by_job = [outcomes[r.job_id] for r in results]
    return {
        "jobs": [r.job_id for r in results],
        "partitions": [r.partition_at for r in results],
        "batch_partitions": sorted({r.partition_at for r in results}),
        "attempts": [r.attempt for r in results],
        "job_consumers": [r.consumer_id for r in results],
        "started": [r.started_at for r in results],
        "durations": [r.duration_ms for r in results],
        "statuses": [r.status_code for r in results],
        "error_classes": [r.error_class for r in results],
        "excerpts": [r.response_excerpt for r in results],
        "request_headers": [json.dumps(list(r.request_headers)) for r in results],
        "response_headers": [json.dumps(list(r.response_headers)) for r in results],
        "targets": [TARGETS[o.verdict].value for o in by_job],
        "reasons": [o.reason if o.verdict is not Verdict.DELIVERED else "" for o in by_job],
        "due": [o.due_at if o.verdict is Verdict.RETRY else None for o in by_job],
        "refunds": [o.verdict is Verdict.RETRY and o.refund for o in by_job],
        "probe_reasons": [
            circuit.probe_reason(r) if o.unavailable else None
            for r, o in zip(results, by_job, strict=True)
        ],
    }


def _consumer_parameters(
    results: Sequence[AttemptResult], outcomes: dict[int, Outcome]
) -> dict[str, Any]:
    """Per consumer of the batch, in id order (the order their rows are locked in): what the
    circuit breaker needs, its newest failure, the latest 429's hold (the last in the batch),
    and whether it answered 410."""
    up = circuit.answered(results, outcomes)
    unavailable = circuit.unavailable(results, outcomes, up)
    failed = [r for r in results if outcomes[r.job_id].verdict is not Verdict.DELIVERED]
    newest: dict[int, AttemptResult] = {}
    for result in failed:
        known = newest.get(result.consumer_id)
        if known is None or result.started_at > known.started_at:
            newest[result.consumer_id] = result
    held = {r.consumer_id: until for r in failed if (until := outcomes[r.job_id].throttle_until)}
    gone = {r.consumer_id for r in failed if outcomes[r.job_id].pause_consumer}
    consumers = sorted({r.consumer_id for r in results})
    return {
        "consumers": consumers,
        "answered": [c in up for c in consumers],
        "unavailable": [unavailable[c] for c in consumers],
        "failed_at": [newest[c].started_at if c in newest else None for c in consumers],
        "failures": [failure_summary(newest[c]) if c in newest else None for c in consumers],
        "throttled_until": [held.get(c) for c in consumers],
        "pause": [c in gone for c in consumers],
        **circuit.consumer_parameters(),
    }


def failure_summary(result: AttemptResult) -> str:
    """What went wrong, in one line: the error and the start of the answer, if there was one."""
    answer = " ".join(result.response_excerpt.split())[:FAILURE_ANSWER_CHARS]
    return f"{result.error}: {answer}" if answer else result.error


def release_unsent(keys: Iterable[JobKey]) -> int:
    """Give claimed jobs that were never sent back to the queue, without using an attempt and
    in their place: they keep the due time they were claimed at. By their whole primary keys,
    (id, partition_at), as the claim returned them. How many went back."""
    keys = list(keys)
    if not keys:
        return 0
    check_transition(INFLIGHT, QUEUED)
    parameters: dict[str, Any] = {
        "jobs": [key for key, _ in keys],
        "partitions": [partition_at for _, partition_at in keys],
        "changed_at": timezone.now(),
    }
    with connection.cursor() as cursor:
        cursor.execute(statement("release_unsent"), parameters)
        return int(cursor.rowcount)
