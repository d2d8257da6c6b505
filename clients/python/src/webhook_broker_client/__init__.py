"""Python clients for the webhook broker (docs/clients.md, clients/python/README.md)."""

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
from webhook_broker_client.producer import AsyncProducer, Producer

__all__ = [
    "Admin",
    "AsyncProducer",
    "BadRequest",
    "BatchMessage",
    "BrokerError",
    "BrokerUnavailable",
    "Conflict",
    "NotFound",
    "PreconditionFailed",
    "Producer",
    "RateLimited",
    "RetryPolicy",
    "ServerError",
    "Unauthorized",
    "__version__",
]
