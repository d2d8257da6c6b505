"""Recording what became of a batch of push attempts, and giving back jobs never sent.

Every outcome of a batch, 2xx answers and failures alike, is recorded by one statement, one
round trip (sql/outcomes.sql, `record_outcomes`): an attempt row each, each job moved on by its
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
    targets = {TARGETS[outcome.verdict] for outcome in outcomes.values()}
    if any(outcome.unavailable for outcome in outcomes.values()):
        targets.add(QUEUED)  # a failed probe waits, QUEUED, for its circuit to half-open again
    for target in targets:
        check_transition(INFLIGHT, target)
    parameters = {"dispatcher": dispatcher_id, "now": now, **_parameters(results, outcomes)}
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


def _parameters(results: list[AttemptResult], outcomes: dict[int, Outcome]) -> dict[str, Any]:
    """The statement's parameters. The jobs go in their keys' order, the order they are locked
    in (statements locking the same jobs then wait for each other rather than deadlock);
    `places` keeps the batch's order for what depends on it (which failure is the newest, which
    429's hold is the last)."""
    up = circuit.answered(results, outcomes)
    placed = sorted(enumerate(results), key=lambda item: (item[1].job_id, item[1].partition_at))
    ordered = [result for _, result in placed]
    return {
        "places": [place for place, _ in placed],
        **_job_parameters(ordered, outcomes),
        **_told_of_consumers(ordered, outcomes, up),
        **_consumer_parameters(results, up),
    }


def _job_parameters(
    results: Sequence[AttemptResult], outcomes: dict[int, Outcome]
) -> dict[str, Any]:
    """Per attempt, in the order given: its job's whole key and claim, its attempt row, and
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


def _told_of_consumers(
    results: Sequence[AttemptResult], outcomes: dict[int, Outcome], up: set[int]
) -> dict[str, Any]:
    """Per attempt, in the order given, what it tells of its consumer: whether it counts as
    unavailable towards the circuit, and for a failure its time and summary, a 429's hold and a
    410's pause. The statement counts only those whose job is still there (sql/circuit.sql,
    `consumer_outcomes`)."""
    by_job = [outcomes[r.job_id] for r in results]
    failed = [o.verdict is not Verdict.DELIVERED for o in by_job]
    return {
        "unavailable": [
            circuit.counts_as_unavailable(r, o, up) for r, o in zip(results, by_job, strict=True)
        ],
        "failed_at": [r.started_at if f else None for r, f in zip(results, failed, strict=True)],
        "failures": [
            failure_summary(r) if f else None for r, f in zip(results, failed, strict=True)
        ],
        "throttled_until": [
            o.throttle_until if f else None for o, f in zip(by_job, failed, strict=True)
        ],
        "pause": [f and o.pause_consumer for o, f in zip(by_job, failed, strict=True)],
    }


def _consumer_parameters(results: Sequence[AttemptResult], up: set[int]) -> dict[str, Any]:
    """Per consumer of the batch, in id order: whether it answered anywhere in the batch (its
    circuit closes); and the circuit breaker's settings."""
    consumers = sorted({r.consumer_id for r in results})
    return {
        "consumers": consumers,
        "answered": [c in up for c in consumers],
        **circuit.consumer_parameters(),
    }


def failure_summary(result: AttemptResult) -> str:
    """What went wrong, in one line: the error and the start of the answer, if there was one."""
    answer = " ".join(result.response_excerpt.split())[:FAILURE_ANSWER_CHARS]
    return f"{result.error}: {answer}" if answer else result.error


def release_unsent(keys: Iterable[JobKey]) -> int:
    """Give claimed jobs that were never sent back to the queue, without using an attempt and
    in their place: they keep the due time they were claimed at. By their whole primary keys,
    (id, partition_at), as the claim returned them, locked in that order (as record_outcomes
    locks them). How many went back."""
    keys = sorted(keys)
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
