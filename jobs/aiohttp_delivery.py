"""Deliveries over aiohttp (BROKER_DISPATCH_HTTP_CLIENT=aiohttp): the session and its POST, for
jobs/delivery.py's `deliver` (docs/dispatcher.md)."""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import BytesPayload
from django.core.files import File

from consumers.safety import SafeResolver, check_delivery_url, is_refusal
from jobs.delivery import (
    RESPONSE_EXCERPT_BYTES,
    AttemptResult,
    DeliveryRequest,
    Post,
    answered,
    chunks_of,
    describe_error,
    ended,
    retry_after_of,
    storable_text,
)


@asynccontextmanager
async def aiohttp_post(concurrency: int) -> AsyncIterator[Post]:
    """The POST of deliveries over one session of up to `concurrency` connections."""
    async with delivery_session(concurrency) as session:
        yield functools.partial(post, session)


def delivery_session(concurrency: int) -> aiohttp.ClientSession:
    """The HTTP client session deliveries go through, shared by every consumer of a dispatcher.

    It keeps nothing from one request for the next that another consumer could receive: no
    cookies (a webhook sender is no browser, and a cookie one receiver sets must never reach
    another), no credentials (those of a callback URL go with that request alone), no redirects.
    Answers are not decompressed: only an excerpt is kept, and a compressed body is no way to
    make the dispatcher inflate a bomb. Names resolve through the address guard (SafeResolver);
    the environment's proxy settings are ignored (trust_env is off), as a proxy would resolve
    names out of the guard's sight. docs/dispatcher.md says what is shared, and why it is safe.
    """
    connector = aiohttp.TCPConnector(limit=concurrency, resolver=SafeResolver())
    return aiohttp.ClientSession(
        connector=connector,
        cookie_jar=aiohttp.DummyCookieJar(),
        auto_decompress=False,
        headers={"Accept-Encoding": "identity"},  # what it reads, it reads as sent
        trust_env=False,
    )


async def post(
    session: aiohttp.ClientSession,
    request: DeliveryRequest,
    headers: dict[str, str],
    body: bytes | File[bytes],
    timeout: float,
    on_sent: Callable[[], None] | None,
) -> AttemptResult:
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    data: Any = body
    if isinstance(body, File):
        # An explicit length keeps aiohttp from sending the stream chunked, which some
        # receivers' servers (WSGI ones above all) do not accept.
        headers = {**headers, "Content-Length": str(body.size)}
        data = _reporting_chunks(body, on_sent)
    elif on_sent is not None:
        data = ReportingBody(body, on_sent)
    try:
        # IP literals never reach the resolver's guard, so they are judged here.
        check_delivery_url(request.url)
        async with session.post(
            request.url,
            data=data,
            headers=headers,
            allow_redirects=False,  # a 3xx is a failure, not somewhere else to send the payload
            timeout=aiohttp.ClientTimeout(total=timeout),
        ) as response:
            excerpt = await _excerpt(response)
            status = response.status
            retry_after = retry_after_of(status, response.headers.get("Retry-After"))
            answer_headers = response.raw_headers
    except TimeoutError:
        error_class, error = "timeout", f"no answer within {timeout:g} s"
    except (aiohttp.ClientError, OSError) as exc:  # OSError: refused by the address guard
        error_class = "unsafe-callback" if is_refusal(exc) else "connection"
        error = describe_aiohttp_error(exc)
    else:
        return answered(request, started_at, started, status, excerpt, retry_after, answer_headers)
    return ended(request, started_at, started, error_class, error)


async def _reporting_chunks(
    file: File[bytes], on_sent: Callable[[], None] | None
) -> AsyncIterator[bytes]:
    # aiohttp asks for the first chunk as the headers go out: from here the consumer may have
    # the request, as with `ReportingBody`.
    if on_sent:
        on_sent()
    async for chunk in chunks_of(file):
        yield chunk


class ReportingBody(BytesPayload):
    """A request body that reports when it starts going out.

    aiohttp sends a request's headers together with the first chunk of its body, so from this
    moment the consumer may receive the request. The dispatcher needs to know that only for
    deliveries it cuts off at shutdown; reporting it here costs one call, where an aiohttp
    TraceConfig costs a signal object per stage of every request.
    """

    def __init__(self, body: bytes, on_sent: Callable[[], None]) -> None:
        super().__init__(body)
        self._on_sent = on_sent

    async def write_with_length(
        self, writer: AbstractStreamWriter, content_length: int | None
    ) -> None:
        self._on_sent()
        await super().write_with_length(writer, content_length)


async def _excerpt(response: aiohttp.ClientResponse) -> str:
    """The first few KiB of the body: enough to diagnose, never a whole huge response."""
    try:
        chunk = await response.content.read(RESPONSE_EXCERPT_BYTES)
    except (TimeoutError, aiohttp.ClientError):
        return ""
    return storable_text(chunk.decode("utf-8", errors="replace"))


def describe_aiohttp_error(exc: BaseException) -> str:
    """`describe_error` without the callback URL that aiohttp puts in some messages."""
    if isinstance(exc, aiohttp.ClientResponseError):
        return describe_error(exc, f"{exc.status}, {exc.message}")
    if isinstance(exc, aiohttp.InvalidURL):
        return describe_error(exc, "the callback URL is not valid")
    return describe_error(exc)
