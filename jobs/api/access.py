"""Finding the consumer and job a pull or DLQ request is about, with its token checks."""

from __future__ import annotations

from rest_framework import status
from rest_framework.request import Request

from broker.api.errors import ApiError
from broker.api.tokens import require_token
from broker.models import Channel
from consumers.models import Consumer
from jobs.models import Job


def authorized_consumer(
    request: Request,
    channel_id: str,
    consumer_id: str,
    *,
    pull_only: bool,
    unknown_consumer_status: int = status.HTTP_401_UNAUTHORIZED,
) -> Consumer:
    """The consumer, after webhook-broker's checks in its order.

    404 unknown channel, 401/403 channel token, 401 unknown consumer (404 on webhook-broker's
    DELETE endpoints), 401/403 consumer token, and 412 for a push consumer where only pull
    consumers may call.
    """
    channel = Channel.objects.filter(pk=channel_id).first()
    if channel is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, f"No channel {channel_id!r}.")
    require_token(request, "X-Broker-Channel-Token", channel, "Channel")
    consumer = Consumer.objects.filter(channel=channel, public_id=consumer_id).first()
    if consumer is None:
        raise ApiError(unknown_consumer_status, "Consumer could not be found.")
    require_token(request, "X-Broker-Consumer-Token", consumer, "Consumer")
    if pull_only and not consumer.is_pull:
        raise ApiError(status.HTTP_412_PRECONDITION_FAILED, "Consumer is not pull based.")
    return consumer


def consumer_job(consumer: Consumer, job_id: str) -> Job:
    """One of the consumer's jobs; any other job, or a malformed ID, is 404."""
    job = (
        Job.objects.select_related("message", "consumer")
        .with_public_id(job_id)
        .filter(consumer=consumer)
        .first()
    )
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "Job could not be found.")
    return job
