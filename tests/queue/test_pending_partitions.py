"""The push claim plans only the partitions of jobs that can hold pending work
(jobs/partitions/pending.py): a job old enough to lie below the claim's lower bound is still
claimed when it is pending, requeued or replayed, by this process at once and by a dispatcher
process once the requeue commits."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from jobs import partitions, queue
from jobs.models import Job
from jobs.partitions import pending
from jobs.partitions.pending import EARLIEST
from jobs.queue import dead_jobs
from jobs.queue.postgres import claim_parameters
from jobs.queue.queries import statement
from jobs.states import DEAD, DELIVERED, QUEUED, JobStatus
from tests.helpers import make_job
from tests.processes import kill_if_running, start_dispatcher, stop, wait_until

pytestmark = pytest.mark.django_db
OLD = timedelta(days=40)  # several 7-day partitions back: below the bound of young work


def old_job(status: JobStatus) -> Job:
    """A job of a push consumer, due, in a partition of OLD ago (as the database's clock has it:
    partition_at is its now() when a job is made)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT now()")
        (database_now,) = cursor.fetchone()
    at = database_now - OLD
    partitions.ensure_partitions(database_now, since=at)
    job = make_job(status)
    Job.objects.filter(pk=job.pk).update(partition_at=at, next_attempt_at=timezone.now())
    job.refresh_from_db()
    return job


def partition_of(job: Job) -> partitions.Partition:
    covering = partitions.partitions(partitions.JOBS)
    return next(p for p in covering if (p.start or EARLIEST) <= job.partition_at < p.end)


def planned_partitions() -> set[str]:
    """The partitions of jobs the claim's plan reads, for this process's bound."""
    parameters = claim_parameters(10, timezone.now(), queue.ClaimRooms.unbounded(10), None)
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN " + statement("claim_for_push"), parameters)
        plan = "\n".join(row[0] for row in cursor.fetchall())
    return {p.name for p in partitions.partitions(partitions.JOBS) if f" {p.name} " in plan}


def claimed_ids() -> set[int]:
    return {job.job_id for job in queue.claim_for_push(10)}


def test_partitions_without_pending_work_are_left_out_of_the_claims_plan():
    finished = old_job(DELIVERED)
    young = make_job(QUEUED)

    planned = planned_partitions()

    assert partition_of(finished).name not in planned
    assert partition_of(young).name in planned
    assert len(planned) < len(partitions.partitions(partitions.JOBS))
    assert claimed_ids() == {young.pk}


def test_a_pending_job_in_an_old_partition_brings_that_partition_into_the_claim():
    waiting = old_job(QUEUED)

    assert pending.pending_from() == partition_of(waiting).start
    assert partition_of(waiting).name in planned_partitions()
    assert claimed_ids() == {waiting.pk}


@pytest.mark.parametrize("requeue", ["one", "batch"])
def test_an_old_dead_job_requeued_is_claimed_by_the_next_claim(requeue):
    dead = old_job(DEAD)
    assert claimed_ids() == set()  # the bound is worked out, and the dead job's partition below it
    assert pending.pending_from() > dead.partition_at

    if requeue == "one":
        Job.objects.filter(pk=dead.pk).requeue_dead()
    else:
        assert dead_jobs.take_keys(dead_jobs.REQUEUE, [dead.pk]) == 1

    assert claimed_ids() == {dead.pk}


def test_a_job_made_pending_unannounced_is_claimed_once_the_bound_is_worked_out_again(
    monkeypatch,
):
    clock = [1000.0]
    monkeypatch.setattr(pending._bound, "clock", lambda: clock[0])
    dead = old_job(DEAD)
    assert claimed_ids() == set()
    Job.objects.filter(pk=dead.pk).update(status=QUEUED)  # no state machine, no announcement

    assert claimed_ids() == set()  # the bound is kept for REFRESH_SECONDS
    clock[0] += pending.REFRESH_SECONDS
    assert claimed_ids() == {dead.pk}


@pytest.mark.django_db(transaction=True)
def test_a_dispatcher_process_claims_an_old_job_requeued_while_it_runs(channel, receiver):
    from tests.delivery import push_consumer

    consumer = push_consumer(channel, receiver)
    dead = old_job(DEAD)
    Job.objects.filter(pk=dead.pk).update(consumer=consumer)
    young = make_job(QUEUED)
    Job.objects.filter(pk=young.pk).update(consumer=consumer)
    # A 30 s poll: only the requeue's NOTIFY can make the dispatcher claim again soon, and then
    # only a bound worked out again finds the old job.
    process = start_dispatcher("--poll-seconds", "30")
    try:
        wait_until(lambda: Job.objects.get(pk=young.pk).status == DELIVERED, seconds=30)
        Job.objects.filter(pk=dead.pk).requeue_dead()
        # Within the bound's refresh, by far: a claim at the NOTIFY takes milliseconds.
        wait_until(
            lambda: Job.objects.get(pk=dead.pk).status == DELIVERED,
            seconds=pending.REFRESH_SECONDS / 2,
        )
        stop(process)
    finally:
        kill_if_running(process)
