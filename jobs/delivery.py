"""The one place the broker sends webhooks: a POST with a timeout and no redirects
(docs/dispatcher.md)."""

from __future__ import annotations

import asyncio
import calendar
import logging
import time
import traceback
from collections.abc import AsyncIterator, Callable, Iterable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_tz
from typing import Any

import aiohttp
from aiohttp.abc import AbstractStreamWriter
from aiohttp.payload import BytesPayload
from django.core.files import File

from broker import payloads, tracing
from broker.payloads import PAYLOAD_MISSING, PayloadMissing
from broker.tracing import AttemptSpan, TraceContext
from consumers.safety import SafeResolver, check_delivery_url, is_refusal

logger = logging.getLogger(__name__)

RESPONSE_EXCERPT_BYTES = 4096
MAX_RETRY_AFTER_SECONDS = 86400
CHUNK_BYTES = 256 * 1024  # read and sent at a time from an offloaded payload
STORAGE_ERROR = "storage-error"  # error class: the payload storage failed to give the payload
# Error class of a delivery that failed in a way no other class describes: an exception of the HTTP
# client or of our own code. It is that job's failed attempt, never the dispatcher's end.
REQUEST_ERROR = "request-error"


@dataclass(frozen=True)
class StoredBody:
    """An offloaded payload (docs/delivery.md, "Large payloads"): opened, signed and streamed from
    storage when sent."""

    name: str  # in the payload storage
    # Makes the Standard Webhooks headers from the payload's chunks and the time of signing
    # (jobs/signing.py): only possible once the payload is being read.
    sign: Callable[[Iterable[bytes], datetime], dict[str, str]]


@dataclass(frozen=True)
class DeliveryNames:
    """What a delivery is of, by public IDs: for its log line and its span."""

    job: str  # Job.public_id
    message: str
    channel: str
    consumer: str
    trace_id: str = ""  # of the message's trace context, when it has one


@dataclass(frozen=True)
class DeliveryRequest:
    job_id: int
    attempt: int  # this attempt's number (the job's attempts after the claim)
    consumer_id: int  # whose retry policy judges the outcome
    url: str
    headers: dict[str, str]
    body: bytes
    stored: StoredBody | None = None  # set when the payload is in storage (`body` is then empty)
    names: DeliveryNames | None = None
    trace: TraceContext | None = None  # the message's, which the attempt's span continues


@dataclass(frozen=True)
class AttemptResult:
    job_id: int
    attempt: int
    consumer_id: int
    started_at: datetime
    duration_ms: float
    status_code: int | None = None  # None: no HTTP response at all
    error_class: str = ""  # "" for 2xx; "http-status", "timeout", "connection", ...
    error: str = ""  # one line for humans (last_error)
    response_excerpt: str = ""
    retry_after: float | None = field(default=None)  # seconds, from a 429/503 Retry-After
    names: DeliveryNames | None = None  # the request's

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


async def deliver(
    session: aiohttp.ClientSession,
    request: DeliveryRequest,
    timeout: float,
    on_sent: Callable[[], None] | None = None,
) -> AttemptResult:
    """Send one webhook and describe what happened; never raises (but when cancelled).

    Whatever goes wrong inside one delivery, an exception of the HTTP client on a hostile answer
    or a bug of ours included, becomes that attempt's failure: the dispatcher's loop and the
    other deliveries of its batch never see it. `on_sent` is called as the request goes on the
    wire (see `ReportingBody`).

    With tracing on, the attempt has a span, whose trace context the request sends
    (broker/tracing.py).
    """
    with attempt_span(request) as span:
        if span.headers:
            request = replace(request, headers={**request.headers, **span.headers})
        result = await _deliver(session, request, timeout, on_sent)
        span.record(result.status_code, result.error_class, result.error)
        return result


