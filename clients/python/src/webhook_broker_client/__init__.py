"""Python clients for the webhook broker (docs/clients.md, clients/python/README.md)."""

from webhook_broker_client._http import RetryPolicy, __version__
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
from webhook_broker_client.worker import Worker

__all__ = [
    "BadRequest",
    "BrokerError",
    "BrokerUnavailable",
    "Conflict",
    "Defer",
    "Job",
    "NotFound",
    "PreconditionFailed",
    "RateLimited",
    "Reject",
    "Retry",
    "RetryPolicy",
    "ServerError",
    "Unauthorized",
    "Worker",
    "__version__",
]
