"""Sending one webhook: `open_sender`, which the dispatcher, the UI's test events and the tests all
send through; the request and the attempt's result, its span, the reading of an offloaded payload,
and the rule that nothing a delivery meets ends anything but that attempt (docs/dispatcher.md).
libcurl does the HTTP work: jobs/curl_delivery.py and jobs/curl_multi.py."""

from __future__ import annotations

import asyncio
import calendar
import logging
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterable
from contextlib import AbstractContextManager, asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from email.utils import parsedate_tz
from typing import Any, Protocol

from django.core.files import File

from broker import payloads, tracing
from broker.payloads import PAYLOAD_MISSING, PayloadMissing
from broker.tracing import AttemptSpan, TraceContext
from jobs.header_masking import masked_headers

logger = logging.getLogger(__name__)

MAX_RETRY_AFTER_SECONDS = 86400
CHUNK_BYTES = 256 * 1024  # read and sent at a time from an offloaded payload
STORAGE_ERROR = "storage-error"  # error class: the payload storage failed to give the payload
# Error class of a delivery that failed in a way no other class describes: an exception of the HTTP
# client or of our own code. It is that job's failed attempt, never the dispatcher's end.
REQUEST_ERROR = "request-error"
# What an attempt's record keeps of the headers of its request and of its answer, each: at most
# this many headers, of at most this many characters of names and values in all, each name and
# value cut at KEPT_HEADER_CHARS (docs/delivery.md, "What an attempt keeps of its headers"). A
# receiver's answer may carry hundreds of KiB of headers, and a message's metadata up to 50 of
# 8 KiB; its row stays small.
MAX_KEPT_HEADERS = 50
KEPT_HEADERS_CHARS = 4096
KEPT_HEADER_CHARS = 1024

# Header names and values in their order, as an attempt keeps them (JSON: [[name, value], ...]).
Headers = tuple[tuple[str, str], ...]


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
    partition_at: datetime  # the job's (jobs/queue's ClaimedJob): with job_id its whole key
    attempt: int  # this attempt's number (the job's attempts after the claim)
    consumer_id: int  # whose retry policy judges the outcome
    url: str
    headers: dict[str, str]
    body: bytes
    stored: StoredBody | None = None  # set when the payload is in storage (`body` is then empty)
    names: DeliveryNames | None = None
    trace: TraceContext | None = None  # the message's, which the attempt's span continues
    send_at: datetime | None = None  # not before: a rate-limited consumer's slot (dispatch.py)


