"""Finding the consumer and job a pull or DLQ request is about, with its token checks.

Both look-ups are written in SQL (any database's): every request of a pull worker (claim, report,
a job's acknowledgement) makes them, and compiling them through the ORM cost more than all the
rest of an acknowledgement (docs/performance-history.md, "Pull: batch acknowledgement (issue
18)"). They still give model instances: the fields left out (signing secrets, a message's body)
load if ever touched. A consumer token this process checked before is not decrypted again
(`CheckedTokens`).

A pull consumer's two commonest requests make neither: its single acknowledgement and its claim
check its credentials in the statement that does the work (`proven_credentials`,
jobs/queue/sql/pull.sql, proven_pull_consumer), and go the long way only when that statement did
nothing.
"""

from __future__ import annotations

import functools
import hmac
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from django.db import connection
from rest_framework import status
from rest_framework.request import Request

from broker.api.errors import ApiError
from broker.api.tokens import StoredToken, require_token
from broker.crypto import decrypt
from broker.models import Channel, Message
from broker.tokens import digests_equal, hash_token
from consumers.models import SIGNING_FIELDS, Consumer
from jobs.models import Job, named_by
from jobs.queue import PullCredentials

# A request's consumer: its columns but the signing fields (never needed here: not decrypted),
# its token as stored (its ciphertext: decrypted only when this process has not checked it
# before, CheckedTokens), then its channel's token hash.
_CONSUMER_FIELDS = [
    field for field in Consumer._meta.concrete_fields if field.name not in SIGNING_FIELDS
]
CONSUMER_SQL = (
    "SELECT "  # noqa: S608
    + ", ".join(f"consumer.{field.column}" for field in _CONSUMER_FIELDS)
    + ", channel.token_hash"
    f" FROM {Consumer._meta.db_table} consumer"
    f" JOIN {Channel._meta.db_table} channel ON channel.id = consumer.channel_id"
    " WHERE consumer.channel_id = %s AND consumer.public_id = %s"
)
_FIELD_NAMES = [field.attname for field in _CONSUMER_FIELDS]
_TOKEN_INDEX = _FIELD_NAMES.index("token")


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
    consumer = _read_consumer(channel_id, consumer_id)
    if consumer is None:  # only then the channel alone, to tell which of the two is missing
        channel = Channel.objects.filter(pk=channel_id).first()
        if channel is None:
            raise ApiError(status.HTTP_404_NOT_FOUND, f"No channel {channel_id!r}.")
        require_token(request, "X-Broker-Channel-Token", channel, "Channel")
        raise ApiError(unknown_consumer_status, "Consumer could not be found.")
    channel_token = StoredToken(getattr(consumer, "channel_token_hash", ""))
    require_token(request, "X-Broker-Channel-Token", channel_token, "Channel")
    given = request.headers.get("X-Broker-Consumer-Token")
    stored_token: str = getattr(consumer, "stored_token", "")
    known = consumer.is_pull and checked_tokens.proves(consumer, stored_token, given)
    # A token this process checked before is not decrypted again: the one given has its digest.
    consumer.token = given if known else decrypt(stored_token)
    require_token(request, "X-Broker-Consumer-Token", consumer, "Consumer")
    if pull_only and not consumer.is_pull:
        raise ApiError(status.HTTP_412_PRECONDITION_FAILED, "Consumer is not pull based.")
    if consumer.is_pull and not known:
        checked_tokens.learn(consumer, stored_token)
    return consumer


def _read_consumer(channel_id: str, consumer_id: str) -> Consumer | None:
    """The consumer, with its token's stored text (`stored_token`) and its channel's token hash
    (`channel_token_hash`), its token not yet set (the caller decrypts it, or not). A plain
    cursor and the fields' own conversions, not a raw queryset: every request of a pull worker
    makes this read, and the queryset's machinery cost more than the rest of it."""
    with connection.cursor() as cursor:
        cursor.execute(CONSUMER_SQL, [channel_id, consumer_id])
        row = cursor.fetchone()
    if row is None:
        return None
    *values, channel_token_hash = row
    stored_token = values[_TOKEN_INDEX]
    for index, convert in _conversions():
        values[index] = convert(values[index], None, connection)
    consumer = Consumer.from_db(connection.alias, _FIELD_NAMES, values)
    consumer.stored_token = stored_token  # type: ignore[attr-defined]
    consumer.channel_token_hash = channel_token_hash  # type: ignore[attr-defined]
    return consumer


@functools.cache
def _conversions() -> list[tuple[int, Callable[[Any, Any, Any], Any]]]:
    """The conversions of the read's columns the ORM makes (JSON text to its value), by column;
    none of the token, read as stored."""
    return [
        (index, convert)
        for index, field in enumerate(_CONSUMER_FIELDS)
        if field.name != "token"
        for convert in field.get_db_converters(connection)  # type: ignore[attr-defined]
    ]


class CheckedTokens:
    """The pull consumers' tokens this process has decrypted and checked a request's against: by
    channel and consumer ID, the token's stored text (ciphertext) and the digest of its plain
    text, with its ordering then (which claim statement to run; the statement checks it still
    is). A request whose token has that digest may then be checked by a statement alone
    (`PullCredentials`): if the stored text is still the same, so is the token, however it was
    changed meanwhile (a new token is a new ciphertext: Fernet's is random). Digests only, never
    the tokens; bounded: forgotten all at once when full (each consumer is then learned again on
    its next request, which checks its tokens as every other does)."""

    LIMIT = 10_000

    def __init__(self) -> None:
        self._by_consumer: dict[tuple[str, str], tuple[str, str, bool]] = {}

    def learn(self, consumer: Consumer, stored_token: str) -> None:
        if len(self._by_consumer) >= self.LIMIT:
            self._by_consumer.clear()
        key = (consumer.channel_id, consumer.public_id)
        self._by_consumer[key] = (stored_token, hash_token(consumer.token), is_ordered(consumer))

    def known(self, channel_id: str, consumer_id: str) -> tuple[str, str, bool] | None:
        return self._by_consumer.get((channel_id, consumer_id))

    def proves(self, consumer: Consumer, stored_token: str, given: str | None) -> bool:
        """Whether `given` is the consumer's token, as stored now, by what was learned of it."""
        known = self.known(consumer.channel_id, consumer.public_id)
        if not given or known is None:
            return False
        # Ciphertexts compared in constant time too, as every credential is.
        if not hmac.compare_digest(known[0].encode(), stored_token.encode()):
            return False
        return digests_equal(hash_token(given), known[1])

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
    stored_token, token_digest, ordered = known
    if not digests_equal(hash_token(consumer_token), token_digest):
        return None
    return PullCredentials(
        channel_id, consumer_id, hash_token(channel_token), stored_token, ordered
    )


def credentials_of(consumer: Consumer) -> PullCredentials:
    """The credentials of a consumer `authorized_consumer` gave: those the request proved."""
    return PullCredentials(
        consumer.channel_id,
        consumer.public_id,
        getattr(consumer, "channel_token_hash", ""),
        getattr(consumer, "stored_token", ""),
        is_ordered(consumer),
    )


def is_ordered(consumer: Consumer) -> bool:
    return consumer.ordering == Consumer.Ordering.ORDERED


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
