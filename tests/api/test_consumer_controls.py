"""Pausing, resuming and closing the circuit of a consumer (docs/api.md extensions,
docs/delivery.md, "Circuit breaker"): the admin endpoints, the consumer's JSON, what a paused pull
consumer is handed, the admin actions."""

from __future__ import annotations

import json
import threading
import time
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
import time_machine
from django.db import connection
from django.test import Client
from django.utils.http import http_date

from broker import publish
from consumers.models import Consumer
from consumers.services import set_paused
from jobs.models import Job
from jobs.queue import take_for_pull
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.conftest import ADMIN_TOKEN
from tests.helpers import PULL_HEADERS, make_consumer, make_consumer_with_token

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 1, 1, tzinfo=UTC)
JSON = "application/json"
FORM = "application/x-www-form-urlencoded"
ADMIN_HEADERS = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def worker(channel):
    """A pull consumer with the tokens in PULL_HEADERS."""
    return make_consumer_with_token(channel, "worker")


def control(client, action: str, consumer_id: str = "billing", channel_id: str = "orders"):
    return client.post(f"/channel/{channel_id}/consumer/{consumer_id}/{action}")


def paused_in_db(consumer: Consumer) -> bool:
    return Consumer.objects.values_list("paused", flat=True).get(pk=consumer.pk)


def publish_for(consumer: Consumer, message_id: str) -> Job:
    message = publish("orders", {"id": message_id}, producer="shop", message_id=message_id)
    return Job.objects.get(message=message, consumer=consumer)


# Pause and resume


@pytest.mark.parametrize("kind", [Consumer.Type.PUSH, Consumer.Type.PULL])
def test_pause_then_resume_answers_202_with_the_consumer(admin_client, channel, kind):
    consumer = make_consumer(channel, "billing", type=kind)

    paused = control(admin_client, "pause")
    assert paused.status_code == 202
    assert paused.json()["Paused"] is True
    assert paused_in_db(consumer) is True

    resumed = control(admin_client, "resume")
    assert resumed.status_code == 202
    assert resumed.json()["Paused"] is False
    assert paused_in_db(consumer) is False
    assert resumed.json()["ID"] == "billing"
    assert resumed.json()["Type"] == kind


def test_pause_moves_changed_at_and_last_modified(admin_client, channel):
    with time_machine.travel(T0, tick=False):
        consumer = make_consumer(channel)
    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        response = control(admin_client, "pause")

    consumer.refresh_from_db()
    assert consumer.changed_at == T0 + timedelta(minutes=5)
    assert response.json()["ChangedAt"] == "2026-01-01T00:05:00Z"
    assert response["Last-Modified"] == http_date(consumer.changed_at.timestamp())


def test_pausing_twice_is_202_and_changes_nothing_the_second_time(admin_client, channel):
    with time_machine.travel(T0, tick=False):
        consumer = make_consumer(channel)
        assert control(admin_client, "resume").status_code == 202  # not paused: nothing to do
    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        assert control(admin_client, "pause").status_code == 202
    with time_machine.travel(T0 + timedelta(minutes=5), tick=False):
        again = control(admin_client, "pause")

    assert again.status_code == 202
    assert again.json()["Paused"] is True
    # Unchanged, so a client's Last-Modified from the first pause stays valid.
    assert again.json()["ChangedAt"] == "2026-01-01T00:01:00Z"
    assert paused_in_db(consumer) is True


def test_pausing_saves_only_paused_so_circuit_changes_made_meanwhile_survive(channel):
    consumer = make_consumer(channel)
    Consumer.objects.filter(pk=consumer.pk).update(circuit_failures=3)  # a dispatcher, meanwhile

    set_paused(consumer, True)

    assert Consumer.objects.values_list("paused", "circuit_failures").get() == (True, 3)


@pytest.mark.parametrize("action", ["pause", "resume", "circuit/close"])
def test_controls_need_admin_auth(client, settings, channel, action):
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    consumer = make_consumer(channel)
    Consumer.objects.filter(pk=consumer.pk).update(circuit_failures=5)

    missing = control(client, action)
    wrong = client.post(
        f"/channel/orders/consumer/billing/{action}", headers={"Authorization": "Bearer nope"}
    )

    assert (missing.status_code, wrong.status_code) == (401, 401)
    assert set(missing.json()) == {"Error"}
    assert Consumer.objects.values_list("paused", "circuit_failures").get() == (False, 5)


@pytest.mark.parametrize("action", ["pause", "resume", "circuit/close"])
@pytest.mark.parametrize(("channel_id", "consumer_id"), [("orders", "nobody"), ("nope", "billing")])
def test_controls_of_unknown_consumers_are_404(
    admin_client, channel, action, channel_id, consumer_id
):
    make_consumer(channel)

    response = control(admin_client, action, consumer_id, channel_id)

    assert response.status_code == 404
    assert set(response.json()) == {"Error"}


