"""Recording what became of push attempts that failed, and giving back jobs never sent.

The 2xx answers are recorded by one statement (jobs/queue/postgres.py, `record_deliveries`);
everything else is here.
"""

from __future__ import annotations

import functools
import operator
from collections import Counter
from collections.abc import Iterable
from datetime import datetime

from django.db.models import F, Q

from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.models import DeliveryAttempt, Job, JobQuerySet
from jobs.queue import circuit
from jobs.queue.types import JobKey
from jobs.retry import Outcome, Verdict
from jobs.states import DEAD, INFLIGHT, QUEUED

FAILURE_ANSWER_CHARS = 300  # of a failed attempt's answer, in its consumer's last_failure


def record_failures(
    failed: list[AttemptResult],
    outcomes: dict[int, Outcome],
    answered: set[int],
    dispatcher_id: str,
    now: datetime,
) -> dict[int, Outcome]:
    """Failed attempts: a row each, the circuits of consumers that were unavailable, then each
    job QUEUED at its own due time, or DEAD. Returns the outcomes applied, by job.

    The jobs are locked first, so that one deleted meanwhile (with its consumer) is skipped
    rather than given an attempt row that points nowhere. Consumers in `answered` gave an answer
    in the same batch that shows them up (a 2xx, or a 4xx of their own choosing): their circuits
    close, and their failures do not count towards them.
    """
    if not failed:
        return {}
    present = set(
        by_keys((r.job_id, r.partition_at) for r in failed)
        .select_for_update()
        .values_list("pk", flat=True)
    )
    failed = [r for r in failed if r.job_id in present]
    DeliveryAttempt.objects.bulk_create(attempt_row(result, dispatcher_id) for result in failed)
    note_last_failures(failed)
    unavailable = Counter(
        r.consumer_id
        for r in failed
        if outcomes[r.job_id].unavailable and r.consumer_id not in answered
    )
    reopened = circuit.record_unavailable(unavailable, now)
    circuit.close_circuits({r.consumer_id for r in failed} & answered)
    throttle(
        {
            r.consumer_id: until
            for r in failed
            if (until := outcomes[r.job_id].throttle_until) is not None
        }
    )
    applied = {}
    for result in failed:
        outcome = outcomes[result.job_id]
        if outcome.unavailable and result.consumer_id in reopened:
            # A failed probe uses no attempt; it waits for the circuit to half-open again (its
            # error says so, never that attempts were used up: the job is QUEUED).
            reason = f"{result.error}; circuit open again, attempt not counted"
            outcome = Outcome(Verdict.RETRY, reason, reopened[result.consumer_id], refund=True)
        _apply(result, outcome)
        applied[result.job_id] = outcome
    return applied


def note_last_failures(failed: list[AttemptResult]) -> None:
    """Keep each consumer's newest failure on its row (Consumer.last_failure...), unless a newer
    one is there already (another dispatcher's, recorded first).

    A row another transaction holds (a claim booking its slots, another recording) is skipped
    rather than waited for: a summary must never make recordings wait, let alone deadlock with
    the statement that closes circuits. It then misses that failure, and shows the next one."""
    newest: dict[int, AttemptResult] = {}
    for result in failed:
        known = newest.get(result.consumer_id)
        if known is None or result.started_at > known.started_at:
            newest[result.consumer_id] = result
    for consumer_id in sorted(newest):
        result = newest[consumer_id]
        older = Consumer.objects.filter(
            Q(last_failure_at__isnull=True) | Q(last_failure_at__lt=result.started_at),
            pk=consumer_id,
        )
        circuit.free_rows(older).update(
            last_failure_at=result.started_at,
            last_failure=failure_summary(result),
        )


def failure_summary(result: AttemptResult) -> str:
    """What went wrong, in one line: the error and the start of the answer, if there was one."""
    answer = " ".join(result.response_excerpt.split())[:FAILURE_ANSWER_CHARS]
    return f"{result.error}: {answer}" if answer else result.error


def throttle(until: dict[int, datetime]) -> None:
    """Hold back every job of these consumers until their time (a 429's Retry-After), unless a
    later time holds them already. A row another transaction holds is skipped: the dispatcher
    holds the consumer's jobs back meanwhile, and its next 429 says so again."""
    for consumer_id in sorted(until):
        later = until[consumer_id]
        earlier = Consumer.objects.filter(
            Q(throttled_until__isnull=True) | Q(throttled_until__lt=later), pk=consumer_id
        )
        circuit.free_rows(earlier).update(throttled_until=later)


def release_unsent(keys: Iterable[JobKey]) -> int:
    """Give claimed jobs that were never sent back to the queue, without using an attempt and
    in their place: they keep the due time they were claimed at. By their whole primary keys,
    (id, partition_at), as the claim returned them."""
    return by_keys(keys).transition(
        INFLIGHT, QUEUED, attempts=F("attempts") - 1, lease_expires_at=None
    )


def _apply(result: AttemptResult, outcome: Outcome) -> None:
    """One failed attempt's outcome: its job QUEUED again at its due time, or DEAD."""
    jobs = still_ours(result)
    if outcome.verdict is Verdict.RETRY:
        jobs.transition(
            INFLIGHT,
            QUEUED,
            next_attempt_at=outcome.due_at,
            lease_expires_at=None,
            last_error=outcome.reason,
            attempts=F("attempts") - 1 if outcome.refund else F("attempts"),
        )
    elif outcome.verdict is Verdict.DEAD:
        jobs.transition(INFLIGHT, DEAD, lease_expires_at=None, last_error=outcome.reason)
    if outcome.pause_consumer:  # skipped if its row is held: the next 410 pauses it
        circuit.free_rows(Consumer.objects.filter(pk=result.consumer_id)).update(paused=True)


def still_ours(result: AttemptResult) -> JobQuerySet:
    """The result's job if it still holds the claim the result is of: a job whose lease expired
    and that another dispatcher took again has one more attempt, and is left to that holder."""
    return by_keys([(result.job_id, result.partition_at)]).filter(attempts=result.attempt)


def by_keys(keys: Iterable[JobKey]) -> JobQuerySet:
    """The jobs of these whole primary keys: each is looked for in its own time partition
    (jobs/partitions.py), where an id alone probes every partition's index."""
    keys = list(keys)
    if not keys:
        return Job.objects.none()
    pairs = (Q(pk=pk, partition_at=partition_at) for pk, partition_at in keys)
    return Job.objects.filter(functools.reduce(operator.or_, pairs))


def attempt_row(result: AttemptResult, dispatcher_id: str) -> DeliveryAttempt:
    return DeliveryAttempt(
        job_id=result.job_id,
        consumer_id=result.consumer_id,
        attempt_number=result.attempt,
        started_at=result.started_at,
        duration_ms=result.duration_ms,
        status_code=result.status_code,
        error_class=result.error_class,
        response_excerpt=result.response_excerpt,
        request_headers=result.request_headers,
        response_headers=result.response_headers,
        dispatcher_id=dispatcher_id,
    )
