"""The shapes of the broker's JSON answers, as TypedDicts with the broker's own field names.

Admin returns the parsed JSON as the broker sent it, typed by these: no renaming, no copying,
nothing lost when the broker adds a field (docs/api.md is the reference for every field). Times
are RFC 3339 strings, as on the wire. Fields that are not always present are `NotRequired`.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict


class Channel(TypedDict):
    ID: str
    Name: str
    Token: NotRequired[str]  # only in the answer of the PUT that set it
    ChangedAt: str
    ConsumersURL: str
    MessagesURL: str
    BroadcastURL: str
    MessagesStatusURL: str


class Producer(TypedDict):
    ID: str
    Name: str
    Token: NotRequired[str]
    ChangedAt: str
    Channels: list[str]


class Consumer(TypedDict):
    ID: str
    Name: str
    Token: NotRequired[str]
    ChangedAt: str
    CallbackURL: str
    DeadLetterQueueURL: str
    Type: str  # "push" or "pull"
    Paused: bool
    Ordering: str  # "none" or "ordered"
    RetryDelays: list[int]
    NonRetryableStatuses: list[int]
    MaxInFlight: int | None
    MaxPerSecond: float | None
    ThrottledUntil: str | None
    MaxJobAge: int | None
    EventTypes: list[str]
    CircuitState: str  # "closed", "open" or "half-open"
    CircuitOpenUntil: str | None
    ConsecutiveFailures: int


class SigningSecret(TypedDict):
    SigningSecret: str
    PreviousSigningSecretExpiresAt: NotRequired[str | None]


class JobSummary(TypedDict):
    """A message's job for one consumer, as `Message.Jobs` lists it."""

    ID: str
    ListenerEndpoint: str
    ListenerName: str
    Status: str
    StatusChangedAt: str
    Attempts: int
    LastError: str


class LastAttempt(TypedDict):
    """A job's latest delivery attempt, as its message lists it."""

    Number: int
    StartedAt: str
    DurationMs: float
    StatusCode: int | None  # None: no answer (ErrorClass says why)
    ErrorClass: str


class MessageJob(JobSummary):
    LastAttempt: LastAttempt | None  # None before the first attempt, and for pull consumers


class DeadJob(JobSummary):
    Priority: int
    LeaseExpiresAt: str | None
    MessageURL: str
    ChannelURL: str
    ConsumerURL: str
    ProducerURL: str
    JobRequeueURL: str


class Message(TypedDict):
    ID: str
    Payload: str | None
    PayloadEncoding: str | None  # "utf-8", or "base64" for bytes that are not UTF-8
    PayloadError: NotRequired[str]
    ContentType: str
    Priority: int
    ProducedBy: str
    ProducerID: str
    ReceivedAt: str
    DispatchedAt: str | None
    ScheduledFor: str | None
    EventType: str | None
    Status: str
    Headers: dict[str, str]
    Jobs: list[MessageJob]


class ScheduledMessage(TypedDict):
    """webhook-broker's lower-case fields, plus ours."""

    id: str
    messageId: str
    contentType: str
    priority: int
    producedBy: str
    dispatchSchedule: str
    dispatchedAt: str | None
    status: str
    payload: str | None
    payloadEncoding: str | None
    headers: dict[str, str]
    orderingKey: str
    eventType: str | None
    receivedAt: str
    messageURL: str


class PeriodicMessage(TypedDict):
    ID: str
    ProducerID: str
    Payload: str | None
    PayloadEncoding: str | None
    ContentType: str
    Priority: int
    Headers: dict[str, str]
    OrderingKey: str
    EventType: str | None
    IntervalSeconds: int | None
    Cron: str | None
    TimeZone: str
    Enabled: bool
    SkipWhilePending: bool
    NextRunAt: str | None
    LastRunAt: str | None
    LastMessageID: str | None
    SkippedTicks: int
    ChangedAt: str


class EventType(TypedDict):
    Name: str
    Description: str
    Schema: dict[str, Any] | None
    ChangedAt: str


class Skipped(TypedDict):
    ConsumerID: str
    Status: str
    Reason: str


class Replay(TypedDict):
    Replayed: list[str]
    Created: list[str]
    Skipped: list[Skipped]


class DlqAction(TypedDict):
    """A requeue or purge of a DLQ that goes on in the background."""

    id: str
    action: str  # "requeue" or "purge"
    state: str  # "running", "done" or "failed"
    channelId: str
    consumerId: str
    since: str | None
    diedBefore: str
    doneCount: int
    estimatedCount: int | None
    batches: int
    error: str
    createdAt: str
    updatedAt: str
    finishedAt: str | None


class DlqResult(TypedDict):
    """What a requeue or purge of a DLQ did: `count` jobs, and its `action` when it goes on."""

    count: int
    action: DlqAction | None


class DeadCount(TypedDict):
    channelId: str
    channelName: str
    consumerId: str
    consumerName: str
    deadCount: int


class DlqStatus(TypedDict):
    consumers: list[DeadCount]
    refreshedAt: NotRequired[str]


class JobCount(TypedDict):
    status: int  # 1001 QUEUED, 1002 INFLIGHT, 1003 DELIVERED, 1004 DEAD
    statusName: str
    count: int
    oldestItemTimestamp: str
    newestItemTimestamp: str
    refreshedAt: NotRequired[str]


# /job-status: channel ID -> consumer ID -> a count per status.
JobStatus = dict[str, dict[str, list[JobCount]]]


class StatusCount(TypedDict):
    Count: int
    Links: dict[str, str]


class MessagesStatus(TypedDict):
    counts: dict[str, StatusCount]
    next_scheduled_message_at: NotRequired[str]


class BrokerStatus(TypedDict):
    """`GET /_status`."""

    status: str
    version: str
    database: dict[str, Any]
    defaultPartitions: NotRequired[dict[str, Any]]
    warnings: list[str]
