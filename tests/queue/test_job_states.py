"""The job state machine of docs/data-model.md: every allowed and forbidden transition, and
races."""

from __future__ import annotations

import functools
import itertools
from datetime import UTC, datetime

import pytest
import time_machine
from django.utils import timezone

from jobs.models import Job
from jobs.queue import take_for_pull
from jobs.states import (
    ALLOWED_TRANSITIONS,
    DEAD,
    DELIVERED,
    INFLIGHT,
    QUEUED,
    ForbiddenTransition,
    JobStatus,
    TransitionConflict,
)
from tests.helpers import at_once, make_job

pytestmark = pytest.mark.django_db

EXPECTED_TABLE = {
    (QUEUED, INFLIGHT),
    (INFLIGHT, DELIVERED),
    (INFLIGHT, QUEUED),
    (INFLIGHT, DEAD),
    (DEAD, QUEUED),
    (DEAD, INFLIGHT),
    (DELIVERED, QUEUED),  # replay (broker/replay.py)
    (QUEUED, DEAD),  # expired (jobs/queue/expiry.py)
}
ALL_PAIRS = list(itertools.product(JobStatus, JobStatus))
FORBIDDEN = [pair for pair in ALL_PAIRS if pair not in EXPECTED_TABLE]


def test_the_table_is_exactly_the_specified_one():
    assert set(ALLOWED_TRANSITIONS) == EXPECTED_TABLE


@pytest.mark.parametrize(("source", "target"), sorted(EXPECTED_TABLE))
def test_allowed_transition_moves_the_job(source, target):
    job = make_job(source)
    before = job.status_changed_at

    moved = Job.objects.filter(pk=job.pk).transition(source, target, last_error="x")

    job.refresh_from_db()
    assert moved == 1
    assert job.status == target
    assert job.last_error == "x"
    assert job.status_changed_at > before


@pytest.mark.parametrize(("source", "target"), FORBIDDEN)
def test_forbidden_transition_raises_and_changes_nothing(source, target):
    job = make_job(source)
    snapshot = Job.objects.filter(pk=job.pk).values().get()

    with pytest.raises(ForbiddenTransition, match=f"from {source} to {target}"):
        Job.objects.filter(pk=job.pk).transition(source, target, last_error="x")

    assert Job.objects.filter(pk=job.pk).values().get() == snapshot


def test_transition_from_a_status_the_job_no_longer_has_moves_nothing():
    job = make_job(DELIVERED)

    assert Job.objects.filter(pk=job.pk).transition(INFLIGHT, DEAD) == 0
    job.refresh_from_db()
    assert job.status == DELIVERED


def test_start_leases_the_job_and_uses_an_attempt(settings):
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 30
    settings.BROKER_RATIONAL_DELAY_SECONDS = 2
    job = make_job(QUEUED)

    with time_machine.travel("2026-01-01T00:00:00Z", tick=False):
        take_for_pull(job, incremental_timeout=10)

    assert job.status == INFLIGHT
    assert job.attempts == 1
    assert job.incremental_timeout == 10
    assert job.lease_expires_at == datetime(2026, 1, 1, 0, 0, 42, tzinfo=UTC)


def test_a_dead_job_can_be_started_again_and_counts_an_attempt():
    job = make_job(DEAD, attempts=3)

    take_for_pull(job)

    assert (job.status, job.attempts) == (INFLIGHT, 4)


@pytest.mark.parametrize("status", [INFLIGHT, DELIVERED])
def test_start_refuses_jobs_that_are_not_queued_or_dead(status):
    job = make_job(status)

    with pytest.raises(ForbiddenTransition):
        take_for_pull(job)

    job.refresh_from_db()
    assert (job.status, job.attempts) == (status, 0)


def test_delivered_clears_lease_and_error():
    job = make_job(INFLIGHT)
    Job.objects.filter(pk=job.pk).update(lease_expires_at=timezone.now(), last_error="boom")
    job.refresh_from_db()

    job.mark_delivered()

    assert (job.status, job.lease_expires_at, job.last_error) == (DELIVERED, None, "")


def test_mark_dead_records_the_reason():
    job = make_job(INFLIGHT)

    job.mark_dead("non-retryable status 400")

    assert (job.status, job.last_error) == (DEAD, "non-retryable status 400")


def test_requeue_resets_attempts_and_makes_the_job_due_now():
    job = make_job(DEAD, attempts=9)

    job.requeue()

    assert (job.status, job.attempts) == (QUEUED, 0)
    assert job.next_attempt_at <= timezone.now()


@pytest.mark.parametrize("action", ["mark_delivered", "mark_dead", "requeue"])
def test_named_transitions_refuse_the_wrong_source(action):
    job = make_job(QUEUED)

    with pytest.raises(ForbiddenTransition):
        getattr(job, action)(*(["reason"] if action == "mark_dead" else []))

    job.refresh_from_db()
    assert job.status == QUEUED


def test_stale_in_memory_job_gets_a_conflict_and_changes_nothing():
    job = make_job(INFLIGHT)
    stale = Job.objects.get(pk=job.pk)
    job.mark_delivered()

    with pytest.raises(TransitionConflict):
        stale.mark_dead("too late")

    job.refresh_from_db()
    assert (job.status, job.last_error) == (DELIVERED, "")


def test_bulk_requeue_moves_only_dead_jobs():
    dead = [make_job(DEAD, attempts=5) for _ in range(3)]
    alive = make_job(INFLIGHT, attempts=2)

    moved = Job.objects.filter(pk__in=[job.pk for job in [*dead, alive]]).requeue_dead()

    assert moved == 3
    assert set(Job.objects.filter(status=QUEUED).values_list("attempts", flat=True)) == {0}
    alive.refresh_from_db()
    assert (alive.status, alive.attempts) == (INFLIGHT, 2)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("source", "targets"),
    [
        (QUEUED, [INFLIGHT, INFLIGHT]),  # two dispatchers claim the same job
        (INFLIGHT, [DELIVERED, DEAD]),  # success report races a timeout verdict
        (DEAD, [QUEUED, INFLIGHT]),  # operator requeue races a pull consumer's retry
    ],
)
def test_racing_threads_exactly_one_wins(source, targets):
    jobs = [make_job(source) for _ in range(20)]
    for job in jobs:
        results: list[int] = []

        def race(target: JobStatus, job_id: int = job.pk, results=results) -> None:
            results.append(Job.objects.filter(pk=job_id).transition(source, target))

        at_once(*(functools.partial(race, target) for target in targets))

        assert sorted(results) == [0, 1]
        job.refresh_from_db()
        assert job.status in targets
