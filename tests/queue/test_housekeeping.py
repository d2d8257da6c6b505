"""Housekeeping on django-q2 (docs/housekeeping.md): retention, the schedules, failures in the
admin."""

from __future__ import annotations

import signal
import threading
from datetime import timedelta
from io import StringIO

import pytest
from django.contrib.auth.models import User
from django.core.management import call_command
from django.db import connection, transaction
from django.utils import timezone
from django_q.brokers import get_broker  # type: ignore[import-untyped]
from django_q.models import Failure, Schedule, Success  # type: ignore[import-untyped]
from django_q.scheduler import scheduler  # type: ignore[import-untyped]

from broker import publish
from broker.models import Message
from broker.replay import replay
from jobs import partitions
from jobs.housekeeping import purge_delivered
from jobs.models import DeliveryAttempt, Job
from jobs.states import DEAD, DELIVERED, QUEUED
from tests.helpers import make_channel, make_consumer, make_producer
from tests.processes import start_manage, wait_until

pytestmark = pytest.mark.django_db


@pytest.fixture
def channel():
    make_producer()
    channel = make_channel()
    make_consumer(channel)
    return channel


def message(channel, message_id: str, *, age_days: float, job_status=DELIVERED) -> Message:
    published = publish(channel, b"x", producer="shop", message_id=message_id)
    Job.objects.filter(message=published).update(status=job_status)
    received = timezone.now() - timedelta(days=age_days)
    Message.objects.filter(pk=published.pk).update(received_at=received)
    # Its jobs' time partition too, as if published then (jobs/partitions/; PostgreSQL).
    Job.objects.filter(message=published).update(partition_at=received)
    return published


def test_purge_deletes_only_old_fully_delivered_messages(channel, settings):
    settings.BROKER_RETENTION_DAYS = 30
    gone = message(channel, "old-delivered", age_days=31)
    DeliveryAttempt.objects.create(
        job=Job.objects.get(message=gone),
        attempt_number=1,
        started_at=timezone.now(),
        duration_ms=1,
        status_code=200,
        dispatcher_id="d",
    )
    message(channel, "old-dead", age_days=31, job_status=DEAD)
    message(channel, "old-queued", age_days=31, job_status="QUEUED")
    message(channel, "recent-delivered", age_days=29)
    Message.objects.filter(public_id="old-queued").update(status=Message.Status.SCHEDULED)

    assert purge_delivered() == 1

    remaining = set(Message.objects.values_list("public_id", flat=True))
    assert remaining == {"old-dead", "old-queued", "recent-delivered"}
    assert not DeliveryAttempt.objects.exists()
    assert Job.objects.count() == 3


@pytest.mark.django_db(transaction=True)
def test_a_replay_that_commits_while_the_purge_waits_keeps_its_message(channel, settings):
    settings.BROKER_RETENTION_DAYS = 30
    old = message(channel, "old-delivered", age_days=31)
    replay_holds_the_lock, commit_replay = threading.Event(), threading.Event()

    def replay_and_wait() -> None:
        with transaction.atomic():  # replay's own transaction is a savepoint of this one
            replay(old)
            replay_holds_the_lock.set()
            commit_replay.wait(10)
        connection.close()

    purged: list[int] = []

    def purge() -> None:
        purged.append(purge_delivered())
        connection.close()

    replaying = threading.Thread(target=replay_and_wait)
    purging = threading.Thread(target=purge)
    replaying.start()
    replay_holds_the_lock.wait(10)
    purging.start()
    if partitions.is_partitioned(partitions.JOBS):
        # Retention skips the job the replay holds (SKIP LOCKED), and so keeps its message.
        purging.join(60)
    else:  # picks the message (the replay's job is not committed yet), then waits
        wait_until(lambda: waiting_on_a_lock() == 1, seconds=60)
    commit_replay.set()
    replaying.join(10)
    purging.join(10)

    assert purged == [0]
    assert Job.objects.get(message=old).status == QUEUED


def waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity"
            " WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return int(cursor.fetchone()[0])


def test_messages_without_consumers_go_by_age_and_zero_keeps_everything(settings):
    make_producer()
    channel = make_channel()  # no consumer: messages are ACKNOWLEDGED, without jobs
    old = publish(channel, b"x", producer="shop", message_id="old")
    Message.objects.filter(pk=old.pk).update(received_at=timezone.now() - timedelta(days=40))

    settings.BROKER_RETENTION_DAYS = 0
    assert purge_delivered() == 0
    settings.BROKER_RETENTION_DAYS = 30
    assert purge_delivered() == 1
    assert not Message.objects.exists()


def test_install_schedules_is_idempotent():
    call_command("install_schedules", stdout=StringIO())
    first = dict(Schedule.objects.values_list("name", "pk"))
    Schedule.objects.filter(pk__in=first.values()).update(cron="0 0 1 1 *")  # changed by hand

    call_command("install_schedules", stdout=StringIO())

    assert dict(Schedule.objects.values_list("name", "pk")) == first
    assert set(first) == {
        "broker: maintain partitions",
        "broker: purge delivered messages",
        "broker: purge orphan payload files",
        "broker: refresh delivery stats",
        "broker: refresh job status summary",
        "broker: resume dead-letter actions",
    }
    assert "0 0 1 1 *" not in set(Schedule.objects.values_list("cron", flat=True))


@pytest.mark.django_db(transaction=True)
def test_qcluster_runs_due_schedules_and_failures_show_in_the_admin(client):
    due = timezone.now() - timedelta(seconds=1)
    for name, args in [("works", ""), ("fails", "'not a number'")]:
        Schedule.objects.create(
            name=name,
            func="jobs.housekeeping.purge_delivered",
            args=args,
            schedule_type=Schedule.ONCE,
            next_run=due,
        )
    # The cluster's guard runs django-q2's scheduler every 30 s (a fixed count in django-q2): the
    # test takes that step itself, and the cluster runs the tasks it queued as soon as it starts.
    scheduler(broker=get_broker())
    cluster = start_manage("qcluster")
    try:
        wait_until(lambda: Success.objects.exists() and Failure.objects.exists(), seconds=60)
    finally:
        cluster.send_signal(signal.SIGTERM)
        output, _ = cluster.communicate(timeout=60)
    assert cluster.returncode == 0, output

    client.force_login(User.objects.create_superuser("ops", "ops@example.com", "pw"))
    page = client.get("/admin/django_q/failure/").content.decode()
    assert "fails" in page
    assert "works" not in page
