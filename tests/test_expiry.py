"""The age limit of push jobs (issue 14 §5, jobs/expiry.py): a job held back for ever (by an open
circuit above all) goes DEAD with reason "expired", and the DLQ tools bring it back as usual."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import time_machine

from broker import publish
from consumers.models import Consumer
from jobs.dispatch import Dispatcher
from jobs.expiry import expire_old_jobs
from jobs.models import Job
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer, make_producer
from tests.receiver import Reply
from tests.test_dispatch import push_consumer, run_once

pytestmark = pytest.mark.django_db

PUBLISHED = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)


@pytest.fixture
def channel():
    make_producer()
    return make_channel()


def held(channel, name: str = "billing", **fields) -> Consumer:
    """A push consumer whose circuit stays open for a week: nothing is attempted."""
    consumer = make_consumer(channel, name)
    fields.setdefault("circuit_open_until", PUBLISHED + 7 * DAY)
    Consumer.objects.filter(pk=consumer.pk).update(**fields)
    return consumer


def publish_at(channel, when: datetime = PUBLISHED) -> None:
    with time_machine.travel(when, tick=False):
        publish(channel, b"x", producer="shop")


def expire_at(when: datetime) -> int:
    with time_machine.travel(when, tick=False):
        return expire_old_jobs()


def test_a_job_held_back_past_three_days_goes_dead_as_expired(channel):
    consumer = held(channel)
    publish_at(channel)
    Job.objects.update(last_error="HTTP 503")

    assert expire_at(PUBLISHED + 3 * DAY) == 0  # not older than the limit yet
    assert expire_at(PUBLISHED + 3 * DAY + timedelta(seconds=1)) == 1

    job = Job.objects.get(consumer=consumer)
    assert job.status == DEAD
    assert job.last_error == (
        "expired: not delivered within 259200 s of being queued; last error: HTTP 503"
    )


def test_the_consumers_own_limit_wins_and_zero_means_none(channel, settings):
    short = held(channel, "short", max_job_age=60)
    never = held(channel, "never", max_job_age=0)
    usual = held(channel, "usual")
    publish_at(channel)

    expire_at(PUBLISHED + timedelta(seconds=61))
    assert Job.objects.get(consumer=short).status == DEAD
    assert Job.objects.get(consumer=usual).status == QUEUED

    expire_at(PUBLISHED + 30 * DAY)
    assert Job.objects.get(consumer=usual).status == DEAD
    assert Job.objects.get(consumer=never).status == QUEUED


def test_a_global_limit_of_zero_expires_nothing(channel, settings):
    settings.BROKER_MAX_JOB_AGE_SECONDS = 0
    held(channel)
    publish_at(channel)

    assert expire_at(PUBLISHED + 365 * DAY) == 0


def test_pull_consumers_and_paused_ones_keep_their_jobs(channel):
    make_consumer(channel, "puller", type=Consumer.Type.PULL)
    held(channel, "paused", paused=True)
    publish_at(channel)

    assert expire_at(PUBLISHED + 30 * DAY) == 0
    assert set(Job.objects.values_list("status", flat=True)) == {QUEUED}


def test_a_requeued_job_gets_a_full_age_again(channel):
    consumer = held(channel)
    publish_at(channel)
    expire_at(PUBLISHED + 4 * DAY)

    with time_machine.travel(PUBLISHED + 5 * DAY, tick=False):
        Job.objects.get().requeue()
    assert expire_at(PUBLISHED + 6 * DAY) == 0
    assert expire_at(PUBLISHED + 8 * DAY + timedelta(seconds=1)) == 1
    assert Job.objects.get(consumer=consumer).status == DEAD


def test_the_dispatchers_sweep_expires_and_the_dlq_requeues_to_delivery(
    channel, receiver, admin_client
):
    """The whole way: a consumer down for days, its job expired by a dispatcher's sweep, the
    consumer back, the job requeued through the DLQ API and delivered."""
    consumer = push_consumer(channel, receiver, max_job_age=3600)
    receiver.replies["/hook"] = Reply(503)
    publish_at(channel)
    dispatcher = Dispatcher()
    with time_machine.travel(PUBLISHED + timedelta(hours=2), tick=False):
        dispatcher.sweep()
    assert Job.objects.get().status == DEAD

    receiver.replies["/hook"] = Reply(200)
    response = admin_client.post(
        f"/channel/{channel.pk}/consumer/{consumer.public_id}/dlq",
        f"requeue={consumer.token}",
        content_type=FORM,
    )
    assert response.status_code == 202
    run_once(dispatcher)
    assert Job.objects.get().status == DELIVERED


def test_max_job_age_is_a_consumer_setting_of_the_api(channel, admin_client):
    url = f"/channel/{channel.pk}/consumer/billing"
    form = "callbackUrl=http://127.0.0.1:9/hook&maxJobAge=86400"

    created = admin_client.put(url, form, content_type=FORM)

    assert created.status_code == 200, created.content  # as webhook-broker: 200 on create too
    assert created.json()["MaxJobAge"] == 86400
    assert Consumer.objects.get().max_job_age == 86400


@pytest.mark.parametrize("value", ["-1", "soon", "1,2", str(366 * 86400)])
def test_a_bad_max_job_age_is_refused_naming_it(value, channel, admin_client):
    response = admin_client.put(
        f"/channel/{channel.pk}/consumer/billing",
        f"callbackUrl=http://127.0.0.1:9/hook&maxJobAge={value}",
        content_type=FORM,
    )

    assert response.status_code == 400
    assert "maxJobAge" in response.content.decode()
    assert not Consumer.objects.exists()
