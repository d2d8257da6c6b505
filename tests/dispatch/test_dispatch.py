"""The push dispatcher, one step at a time, against a real receiver on loopback
(docs/dispatcher.md)."""

from __future__ import annotations

import re
import threading
from datetime import timedelta

import pytest
import time_machine
from django.db import connection
from django.utils import timezone
from standardwebhooks import Webhook

from broker import publish
from consumers.models import Consumer
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.models import DeliveryAttempt, DispatcherHeartbeat, Job
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.delivery import push_consumer, run_once, send
from tests.helpers import make_consumer
from tests.receiver import Reply

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_jitter(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [60, 600]
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 2


def test_a_claim_leases_jobs_and_counts_the_attempt_before_sending(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop")

    claimed_at = timezone.now() + timedelta(seconds=1)
    with time_machine.travel(claimed_at, tick=False):
        requests = dispatcher.claim(10)

    job = Job.objects.get()
    assert [r.job_id for r in requests] == [job.pk]
    assert (job.status, job.attempts, requests[0].attempt) == (INFLIGHT, 1, 1)
    # timeout 2 s + rational delay 2 s + the second a rate-limited job may wait for its slot
    assert job.lease_expires_at == claimed_at + timedelta(seconds=5)
    assert dispatcher.claim(10) == []  # nothing is handed out twice


def test_the_request_carries_every_header_of_the_spec(channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    publish(
        channel,
        b'{"order": 1}',
        producer="shop",
        message_id="order-1",
        priority=4,
        headers={"X-Trace-Id": "abc"},
        content_type="application/json",
    )

    run_once(dispatcher)

    [request] = receiver.received
    headers = request.headers
    assert request.body == b'{"order": 1}'
    assert headers["Content-Type"] == "application/json"
    assert headers["X-Broker-Message-ID"] == "order-1"
    assert headers["X-Broker-Message-Priority"] == "4"
    assert headers["X-Broker-Channel-ID"] == "orders"
    assert headers["X-Broker-Consumer-ID"] == "billing"
    assert headers["X-Broker-Consumer-Token"] == consumer.token
    assert re.fullmatch(r"[0-9a-v]{20}", headers["X-Request-ID"])  # an xid, as webhook-broker
    assert headers["User-Agent"].startswith("webhook-broker-django/")
    assert headers["X-Trace-Id"] == "abc"
    assert headers["X-Broker-Metadata-Headers"] == "X-Trace-Id"
    assert headers["webhook-id"] == "order-1"
    assert headers["webhook-signature"].startswith("v1,")


def test_signatures_verify_with_the_reference_library(channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    publish(channel, b'{"order": 1}', producer="shop")

    run_once(dispatcher)

    [request] = receiver.received
    Webhook(consumer.signing_secret).verify(request.body, request.headers)


def test_a_2xx_delivers_and_records_the_attempt(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(202, body=b"accepted")
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    job = Job.objects.get()
    assert (job.status, job.attempts, job.lease_expires_at) == (DELIVERED, 1, None)
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.job_id, attempt.attempt_number, attempt.status_code) == (job.pk, 1, 202)
    assert (attempt.error_class, attempt.response_excerpt) == ("", "accepted")
    assert attempt.dispatcher_id == "test-dispatcher"
    assert attempt.duration_ms > 0


def test_a_failure_is_retried_after_the_first_delay(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(500, body=b"boom" * 2000)
    publish(channel, b"x", producer="shop")

    before = timezone.now()
    run_once(dispatcher)

    job = Job.objects.get()
    assert (job.status, job.last_error) == (QUEUED, "HTTP 500")
    assert before + timedelta(seconds=60) <= job.next_attempt_at
    assert job.next_attempt_at <= timezone.now() + timedelta(seconds=60)
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.status_code, attempt.error_class) == (500, "http-status")
    assert len(attempt.response_excerpt) == 4096  # truncated
    assert dispatcher.claim(10) == []  # not due yet


def test_retries_then_success(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(503)
    publish(channel, b"x", producer="shop")
    run_once(dispatcher)
    receiver.replies["/hook"] = Reply(200)

    with time_machine.travel(timezone.now() + timedelta(seconds=61)):
        run_once(dispatcher)

    job = Job.objects.get()
    assert (job.status, job.attempts) == (DELIVERED, 2)
    assert list(
        DeliveryAttempt.objects.order_by("attempt_number").values_list(
            "attempt_number", "status_code"
        )
    ) == [(1, 503), (2, 200)]


def test_the_last_attempt_failing_makes_the_job_dead(channel, receiver, dispatcher):
    push_consumer(channel, receiver, retry_delays=[1])
    receiver.replies["/hook"] = Reply(500)
    publish(channel, b"x", producer="shop")
    run_once(dispatcher)

    with time_machine.travel(timezone.now() + timedelta(seconds=2)):
        run_once(dispatcher)

    job = Job.objects.get()
    assert (job.status, job.attempts) == (DEAD, 2)
    assert "all 2 attempts used" in job.last_error


def test_non_retryable_statuses_go_straight_to_dead(channel, receiver, dispatcher):
    push_consumer(channel, receiver, non_retryable_statuses=[400, 422])
    receiver.replies["/hook"] = Reply(422)
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    job = Job.objects.get()
    assert (job.status, job.attempts, job.last_error) == (DEAD, 1, "HTTP 422 is not retryable")


def test_410_gone_kills_the_job_and_pauses_the_consumer(channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(410)
    publish(channel, b"x", producer="shop", message_id="first")
    publish(channel, b"x", producer="shop", message_id="second")

    run_once(dispatcher, limit=1)

    consumer.refresh_from_db()
    assert consumer.paused
    assert Job.objects.filter(status=DEAD).count() == 1
    assert dispatcher.claim(10) == []  # the paused consumer's other job waits


@pytest.mark.parametrize(("retry_after", "at_least"), [("120", 120), ("5", 60)])
def test_retry_after_delays_the_next_attempt(channel, receiver, dispatcher, retry_after, at_least):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(429, headers={"Retry-After": retry_after})
    publish(channel, b"x", producer="shop")

    before = timezone.now()
    run_once(dispatcher)

    job = Job.objects.get()
    assert job.status == QUEUED
    assert job.next_attempt_at >= before + timedelta(seconds=at_least)
    assert job.next_attempt_at <= timezone.now() + timedelta(seconds=at_least)


def test_a_timeout_is_a_retryable_failure(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(200, delay=1.0)
    publish(channel, b"x", producer="shop")

    dispatcher.complete(send(dispatcher.claim(10), timeout=0.2))

    job = Job.objects.get()
    assert job.status == QUEUED
    assert DeliveryAttempt.objects.get().error_class == "timeout"


def test_redirects_are_failures_and_not_followed(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(302, headers={"Location": receiver.url("/elsewhere")})
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    assert receiver.paths() == ["/hook"]
    assert Job.objects.get().status == QUEUED


def test_a_refused_connection_is_a_retryable_failure(channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    consumer.callback_url = "http://127.0.0.1:9/closed"  # discard port: nothing listens
    consumer.save()
    publish(channel, b"x", producer="shop")

    run_once(dispatcher)

    assert Job.objects.get().status == QUEUED
    assert DeliveryAttempt.objects.get().error_class == "connection"


def test_claims_follow_priority_and_skip_what_may_not_receive(channel, receiver, dispatcher):
    push_consumer(channel, receiver, "billing")
    push_consumer(channel, receiver, "paused", paused=True)
    make_consumer(channel, "puller", type=Consumer.Type.PULL)
    for priority in (1, 5, 3):
        publish(channel, b"x", producer="shop", message_id=f"p{priority}", priority=priority)

    requests = dispatcher.claim(10)

    assert [r.headers["X-Broker-Message-ID"] for r in requests] == ["p5", "p3", "p1"]
    assert {r.headers["X-Broker-Consumer-ID"] for r in requests} == {"billing"}


def test_max_in_flight_caps_what_one_consumer_gets(channel, receiver, dispatcher):
    push_consumer(channel, receiver, "slow", max_in_flight=2)
    push_consumer(channel, receiver, "fast")
    for number in range(5):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")

    first = dispatcher.claim(100)
    second = dispatcher.claim(100)

    consumers = [r.headers["X-Broker-Consumer-ID"] for r in first]
    assert consumers.count("slow") == 2
    assert consumers.count("fast") == 5
    assert second == []


def test_released_jobs_return_without_using_an_attempt(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop")
    [request] = dispatcher.claim(10)

    assert dispatcher.release([(request.job_id, request.partition_at)]) == 1

    job = Job.objects.get()
    assert (job.status, job.attempts, job.lease_expires_at) == (QUEUED, 0, None)


def test_an_outcome_for_a_job_swept_meanwhile_changes_nothing(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop")
    results = send(dispatcher.claim(10))
    with time_machine.travel(timezone.now() + timedelta(minutes=5)):
        assert (
            dispatcher.maintenance.sweep() == 1
        )  # the lease ran out before the outcome was recorded

    dispatcher.complete(results)

    job = Job.objects.get()
    assert job.status == QUEUED  # left to whoever takes it next
    assert DeliveryAttempt.objects.count() == 1  # but the attempt is on record


@pytest.mark.parametrize("answer", [200, 503])
def test_a_late_outcome_leaves_a_job_taken_again_to_its_new_holder(
    answer, channel, receiver, dispatcher
):
    """The first dispatcher's lease ran out and another took the job again: the first one's
    outcome, recorded late, must not move the job that the second one now holds."""
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(answer)
    publish(channel, b"x", producer="shop")
    late = send(dispatcher.claim(10))
    later = timezone.now() + timedelta(minutes=5)
    with time_machine.travel(later, tick=False):
        dispatcher.maintenance.sweep()
        [again] = Dispatcher(DispatcherConfig(dispatcher_id="other")).claim(10)

    dispatcher.complete(late)

    job = Job.objects.get()
    assert (job.status, job.attempts) == (INFLIGHT, again.attempt)  # still the other's claim
    assert DeliveryAttempt.objects.count() == 1  # the late attempt is on record all the same


def test_heartbeat_row_is_kept_and_removed(dispatcher):
    dispatcher.delivered = 3
    dispatcher.beat(in_flight=7)

    beat = DispatcherHeartbeat.objects.get()
    assert (beat.dispatcher_id, beat.in_flight, beat.delivered) == ("test-dispatcher", 7, 3)
    dispatcher.maintenance.retire()
    assert not DispatcherHeartbeat.objects.exists()


def test_kept_headers_cannot_shadow_the_brokers_own(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    publish(
        channel,
        b"x",
        producer="shop",
        message_id="order-1",
        headers={"content-type": "text/forged", "user-agent": "forged", "X-Tenant": "t1"},
        content_type="application/json",
    )

    run_once(dispatcher)

    [request] = receiver.received
    assert request.headers["Content-Type"] == "application/json"
    assert request.headers["User-Agent"].startswith("webhook-broker-django/")
    assert request.headers["X-Tenant"] == "t1"
    assert request.headers["X-Broker-Metadata-Headers"] == "X-Tenant"


def test_the_user_agent_can_be_set_as_webhook_brokers_can(channel, receiver, dispatcher, settings):
    settings.BROKER_DELIVERY_USER_AGENT = "Webhook Message Broker"
    push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop", message_id="m-1")

    run_once(dispatcher)

    [request] = receiver.received
    assert request.headers["User-Agent"] == "Webhook Message Broker"


def test_the_metadata_header_list_is_always_sent_sorted_as_webhook_broker_sends_it(
    channel, receiver, dispatcher
):
    push_consumer(channel, receiver)
    publish(
        channel, b"x", producer="shop", message_id="m-1", headers={"X-Zeta": "z", "X-Alpha": "a"}
    )
    publish(channel, b"y", producer="shop", message_id="m-2")

    run_once(dispatcher)

    sent = {r.headers["X-Broker-Message-ID"]: r.headers for r in receiver.received}
    assert sent["m-1"]["X-Broker-Metadata-Headers"] == "X-Alpha,X-Zeta"
    assert sent["m-2"]["X-Broker-Metadata-Headers"] == ""


def test_the_address_guard_refuses_private_callbacks_at_delivery(
    channel, receiver, dispatcher, settings
):
    push_consumer(channel, receiver)  # created while private callbacks were allowed
    publish(channel, b"x", producer="shop")
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False

    run_once(dispatcher)

    assert receiver.received == []
    assert Job.objects.get().status == QUEUED
    assert DeliveryAttempt.objects.get().error_class == "unsafe-callback"


@pytest.mark.parametrize("status", [200, 500])
def test_an_outcome_for_a_job_deleted_meanwhile_is_dropped(channel, receiver, dispatcher, status):
    consumer = push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(status)
    publish(channel, b"x", producer="shop")
    results = send(dispatcher.claim(10))
    consumer.delete()  # takes its jobs with it

    dispatcher.complete(results)

    assert not Job.objects.exists()
    assert not DeliveryAttempt.objects.exists()


def test_a_changed_consumer_applies_from_the_next_claim(channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    publish(channel, b"x", producer="shop", message_id="before")
    run_once(dispatcher)  # the dispatcher now holds the consumer, decrypted
    consumer.callback_url = receiver.url("/moved")
    consumer.save()
    new_secret = consumer.rotate_signing_secret(timezone.now())
    consumer.set_token("a-new-token")
    consumer.save()
    publish(channel, b"{}", producer="shop", message_id="after")

    run_once(dispatcher)

    assert receiver.paths() == ["/hook", "/moved"]
    moved = receiver.received[1]
    assert moved.headers["X-Broker-Consumer-Token"] == "a-new-token"
    Webhook(new_secret).verify(moved.body, moved.headers)  # signed with the rotated secret


@pytest.mark.django_db(transaction=True)
def test_concurrent_claims_never_hand_out_a_job_twice(channel, receiver):
    push_consumer(channel, receiver, max_in_flight=1000)
    for number in range(300):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")
    claimed: list[list[int]] = []

    def claim_until_empty() -> None:
        # Room for all 300 in each (a new consumer gets a quarter of a dispatcher's slots).
        dispatcher = Dispatcher(DispatcherConfig(concurrency=1200))
        mine: list[int] = []
        try:
            while batch := dispatcher.claim(7):
                mine += [request.job_id for request in batch]
        finally:
            connection.close()
        claimed.append(mine)

    threads = [threading.Thread(target=claim_until_empty) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    every_claim = [job_id for mine in claimed for job_id in mine]
    assert sorted(every_claim) == sorted(Job.objects.values_list("pk", flat=True))
    assert Job.objects.filter(status=INFLIGHT, attempts=1).count() == 300


def test_the_dispatcher_releases_due_scheduled_messages_and_periodic_ticks(
    channel, receiver, dispatcher
):
    from broker.models import PeriodicMessage

    push_consumer(channel, receiver)
    due = timezone.now() + timedelta(seconds=30)
    publish(channel, b"later", producer="shop", message_id="later", scheduled_for=due)
    PeriodicMessage.objects.create(
        channel=channel,
        producer_id="shop",
        public_id="every-minute",
        payload=b"tick",
        content_type="text/plain",
        interval_seconds=60,
        next_run_at=due,
    )

    assert dispatcher.maintenance.release_due() == 0
    with time_machine.travel(due + timedelta(seconds=0.5), tick=False):
        assert dispatcher.maintenance.release_due() == 2
        assert dispatcher.maintenance.release_due() == 0  # each exactly once
        run_once(dispatcher)

    assert sorted(request.body for request in receiver.received) == [b"later", b"tick"]
