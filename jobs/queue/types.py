"""What the queue's operations take and give, as plain values."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NamedTuple

from broker.tokens import digests_equal
from jobs.states import JobStatus


@dataclass(frozen=True)
class OutgoingMessage:
    """What a delivery sends of a message: its ID, body and the metadata that goes with it."""

    message_id: str
    payload: bytes
    payload_file: str  # an offloaded payload's name in storage; "" when `payload` holds it
    content_type: str
    priority: int
    headers: dict[str, str]
    traceparent: str | None = None  # the message's trace context (broker/tracing.py)
    tracestate: str | None = None
    event_type: str | None = None  # sent as X-Broker-Event-Type when set


@dataclass(frozen=True)
class ClaimRooms:
    """How many jobs one dispatcher lets a push claim hand each consumer, beside the consumer's
    own maxInFlight (jobs/fair_share.py decides; docs/dispatcher.md, "Fair share").

    `rooms`: consumer ID -> the most jobs it may be handed now. A consumer not in it may be
    handed up to `new_room`. Consumers in `new` (those of `rooms` that have not answered this
    dispatcher yet) and those not in `rooms` are new: all of them together may be handed up to
    `new_budget`, so that consumers nobody knows yet cannot fill the dispatcher before their
    first answers say whether they are slow.
    """

    rooms: dict[int, int]
    new: frozenset[int]
    new_room: int
    new_budget: int

    @classmethod
    def unbounded(cls, limit: int) -> ClaimRooms:
        """No dispatcher's word: every consumer up to its maxInFlight (one-off claims)."""
        return cls({}, frozenset(), limit, limit)


# A job's whole primary key on PostgreSQL: its id and its time partition's key (Job.partition_at,
# jobs/partitions/), as a claim returns them.
JobKey = tuple[int, datetime]


@dataclass(frozen=True)
class ClaimedJob:
    """What a push claim returns for one job: everything its request needs but the consumer."""

    job_id: int
    # Its time partition's key (jobs/partitions/): with job_id the whole primary key, by which
    # the outcome of its attempt is recorded (or the job given back unsent).
    partition_at: datetime
    attempt: int  # the job's attempts, this one included
    priority: int
    due_at: datetime
    consumer_id: int
    consumer_changed_at: datetime
    created_at: datetime  # the job's, for its public ID
    message: OutgoingMessage
    # A rate-limited consumer's job goes no earlier than its booked slot; None: at once.
    send_at: datetime | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ClaimedJob:
        """From a row of CLAIM_COLUMNS; raw SQL gives memoryview payloads and JSON text (Django
        reads jsonb as text and leaves parsing to JSONField)."""
        job_id, partition_at, attempt, priority, due_at, consumer_id = row[:6]
        consumer_changed_at, created_at = row[6:8]
        message_id, payload, payload_file, content_type, message_priority, headers = row[8:14]
        traceparent, tracestate, event_type = row[14:17]
        message = OutgoingMessage(
            message_id,
            bytes(payload),
            payload_file,
            content_type,
            message_priority,
            json.loads(headers) if isinstance(headers, str) else headers,
            traceparent,
            tracestate,
            event_type,
        )
        send_at = row[17] if len(row) > 17 else None  # the PostgreSQL claim's extra column
        return cls(
            job_id,
            partition_at,
            attempt,
            priority,
            due_at,
            consumer_id,
            consumer_changed_at,
            created_at,
            message,
            send_at,
        )


# The claimed row's columns, as Job field paths (the ORM's `values_list`); the PostgreSQL claim
# returns the same columns in the same order, then the send time (which the ORM's claim sets).
CLAIM_COLUMNS = (
    "pk",
    "partition_at",
    "attempts",
    "priority",
    "next_attempt_at",
    "consumer_id",
    "consumer__changed_at",
    "created_at",
    "message__public_id",
    "message__payload",
    "message__payload_file",
    "message__content_type",
    "message__priority",
    "message__headers",
    "message__traceparent",
    "message__tracestate",
    "message__event_type",
)


@dataclass(frozen=True)
class TokenDigests:
    """The SHA-256 digests (broker/tokens.py) of the channel and producer tokens a broadcast was
    given, None for a token not given: the insert then happens only if both match the stored
    ones, checked in the same statement (docs/performance-history.md, "Ingest: broadcast
    throughput")."""

    channel: str | None
    producer: str | None

    def match(self, channel_hash: str, producer_hash: str) -> bool:
        """Whether both are the stored digests, compared in constant time."""
        return digests_equal(self.channel, channel_hash) and digests_equal(
            self.producer, producer_hash
        )


