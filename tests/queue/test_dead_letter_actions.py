"""Requeue and purge of a whole dead-letter queue in batches (issue 21; jobs/dlq_actions.py,
jobs/queue/dead_jobs.py): bounded batches that bind no parameter per job, that neither wait on nor
block anyone else, progress that survives a vanished runner, and what the actions take."""

from __future__ import annotations

import itertools
import threading
from datetime import timedelta
from types import SimpleNamespace

import pytest
import time_machine
from django.db import OperationalError, connection, transaction
from django.utils import timezone

from broker import publish
from consumers.models import Consumer
from jobs import dlq_actions
from jobs.dlq_actions import (
    LEASE,
    PURGE,
    REQUEUE,
    act_on_jobs,
    continue_action,
    resume_actions,
    run,
    start,
    step,
)
from jobs.models import DeadLetterAction, DeliveryAttempt, Job
from jobs.queue import claim_for_push
from jobs.queue.dead_jobs import DeadRange, take_range
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.helpers import at_once, make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

FOREVER = 3600.0  # seconds of batches: a run that only ends when the queue is done


@pytest.fixture
def billing() -> Consumer:
    """The consumer whose dead-letter queue is acted on; "audit" shares its channel."""
    make_producer()
    channel = make_channel()
    make_consumer(channel, "audit")
    return make_consumer(channel, "billing")


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setattr(dlq_actions, "BATCH_SIZE", 2)


def dead_jobs(consumer: Consumer, count: int, *, ago: timedelta = timedelta(hours=1)) -> list[Job]:
    """`count` jobs of `consumer` that died `ago`, one a second apart, each with an attempt; the
    other consumers of the channel get a QUEUED job of each message."""
    died = timezone.now() - ago
    jobs = []
    for n in range(count):
        message = publish(consumer.channel_id, b"{}", producer="shop")
        job = Job.objects.get(message=message, consumer=consumer)
        Job.objects.filter(pk=job.pk).update(
            status=DEAD, status_changed_at=died + timedelta(seconds=n), attempts=3, last_error="x"
        )
        DeliveryAttempt.objects.create(
            job=job, attempt_number=1, started_at=died, duration_ms=1, dispatcher_id="d"
        )
        jobs.append(job)
    return jobs


def statuses(jobs: list[Job]) -> list[str]:
    chosen = Job.objects.filter(pk__in=[job.pk for job in jobs]).order_by("pk")
    return list(chosen.values_list("status", flat=True))


# --- what an action takes -------------------------------------------------------------------


def test_a_requeue_goes_in_batches_and_makes_the_state_machines_changes(billing, small_batches):
    dead = dead_jobs(billing, 5)
    others = Job.objects.exclude(consumer=billing)

    with time_machine.travel(timezone.now(), tick=False):
        now = timezone.now()
        action = start(billing, REQUEUE)
        run(action, FOREVER)

    assert (action.state, action.done, action.batches) == ("done", 5, 3)
    assert action.finished_at == now
    requeued = Job.objects.filter(pk__in=[job.pk for job in dead])
    assert {
        (j.status, j.attempts, j.last_error, j.lease_expires_at, j.next_attempt_at, j.enqueued_at)
        for j in requeued
    } == {(QUEUED, 0, "", None, now, now)}
    assert set(requeued.values_list("status_changed_at", flat=True)) == {now}
    assert DeliveryAttempt.objects.count() == 5  # a requeue keeps the history
    assert set(others.values_list("status", flat=True)) == {QUEUED}  # audit's jobs: untouched


def test_a_purge_deletes_the_jobs_with_their_attempts_and_nothing_else(billing, small_batches):
    dead_jobs(billing, 5)
    kept = dead_jobs(make_consumer(billing.channel, "crm"), 2)
    alive = Job.objects.filter(consumer=billing).first()
    assert alive is not None
    Job.objects.filter(pk=alive.pk).update(status=DELIVERED)

    action = start(billing, PURGE)
    run(action, FOREVER)

    assert (action.state, action.done, action.batches) == ("done", 4, 3)  # 2, 2, then none
    assert not Job.objects.filter(consumer=billing, status=DEAD).exists()
    assert Job.objects.filter(pk=alive.pk).exists()
    assert statuses(kept) == [DEAD, DEAD]
    assert set(DeliveryAttempt.objects.values_list("job_id", flat=True)) == {
        alive.pk,
        *(job.pk for job in kept),
    }


def test_between_batches_the_runner_leaves_the_database_to_deliveries(
    billing, small_batches, monkeypatch
):
    """After each batch but the last it pauses three times as long as the batch took."""
    dead_jobs(billing, 5)
    clock = itertools.count(step=0.1)  # each batch "takes" 0.1 s
    pauses: list[float] = []
    monkeypatch.setattr(
        dlq_actions, "time", SimpleNamespace(monotonic=lambda: next(clock), sleep=pauses.append)
    )

    run(start(billing, REQUEUE), FOREVER)

    assert pauses == [pytest.approx(0.3)] * 2  # three batches


