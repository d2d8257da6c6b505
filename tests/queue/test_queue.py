"""The job queue's interface (jobs/queue), run against its statements (jobs/queue/postgres*.py)."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.db import IntegrityError
from django.utils import timezone

from broker.message_states import ACKNOWLEDGED, DISPATCHED, SCHEDULED
from broker.models import Message
from consumers.models import Consumer
from jobs import queue
from jobs.delivery import AttemptResult
from jobs.models import DeliveryAttempt, Job
from jobs.queue.rules import DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER, push_lease_expiry
from jobs.retry import Outcome, Verdict
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.helpers import make_consumer

pytestmark = pytest.mark.django_db
NOW = timezone.now().replace(microsecond=0)


def unsaved_message(message_id: str, **fields) -> Message:
    values = {
        "channel_id": "orders",
        "producer_id": "shop",
        "public_id": message_id,
        "payload": b"{}",
        "payload_size": 2,
        "content_type": "application/json",
        "received_at": NOW,
        **fields,
    }
    return Message(**values)


def publish(message_id: str, **fields) -> Message:
    message = unsaved_message(message_id, **fields)
    queue.insert_message(message)
    return message


def scheduled_message(message_id: str, due_at) -> Message:
    message = unsaved_message(message_id, status=SCHEDULED, scheduled_for=due_at)
    message.save()
    return message


def claimed_ids(limit: int = 100, now=None) -> list[str]:
    return [job.message.message_id for job in queue.claim_for_push(limit, now or NOW)]


# --- fan-out ---------------------------------------------------------------------------------


def test_a_published_message_gets_one_queued_job_per_consumer(channel):
    make_consumer(channel, "billing")
    make_consumer(channel, "audit", type=Consumer.Type.PULL)

    message = publish("m-1", priority=3, ordering_key="k")

    assert message.pk
    assert message.status == DISPATCHED
    assert message.dispatched_at == NOW
    jobs = Job.objects.order_by("consumer__public_id")
    assert [(j.consumer.public_id, j.status, j.priority, j.ordering_key) for j in jobs] == [
        ("audit", QUEUED, 3, "k"),
        ("billing", QUEUED, 3, "k"),
    ]
    assert {j.enqueued_at for j in jobs} == {NOW}


def test_a_message_for_a_channel_without_consumers_is_acknowledged(channel):
    message = publish("m-1")

    assert message.status == ACKNOWLEDGED
    assert message.dispatched_at is None
    assert not Job.objects.exists()


def test_an_unknown_channel_or_producer_inserts_nothing(channel):
    assert queue.insert_message(unsaved_message("m-1", channel_id="nope")) == queue.Inserted(
        False, True
    )
    assert queue.insert_message(unsaved_message("m-2", producer_id="nope")) == queue.Inserted(
        True, False
    )
    assert not Message.objects.exists()


def test_a_duplicate_message_id_is_refused(channel):
    make_consumer(channel)
    publish("m-1")

    with pytest.raises(IntegrityError):
        publish("m-1")
    assert Job.objects.count() == 1


def test_release_makes_the_jobs_of_due_messages_once(channel):
    make_consumer(channel, "billing")
    make_consumer(channel, "audit")
    scheduled_message("due", NOW - timedelta(seconds=1))
    scheduled_message("later", NOW + timedelta(minutes=1))

    assert queue.release_due_messages(NOW) == 1
    assert queue.release_due_messages(NOW) == 0

    due = Message.objects.get(public_id="due")
    assert (due.status, due.dispatched_at) == (DISPATCHED, NOW)
    assert Job.objects.filter(message=due, status=QUEUED).count() == 2
    assert Message.objects.get(public_id="later").status == SCHEDULED


def test_release_takes_at_most_the_limit_oldest_due_first(channel):
    make_consumer(channel)
    for n in range(3):
        scheduled_message(f"s-{n}", NOW - timedelta(minutes=3 - n))

    assert queue.release_due_messages(NOW, limit=2) == 2
    assert set(Message.objects.filter(status=DISPATCHED).values_list("public_id", flat=True)) == {
        "s-0",
        "s-1",
    }


def test_a_message_released_without_consumers_is_acknowledged(channel):
    scheduled_message("due", NOW)

    assert queue.release_due_messages(NOW) == 1
    assert Message.objects.get().status == ACKNOWLEDGED


# --- the push claim --------------------------------------------------------------------------


def test_a_claim_leases_the_best_due_jobs_and_counts_their_attempt(channel):
    make_consumer(channel)
    publish("low", priority=1)
    publish("high", priority=5)
    publish("later", received_at=NOW + timedelta(minutes=1))  # due only then

    claimed = queue.claim_for_push(10, NOW)

    assert [job.message.message_id for job in claimed] == ["high", "low"]
    assert [job.attempt for job in claimed] == [1, 1]
    job = Job.objects.get(pk=claimed[0].job_id)
    assert (job.status, job.attempts) == (INFLIGHT, 1)
    assert job.lease_expires_at == push_lease_expiry(NOW)
    assert claimed_ids(now=NOW) == []  # nothing is handed out twice


def test_a_claim_returns_what_the_request_needs(channel):
    consumer = make_consumer(channel)
    publish("m-1", headers={"X-Trace": "a"}, content_type="text/plain", priority=2)

    [job] = queue.claim_for_push(1, NOW)

    assert (job.consumer_id, job.consumer_changed_at) == (consumer.pk, consumer.changed_at)
    message = job.message
    assert (message.payload, message.content_type, message.headers, message.priority) == (
        b"{}",
        "text/plain",
        {"X-Trace": "a"},
        2,
    )


def test_paused_pull_and_open_circuit_consumers_get_nothing(channel):
    for name in ("paused", "pull", "open"):
        make_consumer(channel, name, type=Consumer.Type.PULL if name == "pull" else "push")
    Consumer.objects.filter(public_id="paused").update(paused=True)
    Consumer.objects.filter(public_id="open").update(circuit_open_until=NOW + timedelta(seconds=30))
    publish("m-1")

    assert claimed_ids() == []


def test_a_half_open_circuit_lets_one_probe_through(channel):
    make_consumer(channel)
    Consumer.objects.update(circuit_open_until=NOW - timedelta(seconds=1))
    publish("m-1")
    publish("m-2")

    assert claimed_ids() == ["m-1"]
    assert claimed_ids() == []  # the probe is in flight


def test_a_consumer_never_has_more_than_its_cap_in_flight(channel):
    make_consumer(channel)
    Consumer.objects.update(max_in_flight=2)
    for n in range(4):
        publish(f"m-{n}")

    assert len(claimed_ids()) == 2
    assert claimed_ids() == []


def test_the_default_cap_applies_when_the_consumer_sets_none(channel):
    make_consumer(channel)
    for n in range(DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER + 1):
        publish(f"m-{n}")

    assert len(claimed_ids(limit=500)) == DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER


def test_an_ordered_consumer_gets_only_the_head_of_each_key(channel):
    make_consumer(channel)
    Consumer.objects.update(ordering=Consumer.Ordering.ORDERED)
    for message_id, key in [("a1", "a"), ("a2", "a"), ("b1", "b")]:
        publish(message_id, ordering_key=key)

    assert sorted(claimed_ids()) == ["a1", "b1"]
    assert claimed_ids() == []  # a2 waits for a1


# --- outcomes --------------------------------------------------------------------------------


def result_of(job: queue.ClaimedJob, status_code: int | None) -> AttemptResult:
    return AttemptResult(
        job.job_id,
        job.partition_at,
        job.attempt,
        job.consumer_id,
        NOW,
        12.0,
        status_code=status_code,
    )


def record(results: list[AttemptResult], outcomes: list[Outcome]) -> dict[int, Outcome]:
    by_job = {result.job_id: outcome for result, outcome in zip(results, outcomes, strict=True)}
    return queue.record_outcomes(results, by_job, "test-dispatcher", NOW)


def test_outcomes_move_jobs_and_record_attempts(channel):
    make_consumer(channel)
    for message_id in ("ok", "retry", "dead"):
        publish(message_id)
    claimed = {job.message.message_id: job for job in queue.claim_for_push(10, NOW)}
    later = NOW + timedelta(minutes=1)
    results = [result_of(claimed["ok"], 200), result_of(claimed["retry"], 500)]
    results.append(result_of(claimed["dead"], 410))

    applied = record(
        results,
        [
            Outcome(Verdict.DELIVERED, ""),
            Outcome(Verdict.RETRY, "HTTP 500", later),
            Outcome(Verdict.DEAD, "HTTP 410"),
        ],
    )

    assert len(applied) == 3
    jobs = {job.message.public_id: job for job in Job.objects.select_related("message")}
    assert (jobs["ok"].status, jobs["ok"].lease_expires_at) == (DELIVERED, None)
    assert (jobs["retry"].status, jobs["retry"].next_attempt_at) == (QUEUED, later)
    assert (jobs["dead"].status, jobs["dead"].last_error) == (DEAD, "HTTP 410")
    assert DeliveryAttempt.objects.count() == 3
    assert set(DeliveryAttempt.objects.values_list("dispatcher_id", flat=True)) == {
        "test-dispatcher"
    }


def test_an_outcome_of_an_older_claim_moves_nothing(channel):
    make_consumer(channel)
    publish("m-1")
    [first] = queue.claim_for_push(1, NOW)
    with time_machine.travel(push_lease_expiry(NOW) + timedelta(seconds=1)):
        assert queue.sweep_expired_leases() == 1
    [second] = queue.claim_for_push(1, push_lease_expiry(NOW) + timedelta(seconds=2))

    record([result_of(first, 200)], [Outcome(Verdict.DELIVERED, "")])

    job = Job.objects.get()
    assert (job.status, job.attempts) == (INFLIGHT, second.attempt)
    assert DeliveryAttempt.objects.count() == 1  # the attempt happened all the same


def test_a_delivery_closes_the_circuit_of_its_consumer(channel):
    make_consumer(channel)
    Consumer.objects.update(circuit_failures=3)
    publish("m-1")
    [job] = queue.claim_for_push(1, NOW)

    record([result_of(job, 204)], [Outcome(Verdict.DELIVERED, "")])

    assert Consumer.objects.get().circuit_failures == 0


def test_unsent_jobs_go_back_without_using_an_attempt(channel):
    make_consumer(channel)
    publish("m-1")
    [job] = queue.claim_for_push(1, NOW)

    assert queue.release_unsent([(job.job_id, job.partition_at)]) == 1
    assert Job.objects.filter(status=QUEUED, attempts=0).count() == 1


# --- pull consumers --------------------------------------------------------------------------


def test_a_pull_claim_follows_the_same_ordering_rule(channel):
    consumer = make_consumer(channel, "worker", type=Consumer.Type.PULL)
    Consumer.objects.update(ordering=Consumer.Ordering.ORDERED)
    consumer.refresh_from_db()
    for message_id in ("a1", "a2"):
        publish(message_id, ordering_key="a")

    taken = queue.claim_for_pull(consumer, 10)

    assert [job.message.public_id for job in taken] == ["a1"]
    assert taken[0].lease_expires_at is not None
    assert queue.claim_for_pull(consumer, 10) == []
