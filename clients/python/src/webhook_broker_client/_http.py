"""The one HTTP layer every client uses: URLs, requests, errors and the retry rule.

Producer, Admin, the worker and the command line all send through `HttpClient` (sync) or
`AsyncHttpClient` (async), so a refusal always becomes the same exception (errors.py) and a
transient failure is always retried by the same bounded rule (`RetryPolicy`).
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Self
from urllib.parse import urljoin

import httpx

from webhook_broker_client.errors import BrokerError, BrokerUnavailable, error_for_status

__version__ = "0.1.0"
USER_AGENT = f"webhook-broker-client/{__version__}"
DEFAULT_TIMEOUT = 30.0

# Methods whose repetition cannot do anything twice: retried by default. A POST is retried only
# when its caller says it is safe (a publish with its message ID, a claim, a report).
_IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE"})


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before sending a failed request again.

    Retried: no answer (connection refused or broken, timeout), any 5xx, and 429. When the
    answer carries Retry-After (a 429, a 503 while the broker's database is down, any other
    retried status), the wait is that, as given, unless it is longer than `max_retry_after`:
    then the error is raised at once rather than blocking the caller that long. Otherwise the
    wait doubles from `initial_delay` up to `max_delay`, each drawn between half and all of that
    (the jitter keeps many clients that failed together from coming back together). `attempts`
    counts every try, the first one included; `RetryPolicy(attempts=1)` never retries. The
    TypeScript client's rule is the same (clients/typescript/src/http.ts).
    """

    attempts: int = 5
    initial_delay: float = 0.2
    max_delay: float = 5.0
    max_retry_after: float = 60.0

    def delay_before_retry(self, failed_attempts: int, error: BrokerError) -> float | None:
        """Seconds to wait before the next try after `failed_attempts` tries, or None: give up."""
        if failed_attempts >= self.attempts or not is_transient(error):
            return None
        if error.retry_after is not None:
            return error.retry_after if error.retry_after <= self.max_retry_after else None
        ceiling = min(self.max_delay, self.initial_delay * 2 ** (failed_attempts - 1))
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not a secret


NO_RETRY = RetryPolicy(attempts=1)


def is_transient(error: BrokerError) -> bool:
    """Whether the same request may succeed later: no answer, a 5xx, or a 429."""
    return error.status is None or error.status >= 500 or error.status == 429


def error_from_response(response: httpx.Response) -> BrokerError:
    """The exception for a non-2xx answer, with the broker's message and the parsed body."""
    body: Any
    try:
        body = response.json()
    except ValueError:
        body = response.text
    message = _message_of(body) or response.reason_phrase or "no message"
    return error_for_status(response.status_code, message, body, retry_after_of(response))


def _message_of(body: Any) -> str:
    if isinstance(body, dict):
        for key in ("Error", "error", "detail", "message"):
            if isinstance(body.get(key), str):
                return str(body[key])
        return ""
    return body.strip()[:500] if isinstance(body, str) else ""


def retry_after_of(response: httpx.Response) -> float | None:
    """The answer's Retry-After in seconds from now, or None when it has none we can read."""
    return parse_retry_after(response.headers.get("Retry-After"))


def parse_retry_after(value: str | None) -> float | None:
    """Retry-After as RFC 9110 writes it: delay-seconds (digits; the broker's form) or an HTTP
    date (seconds until then, 0 when past). Anything else is no Retry-After."""
    value = (value or "").strip()
    if not value:
        return None
    if value.isascii() and value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:  # "-0000": RFC 5322's "UTC, zone unknown"
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _unavailable(method: str, url: str, exc: httpx.TransportError) -> BrokerUnavailable:
    reason = str(exc) or type(exc).__name__
    return BrokerUnavailable(None, f"{method} {url}: no answer from the broker ({reason})")


