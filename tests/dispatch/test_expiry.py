"""The age limit of push jobs (issue 14 §5, jobs/queue/expiry.py): a job held back for ever (by an
open
circuit above all) goes DEAD with reason "expired", and the DLQ tools bring it back as usual."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import time_machine
from django.db import connection
from django.utils import timezone

from broker import publish
from broker.models import Message
from consumers.models import Consumer
from consumers.services import pause_consumer
from jobs.dispatch import Dispatcher
from jobs.models import Job
from jobs.queue.expiry import expire_old_jobs
from jobs.queue.queries import statement
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.conftest import FORM
from tests.delivery import push_consumer, run_once
from tests.helpers import make_consumer, scans_a_table
from tests.receiver import Reply

pytestmark = pytest.mark.django_db

PUBLISHED = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
DAY = timedelta(days=1)


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
        dispatcher.maintenance.sweep()
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


def test_a_resumed_consumer_gives_its_waiting_jobs_a_full_age_again(channel):
    consumer = held(channel, paused=True)
    publish_at(channel)
    assert expire_at(PUBLISHED + 4 * DAY) == 0  # paused: held on purpose

    with time_machine.travel(PUBLISHED + 4 * DAY, tick=False):
        pause_consumer(channel.pk, consumer.public_id, paused=False)

    assert expire_at(PUBLISHED + 6 * DAY) == 0
    assert expire_at(PUBLISHED + 7 * DAY + timedelta(seconds=1)) == 1


def test_a_pull_consumer_turned_push_gives_its_jobs_a_full_age(channel, admin_client):
    make_consumer(channel, "worker", type=Consumer.Type.PULL)
    publish_at(channel)

    url = f"/channel/{channel.pk}/consumer/worker"
    with time_machine.travel(PUBLISHED + 10 * DAY, tick=False):
        response = admin_client.put(
            url,
            "callbackUrl=http://127.0.0.1:9/hook&type=push",
            content_type=FORM,
            headers={"If-Unmodified-Since": admin_client.get(url)["Last-Modified"]},
        )
    assert response.status_code == 200, response.content

    assert expire_at(PUBLISHED + 11 * DAY) == 0
    assert expire_at(PUBLISHED + 13 * DAY + timedelta(seconds=1)) == 1


def test_a_requeued_job_no_longer_says_why_it_died(channel):
    held(channel)
    publish_at(channel)
    expire_at(PUBLISHED + 4 * DAY)

    Job.objects.get().requeue()

    job = Job.objects.get()
    assert (job.status, job.last_error, job.attempts) == (QUEUED, "", 0)


# Committed and emptied by TRUNCATE afterwards: rolled back, its 200,000 rows would stay as dead
# tuples and its ANALYZE's row counts in pg_class, slowing every later test of the worker.
@pytest.mark.django_db(transaction=True)
def test_the_expiry_probe_reads_the_consumers_age_index_whatever_the_backlog(channel):
    """100,000 young QUEUED jobs and 100,000 delivered ones: the probe for old jobs must go
    through job_consumer_queued_age_idx and find nothing without reading them."""
    consumer = held(channel)
    now = timezone.now()  # the test's clock, which may not be the database server's
    with connection.cursor() as cursor:
        cursor.execute(
            f"""INSERT INTO {Message._meta.db_table} (channel_id, producer_id, public_id, payload,
                content_type, headers, priority, status, received_at, ordering_key, payload_size,
                payload_file)
            SELECT %s, 'shop', 'bulk-' || n, '\\x7b7d', 'application/json', '{{}}', 0,
                'DISPATCHED', %s, '', 2, ''
            FROM generate_series(1, 200000) AS n""",  # noqa: S608
            [channel.pk, now],
        )
        cursor.execute(
            f"""INSERT INTO {Job._meta.db_table} (message_id, consumer_id, status, priority,
                ordering_key, attempts, next_attempt_at, incremental_timeout, last_error,
                created_at, status_changed_at, enqueued_at)
            SELECT id, %s, CASE WHEN id %% 2 = 0 THEN 'QUEUED' ELSE 'DELIVERED' END, 0, '', 0,
                received_at, 0, '', received_at, received_at, received_at
            FROM {Message._meta.db_table}""",  # noqa: S608
            [consumer.pk],
        )
        cursor.execute("ANALYZE")

    parameters: dict[str, Any] = {
        "now": now,
        "changed_at": now,
        "batch": 500,
        "default_seconds": 3 * 24 * 3600,
        "expired": "expired",
    }
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {statement('expire_old_jobs')}", parameters)
        plan = "\n".join(row[0] for row in cursor.fetchall())

    assert "job_consumer_queued_age_idx" in plan, plan
    # The consumers are read whole (a row each, as the push consumers are listed), and so is the
    # empty DEFAULT partition (one page, probed per consumer); the time partitions never.
    scanned = [
        line
        for line in plan.splitlines()
        if "consumers_consumer" not in line and "jobs_job_default" not in line
    ]
    assert not scans_a_table("\n".join(scanned)), plan
