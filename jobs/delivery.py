"""The one place the broker sends webhooks: a POST with a timeout and no redirects (SPEC §5)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any

import aiohttp

from consumers.safety import check_delivery_url, is_refusal

RESPONSE_EXCERPT_BYTES = 4096
MAX_RETRY_AFTER_SECONDS = 86400


@dataclass(frozen=True)
class DeliveryRequest:
    job_id: int
    attempt: int  # this attempt's number (the job's attempts after the claim)
    url: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class AttemptResult:
    job_id: int
    attempt: int
    started_at: datetime
    duration_ms: float
    status_code: int | None = None  # None: no HTTP response at all
    error_class: str = ""  # "" for 2xx; "http-status", "timeout", "connection", ...
    error: str = ""  # one line for humans (last_error)
    response_excerpt: str = ""
    retry_after: float | None = field(default=None)  # seconds, from a 429/503 Retry-After

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


async def deliver(
    session: aiohttp.ClientSession,
    request: DeliveryRequest,
    timeout: float,
    trace_context: dict[str, Any] | None = None,
) -> AttemptResult:
    """Send one webhook and describe what happened; never raises for a delivery failure."""
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    try:
        # IP literals never reach the resolver's guard, so they are judged here.
        check_delivery_url(request.url)
        async with session.post(
            request.url,
            data=request.body,
            headers=request.headers,
            allow_redirects=False,  # a 3xx is a failure, not somewhere else to send the payload
            timeout=aiohttp.ClientTimeout(total=timeout),
            trace_request_ctx=trace_context,
        ) as response:
            excerpt = await _excerpt(response)
            status, retry_after = response.status, _retry_after(response)
    except TimeoutError:
        error_class, error = "timeout", f"no answer within {timeout:g} s"
    except (aiohttp.ClientError, OSError) as exc:  # OSError: refused by the address guard
        error_class = "unsafe-callback" if is_refusal(exc) else "connection"
        error = _one_line(exc)
    else:
        ok = 200 <= status < 300
        error_class, error = ("", "") if ok else ("http-status", f"HTTP {status}")
        return AttemptResult(
            request.job_id,
            request.attempt,
            started_at,
            (time.perf_counter() - started) * 1000,
            status_code=status,
            error_class=error_class,
            error=error,
            response_excerpt=excerpt,
            retry_after=retry_after,
        )
    duration_ms = (time.perf_counter() - started) * 1000
    return AttemptResult(
        request.job_id, request.attempt, started_at, duration_ms, None, error_class, error
    )


async def _excerpt(response: aiohttp.ClientResponse) -> str:
    """The first few KiB of the body: enough to diagnose, never a whole huge response."""
    try:
        chunk = await response.content.read(RESPONSE_EXCERPT_BYTES)
    except (TimeoutError, aiohttp.ClientError):
        return ""
    return chunk.decode("utf-8", errors="replace")


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    if response.status not in (429, 503):
        return None
    raw = response.headers.get("Retry-After", "").strip()
    if raw.isascii() and raw.isdigit():
        return float(min(int(raw), MAX_RETRY_AFTER_SECONDS))
    try:
        when = parsedate_to_datetime(raw)
    except (TypeError, ValueError):
        return None
    seconds = (when - datetime.now(UTC)).total_seconds()
    return max(0.0, min(seconds, MAX_RETRY_AFTER_SECONDS))


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".replace("\n", " ")
    return text[:500]