@dataclass(frozen=True)
class _Request:
    """One request as the callers describe it; sent once per try."""

    method: str
    url: str
    params: Mapping[str, Any] | None = None
    json: Any = None
    data: Mapping[str, Any] | None = None
    content: bytes | None = None
    headers: Mapping[str, str] | None = None

    def build(self, client: httpx.Client | httpx.AsyncClient) -> httpx.Request:
        return client.build_request(
            self.method,
            self.url,
            params=self.params,
            json=self.json,
            data=self.data,
            content=self.content,
            headers=self.headers,
        )


def _client_options(
    base_url: str, headers: Mapping[str, str] | None, timeout: float
) -> dict[str, Any]:
    return {
        "base_url": base_url.rstrip("/"),
        "headers": {"User-Agent": USER_AGENT, **(headers or {})},
        "timeout": httpx.Timeout(timeout),
    }


def _policy_for(method: str, retry: bool | None, policy: RetryPolicy) -> RetryPolicy:
    wanted = method.upper() in _IDEMPOTENT_METHODS if retry is None else retry
    return policy if wanted else NO_RETRY


class HttpClient:
    """Blocking requests to one broker, with default headers (credentials) for every request."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self._client = httpx.Client(**_client_options(base_url, headers, timeout))

    def request(
        self,
        method: str,
        url: str,
        *,
        retry: bool | None = None,
        **parts: Any,
    ) -> httpx.Response:
        """Send and return the 2xx answer; raise the BrokerError of the last try otherwise.

        `parts` are `params`, `json`, `data`, `content` and `headers`. `retry` None retries
        idempotent methods only; True or False decides for this request.
        """
        request = _Request(method.upper(), url, **parts)
        policy = _policy_for(request.method, retry, self.retry)
        tries = 0
        while True:
            tries += 1
            outcome = self._send_once(request)
            if isinstance(outcome, httpx.Response):
                return outcome
            delay = policy.delay_before_retry(tries, outcome)
            if delay is None:
                outcome.tries = tries
                raise outcome
            time.sleep(delay)

    def resolve_link(self, link: str) -> str:
        """The whole URL of a broker's `Pages` link. The broker writes links as absolute paths
        that already hold any prefix it is served under (`/broker/channels?next=...`), so they
        resolve against the base URL's origin, not below its path (as the TypeScript client's
        `resolveLink`)."""
        return urljoin(str(self._client.base_url), link)

    def _send_once(self, request: _Request) -> httpx.Response | BrokerError:
        try:
            response = self._client.send(request.build(self._client))
        except httpx.TransportError as exc:
            return _unavailable(request.method, request.url, exc)
        if response.is_success:
            return response
        return error_from_response(response)

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class AsyncHttpClient:
    """The async twin of HttpClient: the same rule, awaited."""

    def __init__(
        self,
        base_url: str,
        *,
        headers: Mapping[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        self.retry = retry or RetryPolicy()
        self._client = httpx.AsyncClient(**_client_options(base_url, headers, timeout))

    async def request(
        self,
        method: str,
        url: str,
        *,
        retry: bool | None = None,
        **parts: Any,
    ) -> httpx.Response:
        """As HttpClient.request."""
        request = _Request(method.upper(), url, **parts)
        policy = _policy_for(request.method, retry, self.retry)
        tries = 0
        while True:
            tries += 1
            outcome = await self._send_once(request)
            if isinstance(outcome, httpx.Response):
                return outcome
            delay = policy.delay_before_retry(tries, outcome)
            if delay is None:
                outcome.tries = tries
                raise outcome
            await asyncio.sleep(delay)

    async def _send_once(self, request: _Request) -> httpx.Response | BrokerError:
        try:
            response = await self._client.send(request.build(self._client))
        except httpx.TransportError as exc:
            return _unavailable(request.method, request.url, exc)
        if response.is_success:
            return response
        return error_from_response(response)

    async def aclose(self) -> None:
        await self._client.aclose()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