@pytest.mark.parametrize("action", ["pause", "resume", "circuit/close"])
def test_controls_take_only_post(admin_client, channel, action):
    make_consumer(channel)

    assert admin_client.get(f"/channel/orders/consumer/billing/{action}").status_code == 405


# The consumer's JSON


def test_consumer_json_shows_pause_and_circuit(admin_client, channel):
    make_consumer(channel)

    body = admin_client.get("/channel/orders/consumer/billing").json()

    assert body["Paused"] is False
    assert body["CircuitState"] == "closed"
    assert body["CircuitOpenUntil"] is None
    assert body["ConsecutiveFailures"] == 0
    # The fields webhook-broker clients know are still there, under their names.
    assert {"ID", "Name", "ChangedAt", "CallbackURL", "DeadLetterQueueURL", "Type"} <= set(body)


@pytest.mark.parametrize(("now", "state"), [(T0 - timedelta(seconds=1), "open"), (T0, "half-open")])
def test_consumer_json_shows_an_open_or_half_open_circuit(admin_client, channel, now, state):
    consumer = make_consumer(channel)
    Consumer.objects.filter(pk=consumer.pk).update(
        circuit_failures=5, circuit_open_until=T0, circuit_cooldown_seconds=30
    )

    with time_machine.travel(now, tick=False):
        body = admin_client.get("/channel/orders/consumer/billing").json()

    assert body["CircuitState"] == state
    assert body["CircuitOpenUntil"] == "2026-01-01T00:00:00Z"
    assert body["ConsecutiveFailures"] == 5


def test_consumer_put_response_has_the_new_fields(admin_client, channel):
    response = admin_client.put(
        "/channel/orders/consumer/fresh",
        urlencode({"callbackUrl": "http://127.0.0.1:9/fresh"}),
        content_type=FORM,
    )

    assert response.status_code == 200
    body = response.json()
    assert (body["Paused"], body["CircuitState"], body["ConsecutiveFailures"]) == (
        False,
        "closed",
        0,
    )


# Closing the circuit


def test_circuit_close_resets_the_breaker(admin_client, channel):
    with time_machine.travel(T0, tick=False):
        consumer = make_consumer(channel)
    Consumer.objects.filter(pk=consumer.pk).update(
        circuit_failures=7,
        circuit_open_until=T0 + timedelta(minutes=10),
        circuit_cooldown_seconds=120,
    )

    with time_machine.travel(T0 + timedelta(minutes=1), tick=False):
        response = control(admin_client, "circuit/close")

    assert response.status_code == 202
    body = response.json()
    assert (body["CircuitState"], body["CircuitOpenUntil"], body["ConsecutiveFailures"]) == (
        "closed",
        None,
        0,
    )
    stored = Consumer.objects.values(
        "circuit_failures", "circuit_open_until", "circuit_cooldown_seconds", "changed_at"
    ).get(pk=consumer.pk)
    assert stored == {
        "circuit_failures": 0,
        "circuit_open_until": None,
        "circuit_cooldown_seconds": 0,
        "changed_at": T0,  # circuit changes are delivery activity, not settings
    }


def test_circuit_close_of_a_closed_circuit_is_202(admin_client, channel):
    make_consumer(channel)

    response = control(admin_client, "circuit/close")

    assert response.status_code == 202
    assert response.json()["CircuitState"] == "closed"


# A paused pull consumer is handed nothing


def queued(client) -> list[str]:
    response = client.get("/channel/orders/consumer/worker/queued-jobs", headers=PULL_HEADERS)
    assert response.status_code == 200
    return [item["Message"]["MessageID"] for item in response.json()["Result"]]


def claim(client, **form) -> list[str]:
    response = client.post(
        "/channel/orders/consumer/worker/claim",
        urlencode(form),
        content_type=FORM,
        headers=PULL_HEADERS,
    )
    assert response.status_code == 200
    return [item["Message"]["MessageID"] for item in response.json()["Result"]]


def move(client, job: Job, state: str):
    return client.post(
        f"/channel/orders/consumer/worker/job/{job.public_id}",
        json.dumps({"NextState": state}),
        content_type=JSON,
        headers=PULL_HEADERS,
    )


def test_paused_pull_consumer_lists_no_queued_jobs_until_resumed(admin_client, worker):
    publish_for(worker, "m1")
    control(admin_client, "pause", "worker")

    assert queued(admin_client) == []

    control(admin_client, "resume", "worker")
    assert queued(admin_client) == ["m1"]


def test_paused_pull_consumer_claims_nothing_until_resumed(admin_client, worker):
    job = publish_for(worker, "m1")
    control(admin_client, "pause", "worker")

    assert claim(admin_client, limit=10) == []
    assert Job.objects.values_list("status", "attempts").get(pk=job.pk) == (QUEUED, 0)

    control(admin_client, "resume", "worker")
    assert claim(admin_client, limit=10) == ["m1"]


