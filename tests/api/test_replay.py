"""POST /channel/{c}/message/{m}/replay: deliver an already delivered message again (docs/api.md).

Against real PostgreSQL and the loopback receiver: the dispatcher really delivers a replayed job
a second time, and an ordered consumer still gets one message of a key at a time.
"""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.utils import timezone

from broker import publish
from broker.models import Message
from broker.replay import JOB_DELETED, replay
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.models import DeliveryAttempt, Job
from jobs.queue.rules import WAKEUP_CHANNEL
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.conftest import FORM
from tests.delivery import push_consumer, run_once, send
from tests.helpers import at_once, make_channel, make_consumer
from tests.wakeup import listening

pytestmark = pytest.mark.django_db

URL = "/channel/orders/message/m-1/replay"


@pytest.fixture(autouse=True)
def no_jitter(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [60]
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 0


def job_of(consumer_id: str, message_id: str = "m-1") -> Job:
    return Job.objects.get(consumer__public_id=consumer_id, message__public_id=message_id)


def set_status(consumer_id: str, status: str, message_id: str = "m-1") -> None:
    Job.objects.filter(pk=job_of(consumer_id, message_id).pk).update(status=status, attempts=1)


def delivered_to(channel, receiver, *consumer_ids: str) -> None:
    """m-1 published to push consumers on the receiver and delivered to each of them."""
    for consumer_id in consumer_ids:
        push_consumer(channel, receiver, consumer_id, f"/{consumer_id}")
    publish(channel, b'{"order": 42}', producer="shop", message_id="m-1")
    assert [r.status_code for r in deliver_due()] == [200] * len(consumer_ids)


def deliver_due() -> list[AttemptResult]:
    """One dispatcher step: claim what is due, deliver it to the receiver, record the outcomes."""
    return run_once(Dispatcher(DispatcherConfig(dispatcher_id="test-dispatcher")))


def post(client, url: str = URL, body: str = "", **kwargs):
    return client.post(url, body, content_type=FORM, **kwargs)


# --- auth and 404s -----------------------------------------------------------------------------


def test_replay_needs_an_admin(client, settings, channel, receiver):
    settings.BROKER_ADMIN_TOKENS = ["the-admin-token"]
    delivered_to(channel, receiver, "billing")

    anonymous = post(client)
    wrong = post(client, headers={"Authorization": "Bearer not-it"})

    assert (anonymous.status_code, wrong.status_code) == (401, 401)
    assert "Error" in anonymous.json()
    assert job_of("billing").status == DELIVERED


@pytest.mark.parametrize(
    ("url", "body"),
    [
        ("/channel/nope/message/m-1/replay", ""),
        ("/channel/orders/message/nope/replay", ""),
        (URL, "consumer=nope"),
    ],
)
def test_unknown_channel_message_or_consumer_is_404(admin_client, channel, receiver, url, body):
    delivered_to(channel, receiver, "billing")
    make_channel("refunds")
    make_consumer(Consumer.objects.get(public_id="billing").channel, "other")

    response = post(admin_client, url, body)

    assert response.status_code == 404
    assert set(response.json()) == {"Error"}
    assert job_of("billing").status == DELIVERED


def test_a_consumer_of_another_channel_is_404(admin_client, channel, receiver):
    delivered_to(channel, receiver, "billing")
    make_consumer(make_channel("refunds"), "audit")

    assert post(admin_client, body="consumer=audit").status_code == 404


@pytest.mark.parametrize(
    ("body", "content_type", "status"),
    [
        ("x", "text/plain", 415),
        ("[1]", "application/json", 400),
        ('{"consumer": null}', "application/json", 400),
        ("consumer=", FORM, 400),
    ],
)
def test_a_malformed_body_is_refused(admin_client, channel, receiver, body, content_type, status):
    delivered_to(channel, receiver, "billing")

    response = admin_client.post(URL, body, content_type=content_type)

    assert response.status_code == status
    assert set(response.json()) == {"Error"}
    assert job_of("billing").status == DELIVERED


# --- what a replay does --------------------------------------------------------------------------


def test_replay_to_one_consumer_queues_its_job_again_and_keeps_its_history(
    admin_client, channel, receiver
):
    delivered_to(channel, receiver, "billing", "audit")
    before = job_of("billing")

    response = post(admin_client, body="consumer=billing")

    assert response.status_code == 202
    assert response.json() == {"Replayed": ["billing"], "Created": [], "Skipped": []}
    job = job_of("billing")
    assert (job.pk, job.status, job.attempts, job.lease_expires_at) == (before.pk, QUEUED, 0, None)
    assert job.next_attempt_at <= timezone.now()
    assert job.status_changed_at > before.status_changed_at
    assert DeliveryAttempt.objects.filter(job=job).count() == 1  # the first delivery's record
    assert job_of("audit").status == DELIVERED  # not asked for


def test_replay_takes_the_consumer_from_json_too(admin_client, channel, receiver):
    delivered_to(channel, receiver, "billing", "audit")

    response = admin_client.post(URL, {"consumer": "audit"}, content_type="application/json")

    assert response.status_code == 202
    assert response.json()["Replayed"] == ["audit"]
    assert (job_of("audit").status, job_of("billing").status) == (QUEUED, DELIVERED)


def test_replay_to_all_queues_the_delivered_jobs_and_says_why_the_others_were_left(
    admin_client, channel, receiver
):
    delivered_to(channel, receiver, "a-delivered", "b-queued", "c-inflight", "d-dead")
    set_status("b-queued", QUEUED)
    set_status("c-inflight", INFLIGHT)
    set_status("d-dead", DEAD)

    response = post(admin_client)  # no body at all: every consumer

    assert response.status_code == 202
    body = response.json()
    assert (body["Replayed"], body["Created"]) == (["a-delivered"], [])
    assert [(s["ConsumerID"], s["Status"]) for s in body["Skipped"]] == [
        ("b-queued", QUEUED),
        ("c-inflight", INFLIGHT),
        ("d-dead", DEAD),
    ]
    assert "requeue" in body["Skipped"][2]["Reason"]
    statuses = dict(Job.objects.values_list("consumer__public_id", "status"))
    assert statuses == {
        "a-delivered": QUEUED,
        "b-queued": QUEUED,
        "c-inflight": INFLIGHT,
        "d-dead": DEAD,
    }
    assert job_of("b-queued").attempts == 1  # untouched, not reset


@pytest.mark.parametrize("status", [QUEUED, INFLIGHT, DEAD])
def test_nothing_to_replay_is_409_and_changes_nothing(admin_client, channel, receiver, status):
    delivered_to(channel, receiver, "billing")
    set_status("billing", status)
    before = Job.objects.values().get()

    response = post(admin_client, body="consumer=billing")
    to_all = post(admin_client)

    assert (response.status_code, to_all.status_code) == (409, 409)
    assert set(response.json()) == {"Error"}
    assert "billing" in response.json()["Error"]
    assert Job.objects.values().get() == before


def test_a_consumer_added_after_the_publish_gets_a_job(admin_client, channel, receiver):
    delivered_to(channel, receiver, "billing")
    push_consumer(channel, receiver, "late", "/late")

    one = post(admin_client, body="consumer=late")
    again = post(admin_client, body="consumer=late")  # its job is queued now

    assert one.status_code == 202
    assert one.json() == {"Replayed": [], "Created": ["late"], "Skipped": []}
    assert again.status_code == 409
    job = job_of("late")
    message = Message.objects.get()
    assert (job.status, job.priority, job.ordering_key) == (QUEUED, message.priority, "")
    assert job_of("billing").status == DELIVERED


def test_replay_to_all_creates_the_missing_jobs_and_replays_the_rest(
    admin_client, channel, receiver
):
    delivered_to(channel, receiver, "billing")
    push_consumer(channel, receiver, "late", "/late")

    response = post(admin_client)

    assert response.json() == {"Replayed": ["billing"], "Created": ["late"], "Skipped": []}
    assert set(Job.objects.values_list("status", flat=True)) == {QUEUED}


def test_a_message_published_without_consumers_becomes_dispatched(admin_client, channel, receiver):
    publish(channel, b"x", producer="shop", message_id="m-1")
    assert Message.objects.get().status == Message.Status.ACKNOWLEDGED
    assert post(admin_client).status_code == 409  # still no consumer

    push_consumer(channel, receiver, "billing", "/billing")
    response = post(admin_client)

    assert response.status_code == 202
    message = Message.objects.get()
    assert message.status == Message.Status.DISPATCHED
    assert message.dispatched_at is not None


def test_a_scheduled_message_not_released_yet_is_409(admin_client, channel, receiver):
    push_consumer(channel, receiver, "billing", "/billing")
    publish(
        channel,
        b"x",
        producer="shop",
        message_id="m-1",
        scheduled_for=timezone.now() + timedelta(hours=1),
    )

    response = post(admin_client)

    assert response.status_code == 409
    assert "scheduled" in response.json()["Error"]
    assert not Job.objects.exists()


def test_an_offloaded_payload_is_replayed_while_present_and_409_once_gone(
    admin_client, channel, receiver, settings, tmp_path
):
    location = tmp_path / "payloads"
    settings.STORAGES = {
        **settings.STORAGES,
        "broker_payloads": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": location},
        },
    }
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = 1024
    push_consumer(channel, receiver, "billing", "/billing")
    message = publish(channel, b"y" * 4096, producer="shop", message_id="m-1")
    assert message.payload_file
    deliver_due()

    assert post(admin_client).status_code == 202
    deliver_due()
    assert [len(r.body) for r in receiver.received] == [4096, 4096]

    (location / message.payload_file).unlink()
    gone = post(admin_client)

    assert gone.status_code == 409
    assert "payload-missing" in gone.json()["Error"]
    assert job_of("billing").status == DELIVERED


