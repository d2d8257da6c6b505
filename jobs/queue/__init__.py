"""The job queue: the one owner of every operation that makes jobs, hands them out and finishes
them, and of the rules those follow (jobs/queue/rules.py).

- fan-out: `insert_message` (a published message with one job per consumer of its channel),
  `insert_messages` (a batch of them),
  `release_due_messages` (scheduled messages), `add_jobs` and `replay_delivered` (replay);
- claims: `claim_for_push` (dispatchers), `claim_for_pull` and `take_for_pull` (pull consumers);
- outcomes: `record_outcomes` (push attempts), `release_unsent` (claimed, never sent),
  `acknowledge_pull_job` and `report_pull_outcomes` (a pull consumer's reports on one job, and
  on many at once), `extend_leases` (a pull worker still busy with the jobs it holds);
- leases and age: `sweep_expired_leases`, `expire_old_jobs`, `restart_age`;
- wake-up: `wake_dispatchers` (at commit, if a dispatcher guards) and `Listener` (a dispatcher's
  LISTEN connection and the guard it holds there while idle: jobs/queue/wakeup.py).

The store is PostgreSQL: each operation runs statements of jobs/queue/sql/, by name
(jobs/queue/queries.py), from the module that owns it: postgres.py (publishing, release, replay,
the push claim), outcomes.py (push outcomes), postgres_pull.py (pull consumers), dispatchers.py,
dead_jobs.py. Requeues of single dead
jobs, and a pull consumer's report on one job that is not the common INFLIGHT -> DELIVERED or
DEAD, are single state changes: the state machine's own (jobs/models/job.py, jobs/states.py).
Requeue and purge of many dead jobs go in batches: jobs/queue/dead_jobs.py (driven by
jobs/dlq_actions.py).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone

from broker.models import Message
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.models import Job, named_by
from jobs.queue import dispatchers, postgres, postgres_pull
from jobs.queue import outcomes as outcomes_module
from jobs.queue.expiry import expire_old_jobs, restart_age
from jobs.queue.leases import sweep_expired_leases, take_for_pull, with_readable_payloads
from jobs.queue.outcomes import release_unsent
from jobs.queue.reports import (
    PULL_FAILED,
    LeaseRequest,
    extend_leases,
    held_report,
    report_pull_outcomes,
)
from jobs.queue.rules import lease_expiry
from jobs.queue.types import (
    ClaimedJob,
    ClaimRooms,
    Inserted,
    InsertedBatch,
    JobKey,
    MessageBatch,
    NamedJob,
    NewMessage,
    OutcomeReport,
    OutgoingMessage,
    PullCredentials,
    ReportResult,
    TokenDigests,
)
from jobs.queue.wakeup import Guard, Listener
from jobs.retry import Outcome, Verdict
from jobs.states import DELIVERED, INFLIGHT, QUEUED, JobStatus, check_transition

__all__ = [
    "PULL_FAILED",
    "RELEASE_BATCH",
    "ClaimRooms",
    "ClaimedJob",
    "Guard",
    "Inserted",
    "InsertedBatch",
    "JobKey",
    "LeaseRequest",
    "Listener",
    "MessageBatch",
    "NewMessage",
    "OutcomeReport",
    "OutgoingMessage",
    "PullCredentials",
    "ReportResult",
    "TokenDigests",
    "acknowledge_pull_job",
    "add_jobs",
    "claim_for_pull",
    "claim_for_push",
    "expire_old_jobs",
    "extend_leases",
    "insert_message",
    "insert_messages",
    "reclaim_from_dead_dispatchers",
    "record_outcomes",
    "release_due_messages",
    "release_unsent",
    "replay_delivered",
    "report_pull_outcomes",
    "restart_age",
    "sweep_expired_leases",
    "take_for_pull",
    "wake_dispatchers",
]

RELEASE_BATCH = 500  # scheduled messages released per call (and per transaction) by default


def insert_message(message: Message, tokens: TokenDigests | None = None) -> Inserted:
    """Insert an unsaved, unscheduled message and one QUEUED job per consumer its channel has,
    atomically, and wake the dispatchers at commit. Sets the message's key, status (DISPATCHED,
    or ACKNOWLEDGED when the channel has no consumer) and dispatch time. Inserts nothing when the
    channel or the producer does not exist, when `tokens` are given and do not both match, or
    when the producer may not publish to the channel (rules.producer_may_publish; the result
    says which); IntegrityError when the channel has a message with that ID. Inside a caller's
    transaction it joins it (outbox)."""
    return postgres.insert_message(message, tokens)


def insert_messages(batch: MessageBatch) -> InsertedBatch:
    """Insert a batch's messages and, for each unscheduled one, one QUEUED job per consumer its
    channel has, atomically; wake the dispatchers once, at commit. The keys come back in the
    batch's order, and job IDs follow it. Inserts nothing when the channel or the producer does
    not exist, or the producer may not publish to the channel (the result says which);
    IntegrityError, with nothing inserted, when an ID is already the channel's. Inside a
    caller's transaction it joins it (outbox)."""
    return postgres.insert_messages(batch)


def release_due_messages(now: datetime | None = None, limit: int = RELEASE_BATCH) -> int:
    """Release up to `limit` scheduled messages due at `now`; return how many were released.

    One call is one transaction: each due message (SCHEDULED, `scheduled_for <= now`, oldest due
    first) gets one QUEUED job per consumer its channel has at this moment and becomes
    DISPATCHED (ACKNOWLEDGED, without jobs, when the channel has no consumer); dispatchers are
    woken. Safe from any number of processes at once: every message is released exactly once,
    and a caller never waits for another. A return value equal to `limit` means more may be
    due: call again at once.
    """
    return postgres.release_due_messages(now or timezone.now(), limit)