def test_jobs_that_die_after_the_action_was_asked_are_left_to_another(billing, small_batches):
    dead_jobs(billing, 3)
    action = start(billing, REQUEUE)
    (later,) = dead_jobs(billing, 1, ago=timedelta(seconds=-1))  # died after the action began

    run(action, FOREVER)

    assert action.done == 3
    assert statuses([later]) == [DEAD]


def test_since_and_until_bound_what_it_takes(billing, small_batches):
    jobs = dead_jobs(billing, 6)
    died = [job.status_changed_at for job in Job.objects.filter(consumer=billing, status=DEAD)]
    since, until = sorted(died)[1], sorted(died)[4]

    action = start(billing, REQUEUE, since=since, until=until)
    run(action, FOREVER)

    assert action.done == 3
    assert statuses(jobs) == [DEAD, QUEUED, QUEUED, QUEUED, DEAD, DEAD]


def test_a_selection_goes_in_batches_and_takes_only_its_dead_jobs(billing, small_batches):
    dead = dead_jobs(billing, 5)
    queued = Job.objects.filter(consumer__public_id="audit").first()
    assert queued is not None

    taken = act_on_jobs(PURGE, [*(job.pk for job in dead), queued.pk])

    assert taken == 5
    assert not Job.objects.filter(consumer=billing).exists()
    assert Job.objects.get(pk=queued.pk).status == QUEUED


# --- bounded batches on PostgreSQL ------------------------------------------------------------


class Statements:
    """The statements run while it is installed (connection.execute_wrapper), with how many
    parameters each bound."""

    def __init__(self) -> None:
        self.run: list[tuple[str, int]] = []

    def __call__(self, execute, sql, params, many, context):
        self.run.append((sql, len(params or ())))
        return execute(sql, params, many, context)

    def batches(self) -> list[int]:
        """The parameters bound by each batch statement."""
        return [count for sql, count in self.run if "SKIP LOCKED" in sql]


@pytest.mark.parametrize("kind", [REQUEUE, PURGE])
def test_each_batch_is_one_statement_binding_no_parameter_per_job(
    billing, monkeypatch, kind, settings
):
    # PostgreSQL's protocol binds at most 65,535 parameters: batches far larger than a few
    # parameters' worth of jobs show that the count does not grow with the jobs.
    monkeypatch.setattr(dlq_actions, "BATCH_SIZE", 40)
    dead = dead_jobs(billing, 100)
    statements = Statements()

    with connection.execute_wrapper(statements):
        action = start(billing, kind)
        run(action, FOREVER)
        taken_by_keys = act_on_jobs(kind, [job.pk for job in dead])

    assert (action.done, action.batches, taken_by_keys) == (100, 3, 0)
    assert len(statements.batches()) == 3 + 3  # the queue's, then the keys' (40 a batch)
    assert max(statements.batches()) <= 10
    assert max(count for _, count in statements.run) < 40  # none binds a parameter per job


@pytest.mark.django_db(transaction=True)
def test_a_batch_in_progress_blocks_neither_a_dispatcher_nor_another_batch(billing):
    dead_jobs(billing, 5)  # audit gets a QUEUED job of each message
    locked, release = threading.Event(), threading.Event()
    first: list[int] = []

    def batch_held_open() -> None:
        try:
            with transaction.atomic():
                dead = DeadRange(billing.pk, dlq_actions.EARLIEST, timezone.now())
                first.append(take_range(REQUEUE, dead, 2).taken)
                locked.set()
                release.wait(60)
        finally:
            connection.close()

    holder = threading.Thread(target=batch_held_open)
    holder.start()
    try:
        assert locked.wait(60)
        with transaction.atomic():
            with connection.cursor() as cursor:  # a wait would fail the test, not hang it
                cursor.execute("SET LOCAL lock_timeout = '20s'")
            claimed = claim_for_push(10)
            dead = DeadRange(billing.pk, dlq_actions.EARLIEST, timezone.now())
            second = take_range(PURGE, dead, 10)
    finally:
        release.set()
        holder.join(60)

    assert {job.consumer_id for job in claimed} == {Consumer.objects.get(public_id="audit").pk}
    assert len(claimed) == 5
    assert (first, second.picked, second.taken) == ([2], 3, 3)  # the other 3: skipped, not waited
    assert Job.objects.filter(consumer=billing, status=QUEUED).count() == 2
    assert Job.objects.filter(consumer=billing).count() == 2
    assert Job.objects.filter(status=INFLIGHT).count() == 5


