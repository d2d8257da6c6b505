"""Python clients for the webhook broker; clients/python/README.md shows how to use them."""

from webhook_broker_client._http import RetryPolicy, __version__
from webhook_broker_client._messages import BatchMessage
from webhook_broker_client.admin import Admin
from webhook_broker_client.errors import (
    BadRequest,
    BrokerError,
    BrokerUnavailable,
    Conflict,
    NotFound,
    PreconditionFailed,
    RateLimited,
    ServerError,
    Unauthorized,
)
from webhook_broker_client.outcomes import Defer, Job, Reject, Retry
from webhook_broker_client.producer import AsyncProducer, Producer
from webhook_broker_client.pull_consumer import Claimed, PullConsumer
from webhook_broker_client.signatures import (
    InvalidSignature,
    TimestampOutOfTolerance,
    WebhookVerificationError,
    verify,
)
from webhook_broker_client.worker import Worker

__all__ = [
    "Admin",
    "AsyncProducer",
    "BadRequest",
    "BatchMessage",
    "BrokerError",
    "BrokerUnavailable",
    "Claimed",
    "Conflict",
    "Defer",
    "InvalidSignature",
    "Job",
    "NotFound",
    "PreconditionFailed",
    "Producer",
    "PullConsumer",
    "RateLimited",
    "Reject",
    "Retry",
    "RetryPolicy",
    "ServerError",
    "TimestampOutOfTolerance",
    "Unauthorized",
    "WebhookVerificationError",
    "Worker",
    "__version__",
    "verify",
]