def attempt_span(request: DeliveryRequest) -> AbstractContextManager[AttemptSpan]:
    """The attempt's span, named by its channel, message, consumer and job (tracing off: none)."""
    names = request.names or DeliveryNames("", "", "", "")
    return tracing.attempt_span(
        request.trace,
        channel_id=names.channel,
        message_id=names.message,
        consumer_id=names.consumer,
        job_id=names.job,
        attempt=request.attempt,
        url=request.url,
    )


async def _deliver(
    session: aiohttp.ClientSession,
    request: DeliveryRequest,
    timeout: float,
    on_sent: Callable[[], None] | None,
) -> AttemptResult:
    try:
        if request.stored is not None:
            return await _deliver_stored(session, request, request.stored, timeout, on_sent)
        data = ReportingBody(request.body, on_sent) if on_sent else request.body
        return await _post(session, request, data, request.headers, timeout)
    except Exception as exc:
        # The traceback's frames, with the message as `describe_error` gives it (without the URL).
        frames = "".join(traceback.format_tb(exc.__traceback__))
        error = describe_error(exc)
        logger.error("delivery of job %s failed: %s\n%s", request.job_id, error, frames)
        return unanswered(request, REQUEST_ERROR, f"the request failed: {error}")


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


async def _post(
    session: aiohttp.ClientSession,
    request: DeliveryRequest,
    data: Any,
    headers: dict[str, str],
    timeout: float,
) -> AttemptResult:
    started_at = datetime.now(UTC)
    started = time.perf_counter()
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
            status, retry_after = response.status, _retry_after(response)
    except TimeoutError:
        error_class, error = "timeout", f"no answer within {timeout:g} s"
    except (aiohttp.ClientError, OSError) as exc:  # OSError: refused by the address guard
        error_class = "unsafe-callback" if is_refusal(exc) else "connection"
        error = describe_error(exc)
    else:
        return answered(request, started_at, started, status, excerpt, retry_after)
    return ended(request, started_at, started, error_class, error)


def answered(
    request: DeliveryRequest,
    started_at: datetime,
    started: float,
    status: int,
    excerpt: str,
    retry_after: float | None,
) -> AttemptResult:
    """An attempt the consumer answered, timed from `started` (perf_counter): 2xx or not."""
    ok = 200 <= status < 300
    return _result(
        request,
        started_at,
        _elapsed_ms(started),
        status_code=status,
        error_class="" if ok else "http-status",
        error="" if ok else f"HTTP {status}",
        response_excerpt=excerpt,
        retry_after=retry_after,
    )


def ended(
    request: DeliveryRequest, started_at: datetime, started: float, error_class: str, error: str
) -> AttemptResult:
    """An attempt that ended without an answer after it was started (perf_counter)."""
    return _result(request, started_at, _elapsed_ms(started), error_class=error_class, error=error)


def _result(
    request: DeliveryRequest, started_at: datetime, duration_ms: float, **outcome: Any
) -> AttemptResult:
    """`request`'s attempt: its job, consumer and names, with `outcome`'s AttemptResult fields."""
    return AttemptResult(
        request.job_id,
        request.attempt,
        request.consumer_id,
        started_at,
        duration_ms,
        names=request.names,
        **outcome,
    )


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


async def _deliver_stored(
    session: aiohttp.ClientSession,
    request: DeliveryRequest,
    stored: StoredBody,
    timeout: float,
    on_sent: Callable[[], None] | None,
) -> AttemptResult:
    """Deliver an offloaded payload: signed in one pass over the file, then streamed from it.

    Storage I/O blocks, so it runs in worker threads and the event loop never waits on it; only
    a chunk at a time is in memory. A file that is gone ends the job (`payload-missing`); any
    other storage error is retried like a failed attempt, and neither is held against the
    consumer (jobs/retry.py).
    """
    try:
        file, file_headers = await asyncio.to_thread(open_and_sign, stored)
    except PayloadMissing as exc:
        return unanswered(request, PAYLOAD_MISSING, str(exc))
    except Exception as exc:  # each storage backend raises its own (OSError, botocore, ...)
        logger.warning("cannot read offloaded payload %s: %s", stored.name, describe_error(exc))
        return unanswered(request, STORAGE_ERROR, f"payload storage: {describe_error(exc)}")
    headers = {**request.headers, **file_headers}
    try:
        return await _post(session, request, chunks_of(file, on_sent), headers, timeout)
    finally:
        await asyncio.to_thread(file.close)


