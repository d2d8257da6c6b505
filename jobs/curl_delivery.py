"""A prototype of jobs/delivery.py's `deliver` on libcurl (pycurl's multi interface on the loop,
jobs/curl_multi.py), for issue 18: same requests in, same `AttemptResult` out, same guarantees,
1.6-1.9 times less CPU per delivery in bench/http_clients.py. The dispatcher does not use it; see
docs/performance.md, "Delivery: HTTP clients compared (issue 18)", for what switching would take.

What it keeps, and how:

* The address guard: every address libcurl is about to connect to is judged by
  `consumers.safety.is_public_address` before it connects (CURLOPT_OPENSOCKETFUNCTION), whatever
  resolved it, so the check and the connection use the same address (no DNS rebinding in
  between), IP literals included; local names are refused before any lookup
  (`check_delivery_url`). No proxy is ever used (a proxy resolves names out of the guard's sight).
* No redirects, no cookies, no decompression, HTTP/1.1 with keep-alive, a total timeout.
* A bounded read: the first RESPONSE_EXCERPT_BYTES of the answer, then the transfer ends.
* Offloaded payloads are signed and streamed from storage in chunks read in worker threads.
* `on_sent` is called just before libcurl writes the request on a ready connection.
"""

from __future__ import annotations

import asyncio
import logging
import time
import traceback
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from datetime import UTC, datetime
from ipaddress import ip_address

import pycurl  # type: ignore[import-untyped,import-not-found,unused-ignore]

from broker.conf import broker_settings
from broker.payloads import PAYLOAD_MISSING, PayloadMissing
from consumers.safety import UnsafeCallback, check_delivery_url, is_public_address
from jobs.curl_multi import Answer, CurlMulti
from jobs.delivery import (
    REQUEST_ERROR,
    STORAGE_ERROR,
    AttemptResult,
    DeliveryRequest,
    StoredBody,
    answered,
    attempt_span,
    chunks_of,
    describe_error,
    ended,
    open_and_sign,
    retry_after_seconds,
    storable_text,
    unanswered,
)

logger = logging.getLogger(__name__)

# Sent with every request: what it reads, it reads as sent; no 100-continue round trip before a
# large body (aiohttp sends none either).
FIXED_HEADERS = ["Accept-Encoding: identity", "Expect:"]


def curl_session(concurrency: int, timeout: float) -> CurlMulti:
    """The libcurl multi handle deliveries go through: up to `concurrency` kept-alive connections,
    every new connection's address judged by the guard."""
    return CurlMulti(concurrency, timeout, allow_address=_allowed_address)


def _allowed_address(ip: str) -> bool:
    if broker_settings.BROKER_ALLOW_PRIVATE_CALLBACKS:
        return True
    try:
        return is_public_address(ip_address(ip.partition("%")[0]))
    except ValueError:
        return False


async def deliver(
    session: CurlMulti,
    request: DeliveryRequest,
    timeout: float,
    on_sent: Callable[[], None] | None = None,
) -> AttemptResult:
    """Send one webhook and describe what happened; never raises (but when cancelled). As
    jobs/delivery.py's `deliver`, with its span when tracing is on."""
    with attempt_span(request) as span:
        if span.headers:
            request = replace(request, headers={**request.headers, **span.headers})
        result = await _deliver(session, request, timeout, on_sent)
        span.record(result.status_code, result.error_class, result.error)
        return result


async def _deliver(
    session: CurlMulti,
    request: DeliveryRequest,
    timeout: float,
    on_sent: Callable[[], None] | None,
) -> AttemptResult:
    try:
        if request.stored is not None:
            return await _deliver_stored(session, request, request.stored, timeout, on_sent)
        return await _post(session, request, request.headers, timeout, on_sent, None)
    except Exception as exc:  # a bug of ours: this attempt's failure, never the dispatcher's end
        frames = "".join(traceback.format_tb(exc.__traceback__))
        error = describe_error(exc)
        logger.error("delivery of job %s failed: %s\n%s", request.job_id, error, frames)
        return unanswered(request, REQUEST_ERROR, f"the request failed: {error}")


async def _post(
    session: CurlMulti,
    request: DeliveryRequest,
    headers: dict[str, str],
    timeout: float,
    on_sent: Callable[[], None] | None,
    stream: tuple[AsyncIterator[bytes], int] | None,
) -> AttemptResult:
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    try:
        check_delivery_url(request.url)  # local names, before libcurl resolves anything
    except UnsafeCallback as exc:
        return ended(request, started_at, started, "unsafe-callback", str(exc))
    chunks, size = stream or (None, 0)
    answer = await session.post(
        request.url,
        header_lines(headers),
        request.body,
        on_sent,
        stream=chunks,
        size=size,
        timeout=timeout,
    )
    if answer.error_code:
        error_class, error = _error_of(answer, request.url, timeout)
        return ended(request, started_at, started, error_class, error)
    status = answer.status
    return answered(
        request,
        started_at,
        started,
        status,
        storable_text(answer.excerpt.decode("utf-8", errors="replace")),
        _retry_after(answer) if status in (429, 503) else None,
    )


def header_lines(headers: dict[str, str]) -> list[str]:
    """libcurl's header lines. "Name;" sends an empty header: "Name:" would remove it."""
    lines = [f"{name}: {value}" if value else f"{name};" for name, value in headers.items()]
    return lines + FIXED_HEADERS


def _error_of(answer: Answer, url: str, timeout: float) -> tuple[str, str]:
    if answer.refused:
        host = answer.refused
        return "unsafe-callback", str(
            UnsafeCallback(host, f"it resolves to the non-public address {host}")
        )
    if answer.error_code == pycurl.E_OPERATION_TIMEDOUT:
        return "timeout", f"no answer within {timeout:g} s"
    # libcurl's messages name the host and port, never the URL's userinfo or query.
    return "connection", storable_text(f"curl error {answer.error_code}: {answer.error}"[:500])


def _retry_after(answer: Answer) -> float | None:
    for line in answer.header_lines:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"retry-after":
            return retry_after_seconds(value.decode("latin-1"), time.time())
    return None


async def _deliver_stored(
    session: CurlMulti,
    request: DeliveryRequest,
    stored: StoredBody,
    timeout: float,
    on_sent: Callable[[], None] | None,
) -> AttemptResult:
    """An offloaded payload: signed in one pass over the file, then streamed from it, storage
    I/O in worker threads (as jobs/delivery.py does)."""
    try:
        file, file_headers = await asyncio.to_thread(open_and_sign, stored)
    except PayloadMissing as exc:
        return unanswered(request, PAYLOAD_MISSING, str(exc))
    except Exception as exc:  # each storage backend raises its own
        logger.warning("cannot read offloaded payload %s: %s", stored.name, describe_error(exc))
        return unanswered(request, STORAGE_ERROR, f"payload storage: {describe_error(exc)}")
    size = int(file_headers.pop("Content-Length"))  # libcurl sends it from the size it is given
    headers = {**request.headers, **file_headers}
    try:
        stream = (chunks_of(file, None), size)
        return await _post(session, request, headers, timeout, on_sent, stream)
    finally:
        await asyncio.to_thread(file.close)
