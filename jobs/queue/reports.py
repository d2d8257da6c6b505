"""A pull consumer's reports on many of its jobs at once (docs/api.md, "Pull consumers"): each job
DELIVERED, DEAD, or given back to the queue, due again after a delay, or DEAD once it has used
all its attempts, as when its lease runs out (jobs/queue/leases.py).

One transaction whatever the batch's size: one read of the named jobs, locked, then one
conditional UPDATE for every move (jobs/queue/postgres_pull.py). The lock makes the UPDATE move
exactly the jobs the read found INFLIGHT, so nothing is read back: a job the lease sweep took
back first is read as QUEUED and refused, and one the sweep comes for meanwhile waits for the
report, after which it is no longer INFLIGHT.
Reports lock in key order, so two of them never deadlock. Each move goes through the state
machine's table of transitions and is logged once, after the commit (jobs/outcome_log.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.db import transaction
from django.utils import timezone

from broker.xids import key_of_xid
from consumers.models import Consumer
from jobs.models import job_public_id
from jobs.outcome_log import PullReport
from jobs.queue import postgres_pull
from jobs.queue.types import HeldRow, OutcomeReport, PullMove, ReportResult
from jobs.retry import Verdict, retry_delay
from jobs.states import (
    DEAD,
    DELIVERED,
    INFLIGHT,
    QUEUED,
    ForbiddenTransition,
    JobStatus,
    check_transition,
)

PULL_FAILED = "reported failed by the pull consumer"
PULL_GAVE_BACK = "given back by the pull consumer"
PULL_DEFERRED = "given back unstarted by the pull consumer"
VERDICTS = {DELIVERED: Verdict.DELIVERED, DEAD: Verdict.DEAD, QUEUED: Verdict.RETRY}


@dataclass
class _Held:
    """One of the consumer's jobs as the report's read found it (plain values: no model)."""

    pk: int
    status: str
    report: PullReport


@dataclass(frozen=True)
class _Move:
    """One job leaving INFLIGHT: where to, with what last error, due when (QUEUED)."""

    job: _Held
    target: JobStatus
    reason: str = ""
    due_at: datetime | None = None
    refund: bool = False


def report_pull_outcomes(
    consumer: Consumer, reports: Sequence[OutcomeReport], now: datetime | None = None
) -> list[ReportResult]:
    """Apply the consumer's reports on its INFLIGHT jobs; a result per report, in their order.

    A job already where its report asks is left alone; a job that is not the consumer's (or an
    ID that names no job) has no state; any other job that is not INFLIGHT is refused, with the
    state machine's reason. Reports after the first on the same job see it where the first left
    it.
    """
    for report in reports:
        check_transition(INFLIGHT, report.next_state)  # DELIVERED, DEAD or QUEUED
    now = now or timezone.now()
    results: list[ReportResult] = []
    moves: list[_Move] = []
    with transaction.atomic():
        jobs = _locked(consumer, [report.job_id for report in reports])
        for report in reports:
            job = jobs.get(report.job_id)
            if job is None or job.status != INFLIGHT:
                results.append(_unmoved(report, job))
                continue
            if _claimed_again(job, report.attempts):
                results.append(_fenced(report.job_id, job))
                continue
            move = _move(job, report, consumer, now)
            job.status = move.target  # a later report on the job sees where this one left it
            moves.append(move)
            results.append(ReportResult(report.job_id, move.target))
        _apply(moves, now)
    for move in moves:
        move.job.report.log(VERDICTS[move.target], move.reason, move.due_at)
    return results


@dataclass(frozen=True)
class LeaseRequest:
    """A pull worker's ask to move the end of a job's lease; `attempts` as in OutcomeReport."""

    job_id: str
    until: datetime
    attempts: int | None = None


def extend_leases(consumer: Consumer, leases: Sequence[LeaseRequest]) -> list[ReportResult]:
    """Each lease asked for ends at its new time if the job is still INFLIGHT under the same
    claim (a lease that ran out and was not swept yet included). A result per lease, in their
    order: INFLIGHT when extended, the job's state with why not, or None for a job that is not
    the consumer's."""
    results: list[ReportResult] = []
    extended: dict[int, datetime] = {}
    with transaction.atomic():
        jobs = _locked(consumer, [lease.job_id for lease in leases])
        for lease in leases:
            job = jobs.get(lease.job_id)
            if job is None:
                results.append(ReportResult(lease.job_id, None))
            elif job.status != INFLIGHT:
                why = f"The job is {job.status}: its lease ran out before it was extended."
                results.append(ReportResult(lease.job_id, JobStatus(job.status), why))
            elif _claimed_again(job, lease.attempts):
                results.append(_fenced(lease.job_id, job))
            else:
                extended[job.pk] = lease.until
                results.append(ReportResult(lease.job_id, INFLIGHT))
        if extended:
            postgres_pull.extend_leases(list(extended), list(extended.values()))
    return results


