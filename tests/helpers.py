"""Tiny builders for test data; each test says what it needs inline."""

from __future__ import annotations

from django.contrib.auth.models import Group, User
from django.utils import timezone

from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.models import Job
from jobs.states import JobStatus


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


def make_operator(username: str = "ops", password: str = "pw") -> User:
    """A staff user in the group "broker admin": every right over the broker (docs/ui.md)."""
    user = User.objects.create_user(username, password=password, is_staff=True)
    user.groups.add(broker_admin_group())
    return user


def broker_admin_group() -> Group:
    """The group broker/admin_group.py keeps after every migrate (and after a transactional
    test's flush, which sends post_migrate too)."""
    return Group.objects.get(name=BROKER_ADMIN_GROUP)
