"""Finding the consumer and job a pull or DLQ request is about, with its token checks.

Both look-ups are written in SQL (any database's): every request of a pull worker (claim, report,
a job's acknowledgement) makes them, and compiling them through the ORM cost more than all the
rest of an acknowledgement (docs/performance-history.md, "Pull: batch acknowledgement (issue
18)"). They still give model instances: the fields left out (signing secrets, a message's body)
load if ever touched.
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from rest_framework import status
from rest_framework.request import Request

from broker.api.errors import ApiError
from broker.api.tokens import StoredToken, require_token
from broker.models import Channel, Message
from consumers.models import SIGNING_FIELDS, Consumer
from jobs.models import Job, named_by

_CONSUMER_COLUMNS = ", ".join(
    f"consumer.{field.column}"
    for field in Consumer._meta.concrete_fields
    if field.name not in SIGNING_FIELDS  # never needed here: not decrypted
)
CONSUMER_SQL = (
    f"SELECT {_CONSUMER_COLUMNS}, channel.token_hash AS channel_token_hash"  # noqa: S608
    f" FROM {Consumer._meta.db_table} consumer"
    f" JOIN {Channel._meta.db_table} channel ON channel.id = consumer.channel_id"
    " WHERE consumer.channel_id = %s AND consumer.public_id = %s"
)
# A job's message as far as a job's read, its acknowledgement and its log line need it (its key
# is the job's message_id), in the model's order of fields, as `Model.from_db` takes them.
MESSAGE_FIELDS = tuple(
    field.attname
    for field in Message._meta.concrete_fields
    if field.attname in {"public_id", "channel_id", "producer_id", "traceparent", "tracestate"}
)
JOB_SQL = (
    "SELECT job.*, "  # noqa: S608
    + ", ".join(f"message.{name} AS message_{name}" for name in MESSAGE_FIELDS)
    + f" FROM {Job._meta.db_table} job"
    f" JOIN {Message._meta.db_table} message ON message.id = job.message_id"
    " WHERE job.id = %s AND job.consumer_id = %s AND job.created_at >= %s"
    " AND job.created_at < %s"
)


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
    consumer = next(iter(Consumer.objects.raw(CONSUMER_SQL, [channel_id, consumer_id])), None)
    if consumer is None:  # only then the channel alone, to tell which of the two is missing
        channel = Channel.objects.filter(pk=channel_id).first()
        if channel is None:
            raise ApiError(status.HTTP_404_NOT_FOUND, f"No channel {channel_id!r}.")
        require_token(request, "X-Broker-Channel-Token", channel, "Channel")
        raise ApiError(unknown_consumer_status, "Consumer could not be found.")
    channel_token = StoredToken(getattr(consumer, "channel_token_hash", ""))
    require_token(request, "X-Broker-Channel-Token", channel_token, "Channel")
    require_token(request, "X-Broker-Consumer-Token", consumer, "Consumer")
    if pull_only and not consumer.is_pull:
        raise ApiError(status.HTTP_412_PRECONDITION_FAILED, "Consumer is not pull based.")
    return consumer


def consumer_job(consumer: Consumer, job_id: str) -> Job:
    """One of the consumer's jobs, with its message but not the message's body; any other job,
    or a malformed ID, is 404."""
    named = named_by(job_id)
    job = None
    if named is not None:
        key, created = named
        window = [created, created + timedelta(seconds=1)]
        params = [key, consumer.pk, *map(connection.ops.adapt_datetimefield_value, window)]
        job = next(iter(Job.objects.raw(JOB_SQL, params)), None)
    if job is None:
        raise ApiError(status.HTTP_404_NOT_FOUND, "Job could not be found.")
    values = [job.message_id, *(getattr(job, f"message_{name}") for name in MESSAGE_FIELDS)]
    job.message = Message.from_db(job._state.db, ["id", *MESSAGE_FIELDS], values)
    job.consumer = consumer  # the one the request named: not read again
    return job