def _locked(consumer: Consumer, public_ids: list[str]) -> dict[str, _Held]:
    """The consumer's jobs among `public_ids`, by public ID, locked until the transaction ends."""
    keys = [parts[1] for parts in map(key_of_xid, public_ids) if parts is not None]
    if not keys:
        return {}
    jobs = {}
    for pk, created, status, *held in postgres_pull.lock_reported(consumer, keys):
        job_id = job_public_id(pk, created)  # an ID with another creation second names no job
        jobs[job_id] = _Held(pk, status, held_report(job_id, consumer.public_id, tuple(held)))
    return jobs


def held_report(job_id: str, consumer_id: str, held: HeldRow) -> PullReport:
    """The log line's values of a job read as HELD_COLUMNS, before its move (`consumer_id`: the
    consumer's public ID)."""
    attempts, taken_at, message_id, channel, traceparent, tracestate = held
    return PullReport(
        job_id, message_id, channel, consumer_id, attempts, taken_at, traceparent, tracestate
    )


def _claimed_again(job: _Held, attempts: int | None) -> bool:
    """Whether the worker names an earlier claim of the job than the one that holds it now: its
    lease ran out, the sweep gave the job back, and it was claimed again (each claim counts an
    attempt, and a job is INFLIGHT with as many as its claim gave it)."""
    return attempts is not None and attempts != job.report.attempt


def _fenced(job_id: str, job: _Held) -> ReportResult:
    why = (
        f"The job was claimed again since: it is at attempt {job.report.attempt} now (its lease"
        " ran out and the sweep gave it back); another worker may hold it."
    )
    return ReportResult(job_id, INFLIGHT, why, claimed_again=True)


def _unmoved(report: OutcomeReport, job: _Held | None) -> ReportResult:
    """The result of a report on a job that is not INFLIGHT, or not the consumer's."""
    if job is None:
        return ReportResult(report.job_id, None)
    state = JobStatus(job.status)
    if state == report.next_state:
        return ReportResult(report.job_id, state)
    return ReportResult(report.job_id, state, str(ForbiddenTransition(state, report.next_state)))


def _move(job: _Held, report: OutcomeReport, consumer: Consumer, now: datetime) -> _Move:
    """Where an INFLIGHT job goes: a job given back with no attempt left is DEAD, as when its
    lease expires (jobs/queue/leases.py); one given back unstarted keeps the attempt it was
    charged, so it never dies of it; `backoff` waits as the consumer's retry schedule says."""
    said = f": {report.error}" if report.error else ""
    if report.next_state == DELIVERED:
        return _Move(job, DELIVERED)
    if report.next_state == DEAD:
        return _Move(job, DEAD, PULL_FAILED + said)
    due_at = now + timedelta(seconds=report.delay_seconds)
    if not report.attempted:
        return _Move(job, QUEUED, PULL_DEFERRED + said, due_at, refund=True)
    delay = retry_delay(consumer, job.report.attempt)
    if delay is None:  # every attempt used: len(retry delays) + 1
        return _Move(job, DEAD, f"{PULL_GAVE_BACK}{said}; no attempts left")
    if report.backoff:
        due_at = now + timedelta(seconds=delay)
    return _Move(job, QUEUED, PULL_GAVE_BACK + said, due_at)


def _apply(moves: list[_Move], now: datetime) -> None:
    """Every move in one conditional UPDATE."""
    for target in {move.target for move in moves}:
        check_transition(INFLIGHT, target)
    pull_moves = [PullMove(m.job.pk, m.target, m.reason, m.due_at, m.refund) for m in moves]
    moved = postgres_pull.apply_pull_moves(pull_moves, now) if moves else 0
    if moved != len(moves):  # the lock rules it out; never log or answer a move not made
        raise RuntimeError(f"{len(moves) - moved} locked INFLIGHT jobs did not move")