def open_and_sign(stored: StoredBody) -> tuple[File[bytes], dict[str, str]]:
    """The stored payload, opened and rewound after a signing pass, and its signature and length
    headers (in a worker thread)."""
    file = payloads.open_payload(stored.name)
    try:
        signature = stored.sign(iter(lambda: file.read(CHUNK_BYTES), b""), datetime.now(UTC))
        file.seek(0)
        # An explicit length keeps aiohttp from sending the stream chunked, which some
        # receivers' servers (WSGI ones above all) do not accept.
        return file, {**signature, "Content-Length": str(file.size)}
    except BaseException:
        file.close()
        raise


async def chunks_of(file: File[bytes], on_sent: Callable[[], None] | None) -> AsyncIterator[bytes]:
    """The file's content for aiohttp to stream, each chunk read in a worker thread."""
    # aiohttp asks for the first chunk as the headers go out: from here the consumer may have
    # the request, as with `ReportingBody`.
    if on_sent:
        on_sent()
    while chunk := await asyncio.to_thread(file.read, CHUNK_BYTES):
        yield chunk


def unanswered(request: DeliveryRequest, error_class: str, error: str) -> AttemptResult:
    """An attempt that ended without an answer, before or while the request was made."""
    return _result(request, datetime.now(UTC), 0.0, error_class=error_class, error=error)


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


def _retry_after(response: aiohttp.ClientResponse) -> float | None:
    if response.status not in (429, 503):
        return None
    return retry_after_seconds(response.headers.get("Retry-After", ""), time.time())


def retry_after_seconds(value: str, now: float) -> float | None:
    """How long a Retry-After value asks to wait, in seconds from `now` (a Unix time): a number
    of seconds, or an HTTP-date in any of its three forms, one without a zone (or with -0000)
    read as UTC. Between 0 and a day; None for anything else, which is ignored. The retry policy
    bounds it further by the consumer's longest retry delay (jobs/retry.py)."""
    value = value.strip()
    if value.isascii() and value.isdigit():
        # Clamped before int(), which refuses strings of over 4,300 digits.
        seconds = int(value) if len(value) <= 9 else MAX_RETRY_AFTER_SECONDS
        return float(min(seconds, MAX_RETRY_AFTER_SECONDS))
    try:
        date = parsedate_tz(value)
        if date is None:
            return None
        when = calendar.timegm(date[:6]) - (date[9] or 0)  # plain arithmetic: no year limits
    except (ValueError, TypeError, IndexError, OverflowError):
        return None
    return max(0.0, min(when - now, MAX_RETRY_AFTER_SECONDS))


def storable_text(text: str) -> str:
    """`text` without NUL characters, which PostgreSQL text columns refuse: a receiver's answer
    or an error message must never be what keeps an attempt from being recorded."""
    return text.replace("\x00", "\ufffd")


def describe_error(exc: BaseException) -> str:
    """The exception in one line for `last_error` and the logs, without the callback URL that
    aiohttp puts in some messages (its userinfo or query may carry a secret), nor NULs."""
    if isinstance(exc, aiohttp.ClientResponseError):
        text = f"{type(exc).__name__}: {exc.status}, {exc.message}"
    elif isinstance(exc, aiohttp.InvalidURL):
        text = f"{type(exc).__name__}: the callback URL is not valid"
    else:
        text = f"{type(exc).__name__}: {exc}"
    return storable_text(text.replace("\n", " ")[:500])