@pytest.mark.parametrize("status", [QUEUED, DEAD])
def test_paused_pull_consumer_cannot_take_a_job(admin_client, worker, status):
    job = publish_for(worker, "m1")
    if status == DEAD:
        take_for_pull(job)
        job.mark_dead("gave up")
    before = Job.objects.filter(pk=job.pk).values().get()
    control(admin_client, "pause", "worker")

    response = move(admin_client, job, INFLIGHT)

    assert response.status_code == 409
    assert "paused" in response.json()["Error"]
    assert Job.objects.filter(pk=job.pk).values().get() == before

    control(admin_client, "resume", "worker")
    assert move(admin_client, job, INFLIGHT).status_code == 202
    assert Job.objects.get(pk=job.pk).status == INFLIGHT


@pytest.mark.parametrize("outcome", [DELIVERED, DEAD])
def test_paused_pull_consumer_still_reports_jobs_it_holds(admin_client, worker, outcome):
    job = publish_for(worker, "m1")
    assert claim(admin_client) == ["m1"]
    control(admin_client, "pause", "worker")

    assert move(admin_client, job, INFLIGHT).status_code == 202  # already there: nothing new
    assert move(admin_client, job, outcome).status_code == 202

    assert Job.objects.get(pk=job.pk).status == outcome


def test_paused_consumer_forbidden_transition_stays_a_400(admin_client, worker):
    job = publish_for(worker, "m1")
    claim(admin_client)
    move(admin_client, job, DELIVERED)
    control(admin_client, "pause", "worker")

    assert move(admin_client, job, INFLIGHT).status_code == 400


@pytest.mark.django_db(transaction=True)
def test_claim_long_poll_of_a_paused_consumer_gets_jobs_once_resumed(admin_client, worker):
    publish_for(worker, "m1")
    Consumer.objects.filter(pk=worker.pk).update(paused=True)

    statuses: list[int] = []

    def resume_soon() -> None:
        try:
            time.sleep(0.3)
            statuses.append(control(Client(headers=ADMIN_HEADERS), "resume", "worker").status_code)
        finally:
            connection.close()

    resumer = threading.Thread(target=resume_soon)
    started = time.monotonic()
    resumer.start()
    taken = claim(admin_client, wait=15)
    elapsed = time.monotonic() - started
    resumer.join()

    assert statuses == [202]
    assert taken == ["m1"]
    assert 0.3 <= elapsed < 15  # long before the wait was over, even on a loaded machine


# Django admin


def test_admin_list_shows_pause_and_circuit(superuser_client, channel):
    consumer = make_consumer(channel)
    Consumer.objects.filter(pk=consumer.pk).update(
        paused=True, circuit_failures=5, circuit_open_until=T0 + timedelta(days=3650)
    )

    page = superuser_client.get("/admin/consumers/consumer/").content.decode()

    assert "column-circuit" in page
    assert ">open<" in page


@pytest.mark.parametrize(
    ("action", "paused", "message"),
    [("pause", True, "Paused 2 consumer(s)."), ("resume", False, "Resumed 2 consumer(s).")],
)
def test_admin_pause_and_resume_actions(superuser_client, channel, action, paused, message):
    first, second = make_consumer(channel, "a"), make_consumer(channel, "b")
    Consumer.objects.filter(pk=second.pk).update(paused=not paused)

    response = superuser_client.post(
        "/admin/consumers/consumer/",
        {"action": action, "_selected_action": [first.pk, second.pk]},
        follow=True,
    )

    assert response.status_code == 200
    assert message in response.content.decode()
    assert {paused_in_db(first), paused_in_db(second)} == {paused}


def test_admin_close_circuit_action(superuser_client, channel):
    consumer = make_consumer(channel)
    Consumer.objects.filter(pk=consumer.pk).update(
        circuit_failures=5, circuit_open_until=T0, circuit_cooldown_seconds=60
    )

    superuser_client.post(
        "/admin/consumers/consumer/",
        {"action": "close_circuit", "_selected_action": [consumer.pk]},
    )

    consumer.refresh_from_db()
    assert (consumer.circuit_failures, consumer.circuit_open_until) == (0, None)
    assert consumer.circuit_cooldown_seconds == 0


def test_a_paused_push_consumer_holds_everything_and_resume_delivers_it(
    admin_client, channel, receiver
):
    from jobs.dispatch import Dispatcher
    from tests.delivery import push_consumer, run_once

    push_consumer(channel, receiver)
    dispatcher = Dispatcher()
    assert control(admin_client, "pause").status_code == 202
    for number in range(3):
        publish(channel, b"x", producer="shop", message_id=f"m{number}")

    assert run_once(dispatcher) == []
    assert receiver.received == []
    assert set(Job.objects.values_list("status", "attempts")) == {(QUEUED, 0)}

    assert control(admin_client, "resume").status_code == 202
    assert len(run_once(dispatcher)) == 3
    assert Job.objects.filter(status=DELIVERED).count() == 3
