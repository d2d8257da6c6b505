"""The exceptions every client raises: one per meaning of the broker's answer.

`BrokerError` carries the HTTP status (None when no answer came at all), the broker's own
message (its `{"Error": ...}`) and the parsed body, so a caller can both branch on the type and
show the broker's words.
"""

from __future__ import annotations

from typing import Any


class BrokerError(Exception):
    """The broker refused a request, failed, or could not be reached.

    `retry_after`: the answer's Retry-After in seconds, when it had one (a 429, or a 503 while
    the broker's database is down); the retry rule waits that long before the next try.
    `tries`: how many times the client sent the request before giving up with this answer
    (1: the first answer was final).
    """

    def __init__(
        self,
        status: int | None,
        message: str,
        body: Any = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.body = body
        self.retry_after = retry_after
        self.tries = 1

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        return f"HTTP {self.status}: {self.message}"


class BadRequest(BrokerError):
    """400, 413, 415 or 422: the request itself is wrong; sending it again will not help."""


class Unauthorized(BrokerError):
    """401 (no credential) or 403 (a wrong one, or not allowed)."""


class NotFound(BrokerError):
    """404: the channel, consumer, message or job does not exist."""


class Conflict(BrokerError):
    """409: a duplicate message ID, or a state that does not allow the change."""


class PreconditionFailed(BrokerError):
    """412: If-Unmodified-Since did not match, or a scheduled time too soon."""


class RateLimited(BrokerError):
    """429: over a rate limit; `retry_after` is the broker's Retry-After in seconds, if any."""


class ServerError(BrokerError):
    """5xx: the broker failed; the same request may succeed later."""


class BrokerUnavailable(BrokerError):
    """No answer: the connection was refused or broke, or the request timed out."""


def error_for_status(
    status: int, message: str, body: Any = None, retry_after: float | None = None
) -> BrokerError:
    """The exception that names what `status` means."""
    kind = _KIND_BY_STATUS.get(status)
    if kind is None:
        kind = ServerError if status >= 500 else BrokerError
    return kind(status, message, body, retry_after)


_KIND_BY_STATUS: dict[int, type[BrokerError]] = {
    400: BadRequest,
    401: Unauthorized,
    403: Unauthorized,
    404: NotFound,
    409: Conflict,
    412: PreconditionFailed,
    413: BadRequest,
    415: BadRequest,
    422: BadRequest,
    429: RateLimited,
}
