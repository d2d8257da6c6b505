"""The circuit breaker (docs/delivery.md, "Circuit breaker"): a consumer that is down uses no
attempts while it is open."""

from __future__ import annotations

from datetime import timedelta

import pytest
import time_machine
from django.utils import timezone

from broker import publish
from broker.models import Message
from consumers.models import Consumer
from jobs.models import DeliveryAttempt, Job
from jobs.queue import circuit
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.delivery import push_consumer, run_once, send
from tests.helpers import make_consumer
from tests.receiver import Reply

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def circuit_settings(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [1, 1]  # three attempts, all due again within seconds
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 2
    settings.BROKER_CIRCUIT_COOLDOWN_SECONDS = 30


@pytest.fixture
def down(channel, receiver):
    """A consumer whose receiver answers 503, with four messages waiting."""
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(503)
    for number in range(4):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")
    return consumer


def at(seconds: float):
    return time_machine.travel(START + timedelta(seconds=seconds), tick=False)


START = timezone.now().replace(microsecond=0) + timedelta(days=1)


def attempts_used() -> int:
    return sum(Job.objects.values_list("attempts", flat=True))


def open_the_circuit(dispatcher, limit: int = 2) -> None:
    with at(0):
        assert len(run_once(dispatcher, limit)) == 2  # two failures in a row: the threshold


def test_failures_in_a_row_open_the_circuit_and_no_attempt_is_used(down, dispatcher):
    open_the_circuit(dispatcher)

    down.refresh_from_db()
    assert circuit.state(down, START) == "open"
    assert down.circuit_open_until == START + timedelta(seconds=30)
    assert down.circuit_failures == 2
    used = attempts_used()
    with at(10):  # the two failed jobs are due again, the other two never tried: none is taken
        assert dispatcher.claim(10) == []
    assert attempts_used() == used


def test_after_the_cooldown_one_probe_goes_out_and_success_closes(down, dispatcher, receiver):
    open_the_circuit(dispatcher)
    receiver.replies["/hook"] = Reply(200)

    with at(31):
        assert len(run_once(dispatcher)) == 1  # half-open: a single probe
        down.refresh_from_db()
        assert circuit.state(down, timezone.now()) == "closed"
        assert down.circuit_failures == 0
        assert len(run_once(dispatcher)) == 3  # closed: the rest
    assert Job.objects.filter(status=DELIVERED).count() == 4


def test_a_failed_probe_reopens_for_twice_as_long_and_keeps_its_attempt(down, dispatcher):
    open_the_circuit(dispatcher)
    with at(31):
        [probe] = run_once(dispatcher)

    down.refresh_from_db()
    assert down.circuit_open_until == START + timedelta(seconds=31 + 60)
    job = Job.objects.get(pk=probe.job_id)
    assert job.status == QUEUED
    assert job.attempts == probe.attempt - 1  # given back
    assert job.next_attempt_at == down.circuit_open_until
    assert DeliveryAttempt.objects.filter(job=job).count() == probe.attempt  # but on record
    with at(31 + 59):
        assert dispatcher.claim(10) == []


def test_the_cooldown_doubles_up_to_an_hour(down, dispatcher):
    open_the_circuit(dispatcher)
    elapsed = 0
    for _ in range(9):
        down.refresh_from_db()
        elapsed = (down.circuit_open_until - START).total_seconds() + 1
        with at(elapsed):
            assert len(run_once(dispatcher)) == 1

    down.refresh_from_db()
    assert down.circuit_cooldown_seconds == 3600


def test_an_operator_closes_the_circuit_by_hand(down, dispatcher, receiver):
    open_the_circuit(dispatcher)
    receiver.replies["/hook"] = Reply(200)

    circuit.close(down)

    with at(5):
        assert len(run_once(dispatcher)) == 4  # at once, without waiting for the cooldown
    assert circuit.state(Consumer.objects.get(), START) == "closed"


def test_a_consumer_down_for_longer_than_the_retry_schedule_loses_no_job(
    down, dispatcher, receiver
):
    # Three attempts a job, and the receiver is down for two hours: without the circuit every job
    # would be DEAD within seconds.
    elapsed = 0.0
    while elapsed < 2 * 3600:
        with at(elapsed):
            run_once(dispatcher)
        elapsed += 7
    assert not Job.objects.filter(status=DEAD).exists()

    receiver.replies["/hook"] = Reply(200)  # back up: the next probe closes the circuit
    back_up_at = elapsed
    while Job.objects.filter(status=DELIVERED).count() < 4:
        assert elapsed < back_up_at + 3600 + 60, "not delivered within a cooldown of an hour"
        with at(elapsed):
            run_once(dispatcher)
        elapsed += 7
    assert not DeliveryAttempt.objects.filter(job__attempts__gt=3).exists()


@pytest.mark.parametrize("status", [503, 429, 410])
def test_failures_of_jobs_deleted_meanwhile_count_for_nothing(
    status, channel, receiver, dispatcher
):
    """Their messages were deleted while the attempts were out: the consumer's row is left as it
    was (no failure counted, no circuit opened, no last failure, no hold, no pause)."""
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(status, headers={"Retry-After": "60"})
    for number in range(2):  # the threshold
        publish(channel, b"x", producer="shop", message_id=f"m{number}")
    results = send(dispatcher.claim(10))
    Message.objects.all().delete()  # takes their jobs with them

    dispatcher.complete(results)

    consumer.refresh_from_db()
    assert (consumer.circuit_failures, consumer.circuit_open_until) == (0, None)
    assert (consumer.last_failure_at, consumer.throttled_until, consumer.paused) == (
        None,
        None,
        False,
    )


def test_answers_the_consumer_chose_do_not_count(channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver, non_retryable_statuses=[422])
    receiver.replies["/hook"] = Reply(422)
    for number in range(3):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")

    run_once(dispatcher)

    consumer.refresh_from_db()
    assert (consumer.circuit_failures, consumer.circuit_open_until) == (0, None)


def test_a_threshold_of_zero_disables_the_circuit(down, dispatcher, settings):
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 0
    with at(0):
        run_once(dispatcher)
    down.refresh_from_db()
    assert down.circuit_open_until is None
    assert down.circuit_failures == 4


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504])
def test_unavailability_opens_the_circuit(status, channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(status)
    for number in range(2):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")

    run_once(dispatcher)

    consumer.refresh_from_db()
    assert consumer.circuit_open_until is not None


def test_no_answer_at_all_opens_the_circuit(channel, dispatcher):
    consumer = make_consumer(channel)  # http://127.0.0.1:9/…: nothing listens there
    for number in range(2):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")

    run_once(dispatcher)

    consumer.refresh_from_db()
    assert consumer.circuit_open_until is not None
    assert {a.error_class for a in DeliveryAttempt.objects.all()} == {"connection"}


@pytest.mark.parametrize("status", [301, 400, 401, 403, 404, 409, 422])
def test_a_consumers_own_answer_never_opens_the_circuit(status, channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(status)
    for number in range(4):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")

    run_once(dispatcher)

    consumer.refresh_from_db()
    assert (consumer.circuit_failures, consumer.circuit_open_until) == (0, None)


def test_a_consumer_answering_404_uses_its_attempts_and_its_job_dies(channel, receiver, dispatcher):
    """Upstream's integration test: a misconfigured consumer (404 every time) must reach the
    DLQ, not sit QUEUED for ever behind a circuit that gives every attempt back."""
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(404)
    publish(channel, b"x", producer="shop")

    for elapsed in (0, 2, 4):  # three attempts, a second apart (BROKER_RETRY_DELAYS = [1, 1])
        with at(elapsed):
            assert len(run_once(dispatcher)) == 1

    job = Job.objects.get()
    assert job.status == DEAD
    assert job.last_error == "HTTP 404; all 3 attempts used"
    assert Consumer.objects.get().circuit_open_until is None


def test_an_answer_of_its_own_closes_an_open_circuit(down, dispatcher, receiver):
    open_the_circuit(dispatcher)
    receiver.replies["/hook"] = Reply(404)  # up again, but misconfigured

    with at(31):
        assert len(run_once(dispatcher)) == 1  # the probe

    down.refresh_from_db()
    assert circuit.state(down, START) == "closed"
    assert down.circuit_failures == 0


def test_a_queued_job_never_says_its_attempts_are_used_up(channel, receiver, dispatcher):
    """A failed probe on the job's last attempt gives the attempt back: the job stays QUEUED,
    and its last error must not claim that every attempt was used."""
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(503)
    publish(channel, b"x", producer="shop")
    for elapsed in (0, 2):  # two failures: the circuit opens (threshold 2)
        with at(elapsed):
            run_once(dispatcher)

    with at(2 + 31):
        [probe] = run_once(dispatcher)  # the third and last attempt

    job = Job.objects.get()
    assert probe.attempt == 3
    assert job.status == QUEUED
    assert "attempts used" not in job.last_error
    assert job.last_error == "HTTP 503; circuit open again, attempt not counted"
