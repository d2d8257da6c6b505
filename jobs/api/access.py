"""Finding the consumer and job a pull or DLQ request is about, with its token checks.

Both look-ups are written in SQL (any database's): every request of a pull worker (claim, report,
a job's acknowledgement) makes them, and compiling them through the ORM cost more than all the
rest of an acknowledgement (docs/performance-history.md, "Pull: batch acknowledgement (issue
18)"). They still give model instances: the fields left out (signing secrets, a message's body)
load if ever touched.

A pull consumer's single acknowledgement, its hot path, makes neither: one statement checks its
credentials and moves its job (`proven_credentials`, jobs/queue/sql/pull.sql).
"""

from __future__ import annotations

from datetime import timedelta

from django.db import connection
from rest_framework import status
from rest_framework.request import Request

from broker.api.errors import ApiError
from broker.api.tokens import StoredToken, require_token
from broker.models import Channel, Message
from broker.tokens import digests_equal, hash_token
from consumers.models import SIGNING_FIELDS, Consumer
from jobs.models import Job, named_by
from jobs.queue import PullCredentials

_CONSUMER_COLUMNS = ", ".join(
    f"consumer.{field.column}"
    for field in Consumer._meta.concrete_fields
    if field.name not in SIGNING_FIELDS  # never needed here: not decrypted
)
# With the consumer token's stored text as well (`stored_token`: its ciphertext, not decrypted).
CONSUMER_SQL = (
    f"SELECT {_CONSUMER_COLUMNS}, channel.token_hash AS channel_token_hash,"  # noqa: S608
    " consumer.token AS stored_token"
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
    if consumer.is_pull:
        checked_tokens.learn(consumer, getattr(consumer, "stored_token", ""))
    return consumer


class CheckedTokens:
    """The pull consumers' tokens this process has decrypted and checked a request's against: by
    channel and consumer ID, the token's stored text (ciphertext) and the digest of its plain
    text. A request whose token has that digest may then be checked by a statement alone
    (`PullCredentials`): if the stored text is still the same, so is the token, however it was
    changed meanwhile (a new token is a new ciphertext: Fernet's is random). Digests only, never
    the tokens; bounded: forgotten all at once when full (each consumer is then learned again on
    its next request, which checks its tokens as every other does)."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self._by_consumer: dict[tuple[str, str], tuple[str, str]] = {}

    def learn(self, consumer: Consumer, stored_token: str) -> None:
        if len(self._by_consumer) >= self.LIMIT:
            self._by_consumer.clear()
        key = (consumer.channel_id, consumer.public_id)
        self._by_consumer[key] = (stored_token, hash_token(consumer.token))

    def known(self, channel_id: str, consumer_id: str) -> tuple[str, str] | None:
        return self._by_consumer.get((channel_id, consumer_id))

    def forget(self) -> None:
        self._by_consumer.clear()


checked_tokens = CheckedTokens()


def proven_credentials(
    request: Request, channel_id: str, consumer_id: str
) -> PullCredentials | None:
    """The credentials a statement can check for this request alone, without reading or
    decrypting the consumer first: given when both tokens are, and the consumer token is one this
    process checked for that consumer (compared in constant time). None otherwise: the request is
    then checked as every other is (`authorized_consumer`), which answers why it is refused."""
    channel_token = request.headers.get("X-Broker-Channel-Token")
    consumer_token = request.headers.get("X-Broker-Consumer-Token")
    known = checked_tokens.known(channel_id, consumer_id)
    if not channel_token or not consumer_token or known is None:
        return None
    stored_token, token_digest = known
    if not digests_equal(hash_token(consumer_token), token_digest):
        return None
    return PullCredentials(channel_id, consumer_id, hash_token(channel_token), stored_token)


def credentials_of(consumer: Consumer) -> PullCredentials:
    """The credentials of a consumer `authorized_consumer` gave: those the request proved."""
    return PullCredentials(
        consumer.channel_id,
        consumer.public_id,
        getattr(consumer, "channel_token_hash", ""),
        getattr(consumer, "stored_token", ""),
    )


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
