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

__all__ = [
    "BadRequest",
    "BrokerError",
    "BrokerUnavailable",
    "Conflict",
    "NotFound",
    "PreconditionFailed",
    "RateLimited",
    "RetryPolicy",
    "ServerError",
    "Unauthorized",
    "__version__",
]