# --- delivered again -----------------------------------------------------------------------------


def test_the_dispatcher_delivers_a_replayed_message_again(admin_client, channel, receiver):
    delivered_to(channel, receiver, "billing", "audit")

    post(admin_client, body="consumer=billing")
    results = deliver_due()

    assert [r.status_code for r in results] == [200]
    first, other, again = receiver.received
    assert sorted([first.path, other.path]) == ["/audit", "/billing"]
    assert again.path == "/billing"
    assert again.body == b'{"order": 42}'
    assert again.headers["X-Broker-Message-ID"] == "m-1"
    job = job_of("billing")
    assert (job.status, job.attempts) == (DELIVERED, 1)
    attempts = DeliveryAttempt.objects.filter(job=job).order_by("started_at")
    assert [(a.attempt_number, a.status_code) for a in attempts] == [(1, 200), (1, 200)]


def test_an_ordered_consumer_gets_a_replayed_message_only_once_its_key_is_idle(
    admin_client, channel, receiver, dispatcher
):
    ordered = push_consumer(channel, receiver, "billing", "/billing")
    ordered.ordering = Consumer.Ordering.ORDERED
    ordered.save()
    for message_id in ["m-1", "m-2", "m-3"]:
        publish(
            channel, message_id.encode(), producer="shop", message_id=message_id, ordering_key="k"
        )
    run_once(dispatcher)  # m-1 delivered
    in_flight = dispatcher.claim(10)  # m-2 taken, not answered yet; m-3 waits

    busy = post(admin_client, body="consumer=billing")
    assert busy.status_code == 409
    assert "ordering key" in busy.json()["Error"]
    dispatcher.complete(send(in_flight))  # m-2 delivered; m-3 still waits in the key
    assert post(admin_client, body="consumer=billing").status_code == 409
    run_once(dispatcher)  # m-3 delivered: the key is idle
    assert job_of("billing", "m-1").status == DELIVERED

    assert post(admin_client, body="consumer=billing").status_code == 202
    run_once(dispatcher)
    assert run_once(dispatcher) == []

    assert [r.body for r in receiver.received] == [b"m-1", b"m-2", b"m-3", b"m-1"]


