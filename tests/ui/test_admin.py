"""Django admin: every model has working pages; invariants are protected."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from broker.models import Channel
from consumers.models import Consumer
from jobs.models import DeliveryAttempt
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.conftest import FORM
from tests.helpers import make_job

pytestmark = pytest.mark.django_db


@pytest.fixture
def job():
    job = make_job(DEAD, attempts=3)
    DeliveryAttempt.objects.create(
        job=job,
        attempt_number=1,
        started_at=job.created_at,
        duration_ms=12.5,
        status_code=503,
        error_class="http-status",
        dispatcher_id="d1",
    )
    return job


@pytest.mark.parametrize(
    "model",
    [
        "broker/producer",
        "broker/channel",
        "broker/message",
        "consumers/consumer",
        "jobs/job",
        "jobs/deliveryattempt",
    ],
)
def test_list_and_detail_pages_render(superuser_client, job, model):
    objects = {
        "broker/producer": job.message.producer_id,
        "broker/channel": job.message.channel_id,
        "broker/message": job.message_id,
        "consumers/consumer": job.consumer_id,
        "jobs/job": job.pk,
        "jobs/deliveryattempt": job.delivery_attempts.get().pk,
    }

    assert superuser_client.get(f"/admin/{model}/").status_code == 200
    assert superuser_client.get(f"/admin/{model}/{objects[model]}/change/").status_code == 200


def test_admin_requires_staff_login(client):
    response = client.get("/admin/jobs/job/")

    assert response.status_code == 302
    assert "/admin/login/" in response["Location"]


def test_jobs_and_messages_cannot_be_added_or_edited(superuser_client, job):
    assert superuser_client.get("/admin/jobs/job/add/").status_code == 403
    assert superuser_client.get("/admin/broker/message/add/").status_code == 403
    response = superuser_client.post(f"/admin/jobs/job/{job.pk}/change/", {"status": DELIVERED})
    assert response.status_code == 403
    job.refresh_from_db()
    assert job.status == DEAD


def test_requeue_action_goes_through_the_state_machine(superuser_client, job):
    delivered = make_job(DELIVERED)

    response = superuser_client.post(
        "/admin/jobs/job/",
        {"action": "requeue_dead", "_selected_action": [job.pk, delivered.pk]},
        follow=True,
    )

    assert "Requeued 1 dead job(s)." in response.content.decode()
    job.refresh_from_db()
    delivered.refresh_from_db()
    assert (job.status, job.attempts) == (QUEUED, 0)
    assert delivered.status == DELIVERED


def test_consumer_token_is_never_shown(superuser_client, job):
    consumer = Consumer.objects.get(pk=job.consumer_id)

    page = superuser_client.get(f"/admin/consumers/consumer/{consumer.pk}/change/").content.decode()

    assert consumer.token not in page


def test_creating_a_channel_shows_its_generated_token_once(superuser_client):
    response = superuser_client.post(
        "/admin/broker/channel/add/", {"id": "payments", "name": "Payments"}, follow=True
    )

    page = response.content.decode()
    channel = Channel.objects.get(pk="payments")
    token = page.split("Token of payments: ")[1].split(" ")[0]
    assert channel.check_token(token)
    assert (
        token not in superuser_client.get("/admin/broker/channel/payments/change/").content.decode()
    )


def test_the_consumer_form_refuses_a_private_callback_address(superuser_client, job, settings):
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False
    consumer = Consumer.objects.get(pk=job.consumer_id)
    form = {
        "channel": consumer.channel_id,
        "public_id": consumer.public_id,
        "name": consumer.name,
        "new_callback_url": "http://169.254.169.254/latest/meta-data/",
        "type": consumer.type,
        "ordering": consumer.ordering,
        "non_retryable_statuses": "",
    }

    response = superuser_client.post(f"/admin/consumers/consumer/{consumer.pk}/change/", form)

    assert response.status_code == 200  # the form again, with the error
    assert "errorlist" in response.content.decode()
    consumer.refresh_from_db()
    assert consumer.callback_url != form["new_callback_url"]


def admin_consumer_form(consumer: Consumer, **settings: str) -> dict[str, str]:
    return {
        "channel": consumer.channel_id,
        "public_id": consumer.public_id,
        "name": consumer.name,
        "type": consumer.type,
        "ordering": consumer.ordering,
        **settings,
    }


@pytest.mark.parametrize(
    ("field", "wire_name", "value"),
    [
        ("retry_delays", "retryDelays", "1,x"),
        ("retry_delays", "retryDelays", ",".join(["1"] * 51)),
        ("non_retryable_statuses", "nonRetryableStatuses", "99"),
        ("max_in_flight", "maxInFlight", "0"),
        ("max_job_age", "maxJobAge", "-1"),
        ("max_per_second", "maxPerSecond", "100001"),
        ("event_types", "eventTypes", "order.**"),
    ],
)
def test_the_consumer_form_refuses_what_the_api_refuses_with_its_words(
    superuser_client, admin_client, job, field, wire_name, value
):
    """One validation (consumers/services.py) for the API, the operator UI and the admin."""
    consumer = Consumer.objects.get(pk=job.consumer_id)
    page = f"/admin/consumers/consumer/{consumer.pk}/change/"

    response = superuser_client.post(page, admin_consumer_form(consumer, **{field: value}))

    assert response.status_code == 200  # the form again, with the error
    errors = response.context["adminform"].form.errors
    assert list(errors) == [field]
    api = admin_client.put(
        f"/channel/{consumer.channel_id}/consumer/{consumer.public_id}",
        urlencode({"callbackUrl": "https://b.example/h", wire_name: value}),
        content_type=FORM,
    )
    assert api.json()["Error"] == f"{wire_name}: {errors[field][0]}"


def test_the_consumer_form_shows_and_saves_settings_as_the_ui_does(superuser_client, job):
    Consumer.objects.filter(pk=job.consumer_id).update(
        retry_delays=[5, 60], event_types=["a.*"], max_per_second=0.5
    )
    consumer = Consumer.objects.get(pk=job.consumer_id)
    page = f"/admin/consumers/consumer/{consumer.pk}/change/"

    form = superuser_client.get(page).context["adminform"].form
    typed = {"retry_delays": "5, 60", "event_types": "a.*", "max_per_second": "0.5"}
    assert {name: form.initial[name] for name in typed} == typed

    changed = {"retry_delays": "1,2, 3", "event_types": "b.*, c", "max_job_age": "0"}
    response = superuser_client.post(page, admin_consumer_form(consumer, **changed))

    assert response.status_code == 302
    consumer.refresh_from_db()
    assert (consumer.retry_delays, consumer.event_types, consumer.max_job_age) == (
        [1, 2, 3],
        ["b.*", "c"],
        0,
    )
    assert (consumer.max_per_second, consumer.non_retryable_statuses) == (None, [])