@dataclass(frozen=True)
class AttemptResult:
    job_id: int
    partition_at: datetime  # the request's: its job is recorded by the whole primary key
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
    # Of a failed attempt, as `kept_headers` keeps them: those the request was sent with (or
    # would have been, when it ended before), signature included; those of the final answer,
    # none without one. A 2xx keeps none (`_result`).
    request_headers: Headers = ()
    response_headers: Headers = ()

    @property
    def succeeded(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


class Post(Protocol):
    """libcurl's POST of a delivery (jobs/curl_delivery.py): `body` is the request's own bytes or
    its offloaded payload's open file; `on_sent` is called as the request goes on the wire.
    Describes what happened as an AttemptResult; may raise only for a bug, which `deliver` makes
    the attempt's failure."""

    def __call__(
        self,
        request: DeliveryRequest,
        headers: dict[str, str],
        body: bytes | File[bytes],
        timeout: float,
        on_sent: Callable[[], None] | None,
    ) -> Awaitable[AttemptResult]: ...


# Delivers one request within a timeout, calling `on_sent` as it goes on the wire; never raises.
Send = Callable[
    [DeliveryRequest, float, Callable[[], None] | None], Coroutine[Any, Any, AttemptResult]
]


@asynccontextmanager
async def open_sender(concurrency: int) -> AsyncIterator[Send]:
    """Delivers over libcurl, up to `concurrency` requests at a time."""
    from jobs.curl_delivery import curl_post  # imported here: it builds on this module

    async with curl_post(concurrency) as post:

        async def send(
            request: DeliveryRequest, timeout: float, on_sent: Callable[[], None] | None = None
        ) -> AttemptResult:
            return await deliver(post, request, timeout, on_sent)

        yield send


async def deliver(
    post: Post,
    request: DeliveryRequest,
    timeout: float,
    on_sent: Callable[[], None] | None = None,
) -> AttemptResult:
    """Send one webhook through `post` and describe what happened; never raises (but when
    cancelled).

    Whatever goes wrong inside one delivery, an exception of the HTTP client on a hostile answer
    or a bug of ours included, becomes that attempt's failure: the dispatcher's loop and the
    other deliveries of its batch never see it. `on_sent` is called as the request goes on the
    wire: from then on the consumer may have it.

    With tracing on, the attempt has a span, whose trace context the request sends
    (broker/tracing.py).
    """
    with attempt_span(request) as span:
        if span.headers:
            request = replace(request, headers={**request.headers, **span.headers})
        result = await _attempt(post, request, timeout, on_sent)
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


async def _attempt(
    post: Post,
    request: DeliveryRequest,
    timeout: float,
    on_sent: Callable[[], None] | None,
) -> AttemptResult:
    try:
        if request.stored is not None:
            return await _attempt_stored(post, request, request.stored, timeout, on_sent)
        return await post(request, request.headers, request.body, timeout, on_sent)
    except Exception as exc:
        # The traceback's frames, with the message as `describe_error` gives it (without the URL).
        frames = "".join(traceback.format_tb(exc.__traceback__))
        error = describe_error(exc)
        logger.error("delivery of job %s failed: %s\n%s", request.job_id, error, frames)
        return unanswered(request, REQUEST_ERROR, f"the request failed: {error}")


async def _attempt_stored(
    post: Post,
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
        file, signature = await asyncio.to_thread(open_and_sign, stored)
    except PayloadMissing as exc:
        return unanswered(request, PAYLOAD_MISSING, str(exc))
    except Exception as exc:  # each storage backend raises its own (OSError, botocore, ...)
        logger.warning("cannot read offloaded payload %s: %s", stored.name, describe_error(exc))
        return unanswered(request, STORAGE_ERROR, f"payload storage: {describe_error(exc)}")
    signed = replace(request, headers={**request.headers, **signature})  # its result's headers
    try:
        return await post(signed, signed.headers, file, timeout, on_sent)
    finally:
        await asyncio.to_thread(file.close)


def open_and_sign(stored: StoredBody) -> tuple[File[bytes], dict[str, str]]:
    """The stored payload, opened and rewound after a signing pass, and its signature headers
    (in a worker thread)."""
    file = payloads.open_payload(stored.name)
    try:
        signature = stored.sign(iter(lambda: file.read(CHUNK_BYTES), b""), datetime.now(UTC))
        file.seek(0)
        return file, signature
    except BaseException:
        file.close()
        raise


async def chunks_of(file: File[bytes]) -> AsyncIterator[bytes]:
    """The file's content, each chunk read in a worker thread."""
    while chunk := await asyncio.to_thread(file.read, CHUNK_BYTES):
        yield chunk


def answered(
    request: DeliveryRequest,
    started_at: datetime,
    started: float,
    status: int,
    excerpt: str,
    retry_after: float | None,
    headers: Iterable[tuple[bytes, bytes]] = (),
) -> AttemptResult:
    """An attempt the consumer answered, timed from `started` (perf_counter): 2xx or not; the
    answer's `headers` as received, kept (`received_headers`) when it failed."""
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
        response_headers=() if ok else received_headers(headers),
    )


def ended(
    request: DeliveryRequest, started_at: datetime, started: float, error_class: str, error: str
) -> AttemptResult:
    """An attempt that ended without an answer after it was started (perf_counter)."""
    return _result(request, started_at, _elapsed_ms(started), error_class=error_class, error=error)


def unanswered(request: DeliveryRequest, error_class: str, error: str) -> AttemptResult:
    """An attempt that ended without an answer, before or while the request was made."""
    return _result(request, datetime.now(UTC), 0.0, error_class=error_class, error=error)


def _result(
    request: DeliveryRequest, started_at: datetime, duration_ms: float, **outcome: Any
) -> AttemptResult:
    """`request`'s attempt: its job, consumer and names, with `outcome`'s AttemptResult fields;
    a failed one with the headers its request was sent with.

    Only failures keep headers: they are what an operator reads to find out why, and keeping
    them for every 2xx cost the dispatcher about a quarter more CPU per delivery
    (docs/performance-history.md, "Attempt headers (issue 20)")."""
    result = AttemptResult(
        request.job_id,
        request.partition_at,
        request.attempt,
        request.consumer_id,
        started_at,
        duration_ms,
        names=request.names,
        **outcome,
    )
    if result.succeeded:
        return result
    return replace(result, request_headers=kept_headers(request.headers.items()))


def _elapsed_ms(started: float) -> float:
    return (time.perf_counter() - started) * 1000


def retry_after_of(status: int, value: str | None) -> float | None:
    """The wait a 429 or 503 asks for with its Retry-After `value`; None for other answers."""
    if status not in (429, 503) or value is None:
        return None
    return retry_after_seconds(value, time.time())


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


def received_headers(raw: Iterable[tuple[bytes, bytes]]) -> Headers:
    """An answer's header lines (name and value as received) as its attempt keeps them: read as
    UTF-8, an invalid byte replaced, then `kept_headers`."""
    return kept_headers(
        (name.decode(errors="replace"), value.decode(errors="replace")) for name, value in raw
    )


def kept_headers(headers: Iterable[tuple[str, str]]) -> Headers:
    """What an attempt's record keeps of `headers`, in their order: each secret value masked
    (jobs/header_masking.py, before anything else sees it), NULs replaced, each name and value
    cut at KEPT_HEADER_CHARS, and no more than MAX_KEPT_HEADERS and KEPT_HEADERS_CHARS in all:
    the headers past the bound are left out. Runs for every delivery, twice: the common case,
    short headers without NULs, costs a few comparisons each."""
    kept: list[tuple[str, str]] = []
    room = KEPT_HEADERS_CHARS
    for name, value in masked_headers(headers):
        size = len(name) + len(value)
        if size >= room or len(name) > KEPT_HEADER_CHARS or len(value) > KEPT_HEADER_CHARS:
            name = _cut(name, KEPT_HEADER_CHARS)
            if len(name) >= room:
                break
            value = _cut(value, min(KEPT_HEADER_CHARS, room - len(name)))
            size = len(name) + len(value)
        if "\x00" in name or "\x00" in value:
            name, value = storable_text(name), storable_text(value)
        kept.append((name, value))
        room -= size
        if len(kept) == MAX_KEPT_HEADERS:
            break
    return tuple(kept)


def _cut(text: str, limit: int) -> str:
    """`text` in at most `limit` (at least 1) characters, an ellipsis saying it was cut."""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def storable_text(text: str) -> str:
    """`text` without NUL characters, which PostgreSQL text columns refuse: a receiver's answer
    or an error message must never be what keeps an attempt from being recorded."""
    return text.replace("\x00", "\ufffd")


def describe_error(exc: BaseException) -> str:
    """The exception in one line for `last_error` and the logs, without NULs: its name and its
    message."""
    line = f"{type(exc).__name__}: {exc}"
    return storable_text(line.replace("\n", " ")[:500])