def add_jobs(message: Message, consumer_ids: list[int], now: datetime) -> None:
    """One QUEUED job per consumer of `consumer_ids` for `message` (replay: consumers that joined
    its channel after it was published), due at `now`, with the message's priority and ordering
    key. Jobs are made in the order of `consumer_ids`; within a consumer, job IDs give the order
    in which an ordered consumer receives a key's messages. The caller wakes the dispatchers."""
    postgres.add_jobs(message, consumer_ids, now)


def replay_delivered(job_ids: list[int]) -> int:
    """Queue these DELIVERED jobs again (replay); the caller wakes the dispatchers."""
    return Job.objects.filter(pk__in=job_ids).replay_delivered()


def claim_for_push(
    limit: int,
    now: datetime | None = None,
    rooms: ClaimRooms | None = None,
    dispatcher_id: str | None = None,
) -> list[ClaimedJob]:
    """Take up to `limit` due jobs of push consumers that may receive (rules.py), best priority
    first, taking turns between consumers: INFLIGHT under a lease, one attempt more, whatever
    their requests need returned. `rooms`: how many of each consumer's jobs the dispatcher
    will take (jobs/fair_share.py); none: up to each consumer's maxInFlight. `dispatcher_id`
    marks the jobs as that dispatcher's, so that they go back to the queue early if it dies
    (`reclaim_from_dead_dispatchers`).

    Any number of dispatchers may claim at once: no job is taken twice.
    """
    check_transition(QUEUED, INFLIGHT)
    claimed = postgres.claim_for_push(
        limit, now or timezone.now(), rooms or ClaimRooms.unbounded(limit), dispatcher_id
    )
    return sorted(claimed, key=lambda job: (-job.priority, job.due_at))


def claim_for_pull(
    consumer: Consumer | PullCredentials, limit: int, lease_seconds: int | None = None
) -> list[Job]:
    """Atomically move up to `limit` of the consumer's due jobs QUEUED -> INFLIGHT, best priority
    first, under a lease of `lease_seconds` (None: the delivery timeout and its grace, as for
    push), one attempt more; each with its message as far as a worker is given it.

    `consumer`: one the caller checked and found not paused, or the credentials of a request
    (jobs/api/access.py, `proven_credentials`), which the statement checks: it then claims
    nothing unless they match, the consumer is not paused and its ordering is the one they name.

    Competing workers take different jobs instead of waiting on each other (SKIP LOCKED), and no
    job is handed out twice (the conditional transition). An ordered
    consumer gets only the head of each ordering key, as push consumers do. A job whose offloaded
    payload is gone goes DEAD instead of to the worker.
    """
    check_transition(QUEUED, INFLIGHT)
    now = timezone.now()
    lease_until = (
        lease_expiry(now) if lease_seconds is None else now + timedelta(seconds=lease_seconds)
    )
    claimed = postgres_pull.claim_for_pull(consumer, limit, lease_until, now)
    claimed.sort(key=lambda job: (-job.priority, job.pk))
    return with_readable_payloads(claimed)


def record_outcomes(
    results: list[AttemptResult],
    outcomes: dict[int, Outcome],
    dispatcher_id: str,
    now: datetime,
) -> dict[int, Outcome]:
    """Record push attempts and move their jobs on by their outcomes, in one statement: 2xx
    answers DELIVERED, failures QUEUED again or DEAD, circuits opened or closed
    (jobs/queue/circuit.py), consumers' last failures, holds and pauses noted. Only a job still
    under the claim a result is of moves. Returns the outcomes applied, by job (a failure's job
    deleted meanwhile has none)."""
    return outcomes_module.record_outcomes(results, outcomes, dispatcher_id, now)


def acknowledge_pull_job(
    consumer: PullCredentials, public_id: str, target: JobStatus, reason: str
) -> bool:
    """A pull consumer's report on one INFLIGHT job it holds: DELIVERED, or DEAD with `reason` as
    its last error; one statement, which checks the consumer's credentials too, and the outcome's
    log line. False when it moved nothing (the credentials did not match, the job is not the
    consumer's, not INFLIGHT, or was moved meanwhile), which the caller looks into."""
    check_transition(INFLIGHT, target)
    named = named_by(public_id)
    if named is None:
        return False
    key, created = named
    job = NamedJob(key, consumer, created, created + timedelta(seconds=1))
    held = postgres_pull.acknowledge_pull_job(job, target, reason, timezone.now())
    if held is None:
        return False
    verdict = Verdict.DELIVERED if target == DELIVERED else Verdict.DEAD
    held_report(public_id, consumer.consumer_id, held).log(verdict, reason)
    return True


def wake_dispatchers() -> None:
    """Wake idle dispatchers when the current transaction commits (PostgreSQL's NOTIFY), as a
    publish does: only if one guards (jobs/queue/wakeup.py)."""
    postgres.wake_dispatchers()


def reclaim_from_dead_dispatchers(dispatcher_id: str, now: datetime | None = None) -> int:
    """End the leases of the INFLIGHT jobs of dispatchers known dead, other than
    `dispatcher_id`: the next lease sweep gives them back at once (jobs/queue/dispatchers.py).
    Returns how many."""
    return dispatchers.reclaim_from_dead_dispatchers(dispatcher_id, now or timezone.now())
