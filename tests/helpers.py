"""Tiny builders for test data (each test says what it needs inline), and work run in threads at
once."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from typing import Any

import psycopg
from django.contrib.auth.models import Group, User
from django.db import connection
from django.utils import timezone

from broker import publish
from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.models import Job
from jobs.queue import take_for_pull
from jobs.states import DEAD, DELIVERED, QUEUED, JobStatus

# What a producer and a pull consumer send with the tokens the builders below give by default.
BROADCAST_HEADERS = {
    "X-Broker-Channel-Token": "channel-token",
    "X-Broker-Producer-ID": "shop",
    "X-Broker-Producer-Token": "producer-token",
}
PULL_HEADERS = {
    "X-Broker-Channel-Token": "channel-token",
    "X-Broker-Consumer-Token": "consumer-token",
}


def make_channel(channel_id: str = "orders", token: str = "channel-token") -> Channel:
    channel = Channel(id=channel_id, name=channel_id.title())
    channel.set_token(token)
    channel.save()
    return channel


def make_producer(producer_id: str = "shop", token: str = "producer-token") -> Producer:
    producer = Producer(id=producer_id, name=producer_id.title())
    producer.set_token(token)
    producer.save()
    return producer


def make_consumer(
    channel: Channel, consumer_id: str = "billing", type: str = Consumer.Type.PUSH
) -> Consumer:
    return Consumer.objects.create(
        channel=channel,
        public_id=consumer_id,
        name=consumer_id.title(),
        callback_url=f"http://127.0.0.1:9/{consumer_id}",
        type=type,
    )


def make_job(status: JobStatus = JobStatus.QUEUED, *, attempts: int = 0) -> Job:
    """A job in the given status, with the channel, producer, message and consumer it needs."""
    channel = Channel.objects.filter(pk="orders").first() or make_channel()
    producer = Producer.objects.filter(pk="shop").first() or make_producer()
    consumer = Consumer.objects.filter(channel=channel).first() or make_consumer(channel)
    message = Message.objects.create(
        channel=channel,
        producer=producer,
        public_id=f"m-{Message.objects.count() + 1}",
        payload=b"{}",
        content_type="application/json",
        status=Message.Status.DISPATCHED,
        received_at=timezone.now(),
    )
    return Job.objects.create(message=message, consumer=consumer, status=status, attempts=attempts)


def pull_job(
    consumer: Consumer, status: JobStatus = QUEUED, *, error: str = "gave up", **publish_args: Any
) -> Job:
    """A job of `consumer`, published to its channel by "shop" and brought to `status` through the
    state machine as a pull consumer's job goes (`error`: a DEAD job's last error)."""
    message = publish(consumer.channel_id, {"order": 1}, producer="shop", **publish_args)
    job = Job.objects.get(message=message, consumer=consumer)
    if status != QUEUED:
        take_for_pull(job)
    if status == DELIVERED:
        job.mark_delivered()
    if status == DEAD:
        job.mark_dead(error)
    return job


def make_consumer_with_token(
    channel: Channel,
    consumer_id: str = "worker",
    *,
    token: str = "consumer-token",
    type: str = Consumer.Type.PULL,
) -> Consumer:
    """A consumer (pull by default) whose token is known, for the token-guarded endpoints."""
    consumer = make_consumer(channel, consumer_id, type=type)
    consumer.set_token(token)
    consumer.save()
    return consumer


BROKER_ADMIN_GROUP = "broker admin"


def tokens(
    consumer: str | None = "consumer-token", channel: str | None = "channel-token"
) -> dict[str, str]:
    """The pull API's token headers: the tokens make_channel and make_consumer_with_token set;
    None leaves one out."""
    given = {"X-Broker-Channel-Token": channel, "X-Broker-Consumer-Token": consumer}
    return {name: value for name, value in given.items() if value is not None}


def make_operator(username: str = "ops", password: str = "pw") -> User:
    """A staff user in the group "broker admin": every right over the broker (docs/ui.md)."""
    user = User.objects.create_user(username, password=password, is_staff=True)
    user.groups.add(broker_admin_group())
    return user


def broker_admin_group() -> Group:
    """The group broker/admin_group.py keeps after every migrate (and after a transactional
    test's flush, which sends post_migrate too)."""
    return Group.objects.get(name=BROKER_ADMIN_GROUP)


def at_once(*work: Callable[[], object], timeout: float = 60) -> None:
    """Run each of `work` in a thread of its own (each with its own database connection, closed
    at its end), all released together by a barrier; wait for them (`timeout` seconds each at
    the most) and raise in the test's thread what one of them raised."""
    barrier = threading.Barrier(len(work))
    errors: list[BaseException] = []

    def run(one: Callable[[], object]) -> None:
        try:
            barrier.wait()
            one()
        except BaseException as error:  # re-raised below
            errors.append(error)
        finally:
            connection.close()

    threads = [threading.Thread(target=run, args=(one,)) for one in work]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
    assert not any(thread.is_alive() for thread in threads), f"still running after {timeout} s"
    if errors:
        raise errors[0]


def scans_a_table(plan: str) -> bool:
    """Whether an EXPLAIN plan reads a table with rows sequentially. The planner may scan the
    empty time partitions (jobs/partitions/) of a partitioned table: their cost is at most one
    page's and the one row the planner always assumes (1.01: a partition emptied by earlier
    tests keeps a page), where a table of rows costs far more."""
    costs = re.findall(r"Seq Scan .*\(cost=[\d.]+\.\.([\d.]+) ", plan)
    return any(float(cost) >= 2.0 for cost in costs)


def another_session(dbname: str | None = None, **options: Any) -> psycopg.Connection[Any]:
    """A connection of its own to the tests' database server (its database unless `dbname`
    says another), beside Django's: a second session, to hold locks or to look from outside."""
    settings = connection.settings_dict
    return psycopg.connect(
        host=settings["HOST"],
        port=settings["PORT"],
        user=settings["USER"],
        password=settings["PASSWORD"] or None,
        dbname=dbname or settings["NAME"],
        **options,
    )