@pytest.mark.django_db(transaction=True)
def test_two_actions_running_at_once_take_each_job_once(billing, monkeypatch):
    monkeypatch.setattr(dlq_actions, "BATCH_SIZE", 3)
    dead_jobs(billing, 30)
    requeue, purge = start(billing, REQUEUE), start(billing, PURGE)

    at_once(lambda: run(requeue, FOREVER), lambda: run(purge, FOREVER))

    assert requeue.finished
    assert purge.finished
    assert requeue.done + purge.done == 30
    assert Job.objects.filter(consumer=billing, status=QUEUED).count() == requeue.done
    assert Job.objects.filter(consumer=billing).count() == requeue.done
    assert DeliveryAttempt.objects.filter(job__consumer=billing).count() == requeue.done


def test_two_actions_on_one_queue_share_it_out(billing, small_batches):
    dead_jobs(billing, 7)
    requeue, purge = start(billing, REQUEUE), start(billing, PURGE)

    while step(requeue) | step(purge):
        pass

    assert requeue.finished
    assert purge.finished
    assert requeue.done + purge.done == 7
    assert Job.objects.filter(consumer=billing, status=QUEUED).count() == requeue.done
    assert Job.objects.filter(consumer=billing).count() == requeue.done


# --- runners, leases and housekeeping -----------------------------------------------------------


def test_an_action_whose_runner_vanished_is_resumed_by_housekeeping(billing, small_batches):
    dead_jobs(billing, 5)
    action = start(billing, PURGE)
    step(action)  # then the process that ran it is gone

    assert resume_actions() == 0  # its lease still holds: it may be alive, only slow
    with time_machine.travel(timezone.now() + LEASE + timedelta(seconds=1)):
        assert resume_actions() == 1

    action.refresh_from_db()
    assert (action.state, action.done, action.batches) == ("done", 5, 3)
    assert not Job.objects.filter(consumer=billing).exists()


def test_a_runner_that_lost_its_lease_undoes_its_batch_and_stops(billing, small_batches):
    dead_jobs(billing, 5)
    slow = start(billing, REQUEUE)
    with time_machine.travel(timezone.now() + LEASE + timedelta(seconds=1)):
        other = DeadLetterAction.claim(slow.pk, "another-runner", LEASE)
        assert other is not None

        assert step(slow) is False

    assert Job.objects.filter(consumer=billing, status=DEAD).count() == 5
    other.refresh_from_db()
    assert (other.done, other.batches, other.runner) == (0, 0, "another-runner")


def test_a_handed_off_action_is_queued_for_housekeeping_and_finished_there(billing, small_batches):
    from django_q.models import OrmQ  # type: ignore[import-untyped]

    dead_jobs(billing, 5)
    action = start(billing, REQUEUE)
    step(action)

    dlq_actions.hand_off(action)

    assert (action.estimated_total, action.runner) == (5, "")
    (task,) = OrmQ.objects.all()
    assert task.task["func"] == "jobs.dlq_actions.continue_action"
    assert task.task["args"] == (action.pk,)
    assert continue_action(action.pk) == "5 done, done"
    assert continue_action(action.pk) == "held by another runner, finished or gone"


def test_a_failing_batch_is_undone_retried_and_given_up_after_three(billing, monkeypatch):
    dead_jobs(billing, 2)
    action = start(billing, REQUEUE)

    def database_gone(*args, **kwargs):
        Job.objects.update(status=QUEUED)  # undone with the batch
        raise OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(dlq_actions, "take_range", database_gone)
    with pytest.raises(OperationalError):
        step(action)

    assert (action.state, action.failures, action.runner) == ("running", 1, "")
    assert action.error == "OperationalError: server closed the connection unexpectedly"
    assert Job.objects.filter(status=DEAD).count() == 2
    for _ in range(2):
        with pytest.raises(OperationalError):
            continue_action(action.pk)
    action.refresh_from_db()
    assert (action.state, action.failures) == ("failed", 3)
    assert action.finished_at is not None
    assert continue_action(action.pk) == "held by another runner, finished or gone"


def test_an_action_stops_when_its_consumer_is_deleted(billing, small_batches):
    dead_jobs(billing, 5)
    action = start(billing, REQUEUE)
    step(action)

    Consumer.objects.filter(pk=billing.pk).delete()

    assert step(action) is False
    assert not DeadLetterAction.objects.exists()


def test_finished_actions_are_forgotten_after_a_week(billing):
    dead_jobs(billing, 1)
    action = start(billing, REQUEUE)
    run(action, FOREVER)

    with time_machine.travel(timezone.now() + timedelta(days=6)):
        resume_actions()
    assert DeadLetterAction.objects.filter(pk=action.pk).exists()
    with time_machine.travel(timezone.now() + timedelta(days=7, seconds=1)):
        resume_actions()
    assert not DeadLetterAction.objects.exists()