@dataclass(frozen=True)
class Inserted:
    """What inserting a message with its jobs found: a missing channel or producer, tokens that
    did not match, or a producer not allowed on the channel (BROKER_PRODUCER_CHANNELS=bound)
    mean that nothing was inserted."""

    channel_found: bool
    producer_found: bool
    tokens_matched: bool = True
    producer_allowed: bool = True

    @classmethod
    def from_checks(
        cls, channel_found: bool, producer_found: bool, matched: bool | None, allowed: bool | None
    ) -> Inserted:
        """From the PostgreSQL publish statement's checks: `matched` and `allowed` are null when
        the channel or the producer is missing, and are then not what refused the message."""
        found = channel_found and producer_found
        return cls(
            channel_found,
            producer_found,
            tokens_matched=not found or matched is True,
            producer_allowed=not found or allowed is True,
        )


@dataclass(frozen=True)
class OutcomeReport:
    """A pull consumer's report on one job it holds: DELIVERED, DEAD, or QUEUED (given back, due
    again after `delay_seconds`), with the consumer's own words on a failure."""

    job_id: str  # the job's public ID, as the consumer was given it
    next_state: JobStatus
    delay_seconds: int = 0
    error: str = ""
    # QUEUED only: due after the consumer's retry schedule instead of `delay_seconds`.
    backoff: bool = False
    # QUEUED only, False: the worker never started the job; the claim's attempt is given back.
    attempted: bool = True
    # The job's attempts as the worker's claim gave them: the report is for that claim only.
    attempts: int | None = None


@dataclass(frozen=True)
class ReportResult:
    """What became of one report: the job's state now (None: the consumer has no such job), and
    why it is not where the report asked (empty when it is)."""

    job_id: str
    state: JobStatus | None
    refused: str = ""
    claimed_again: bool = False  # refused: the job was claimed again since the worker's claim


@dataclass(frozen=True)
class PullCredentials:
    """A pull consumer as a request names it and what proves the request may act for it, for a
    statement that checks both itself (as the publish statement checks a broadcast's tokens):
    the channel token's SHA-256 digest, and the consumer token's stored text (its ciphertext,
    broker/crypto.py), whose plain text the caller found to be the token given. The statement
    acts only if the consumer is still a pull consumer of that channel and both still match."""

    channel_id: str
    consumer_id: str  # the consumer's public ID
    channel_token: str  # the digest of the channel token given
    stored_token: str  # the consumer token's ciphertext, as stored
    # The consumer's ordering when its token was checked: which claim statement to run (that
    # statement claims nothing once it changed).
    ordered: bool = False


@dataclass(frozen=True)
class NamedJob:
    """The job a pull consumer names by its public ID: the row's key, the consumer, and the
    creation second the ID also holds (from its start to the next)."""

    key: int
    consumer: PullCredentials
    created_from: datetime
    created_until: datetime


# What acknowledging one pull job returns of it for its log line (jobs/outcome_log.py,
# PullReport), as it was before the move; the PostgreSQL statement returns the same columns.
HeldRow = tuple[Any, ...]
HELD_COLUMNS = (
    "attempts",
    "status_changed_at",
    "message__public_id",
    "message__channel_id",
    "message__traceparent",
    "message__tracestate",
)


@dataclass(frozen=True)
class PullMove:
    """One job a pull consumer's report moves out of INFLIGHT: where to, with what last error,
    due when (QUEUED only)."""

    key: int
    target: JobStatus
    reason: str = ""
    due_at: datetime | None = None
    refund: bool = False  # the attempt the claim counted is taken back (never started)


class NewMessage(NamedTuple):
    """One message of a batch to insert (`insert_messages`), checked already: its payload as
    bytes, or "" and the name of its offloaded file; SCHEDULED (no jobs yet) when
    `scheduled_for` is set. A tuple: a batch makes a thousand at once, and a frozen dataclass
    costs several times more to build."""

    public_id: str
    payload: bytes
    payload_file: str
    payload_size: int
    content_type: str
    priority: int
    headers: dict[str, str]
    ordering_key: str
    scheduled_for: datetime | None = None
    traceparent: str | None = None
    tracestate: str | None = None
    event_type: str | None = None


@dataclass(frozen=True)
class MessageBatch:
    """Messages one producer publishes to one channel at once, received at one time."""

    channel_id: str
    producer_id: str
    received_at: datetime
    messages: list[NewMessage]


@dataclass(frozen=True)
class InsertedBatch:
    """What inserting a batch did: nothing when the channel or the producer does not exist, or
    the producer may not publish to the channel (BROKER_PRODUCER_CHANNELS=bound); else the
    messages' keys (primary keys), in the batch's order."""

    channel_found: bool
    producer_found: bool
    keys: list[int]
    producer_allowed: bool = True