def test_a_consumer_older_than_the_message_whose_job_was_deleted_gets_none(
    admin_client, channel, receiver
):
    delivered_to(channel, receiver, "billing", "audit")
    Job.objects.filter(consumer__public_id="audit").delete()  # e.g. dead, then purged

    response = post(admin_client)

    assert response.status_code == 202
    assert response.json() == {
        "Replayed": ["billing"],
        "Created": [],
        "Skipped": [{"ConsumerID": "audit", "Status": "", "Reason": JOB_DELETED}],
    }
    assert not Job.objects.filter(consumer__public_id="audit").exists()


@pytest.mark.django_db(transaction=True)
def test_a_replay_wakes_idle_dispatchers_and_a_refused_one_does_not(
    admin_client, channel, receiver
):
    delivered_to(channel, receiver, "billing")
    with listening(guard=True) as listener:  # as an idle dispatcher does
        assert post(admin_client).status_code == 202
        woken = [n.channel for n in listener.notifies(timeout=2, stop_after=1)]
        assert post(admin_client).status_code == 409
        refused = [n.channel for n in listener.notifies(timeout=0.3)]

    assert (woken, refused) == ([WAKEUP_CHANNEL], [])


# --- concurrency -------------------------------------------------------------------------------


@pytest.mark.django_db(transaction=True)
def test_concurrent_replays_create_a_new_consumers_job_once(channel, receiver):
    delivered_to(channel, receiver, "billing")
    push_consumer(channel, receiver, "late", "/late")
    message = Message.objects.get()
    late = Consumer.objects.get(public_id="late")
    created: list[list[str]] = []

    def replay_in_thread() -> None:
        created.append(replay(message, late).created)

    at_once(*[replay_in_thread] * 4, timeout=30)

    assert sorted(created) == [[], [], [], ["late"]]
    assert Job.objects.filter(consumer=late).count() == 1
