"""Deliveries over libcurl, the broker's one HTTP sender: pycurl's multi interface on the running
loop (jobs/curl_multi.py), for jobs/delivery.py's `deliver`. It does the HTTP work in C: 1.6-1.9
times less CPU per request than aiohttp in bench/http_clients.py (docs/performance-history.md,
"Delivery: HTTP clients compared (issue 18)"), which is why it replaced aiohttp (issue 37).

What it keeps, and how:

* The address guard: every address libcurl is about to connect to is judged by
  `consumers.safety.is_public_address` before it connects (CURLOPT_OPENSOCKETFUNCTION), whatever
  resolved it, so the check and the connection use the same address (no DNS rebinding in
  between), IP literals included; local names are refused before any lookup
  (`check_delivery_url`). No proxy is ever used (a proxy resolves names out of the guard's sight).
* No redirects, no cookies, no decompression, HTTP/1.1 with keep-alive, a total timeout.
* A bounded read: the first EXCERPT_BYTES of the answer (curl_multi.py), then the transfer ends.
* The final answer's headers, for a failed attempt's record: libcurl hands every header line it
  reads, those of interim answers (1xx) and trailers included, to CURLOPT_HEADERFUNCTION, which
  is a list's append (no Python function of ours runs per line); for an answer that is not a 2xx
  `header_fields` picks out the final answer's once it is in, and reads Retry-After from them.
* Offloaded payloads are signed and streamed from storage in chunks read in worker threads.
* `on_sent` is called just before libcurl writes the request on a ready connection.
"""

from __future__ import annotations

import functools
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from ipaddress import ip_address
from urllib.parse import urlsplit

import pycurl  # type: ignore[import-untyped,import-not-found,unused-ignore]
from django.core.files import File

from broker.conf import broker_settings
from consumers.safety import UnsafeCallback, check_delivery_url, is_public_address
from jobs.curl_multi import Answer, CurlMulti
from jobs.delivery import (
    AttemptResult,
    DeliveryRequest,
    Post,
    answered,
    chunks_of,
    ended,
    retry_after_of,
    storable_text,
)

# Sent with every request: what it reads, it reads as sent; no 100-continue round trip before a
# large body.
FIXED_HEADERS = [b"Accept-Encoding: identity", b"Expect:"]


@asynccontextmanager
async def curl_post(concurrency: int, pinned: Sequence[str] = ()) -> AsyncIterator[Post]:
    """The POST of deliveries over one libcurl multi handle keeping up to `concurrency`
    connections alive, every new connection's address judged by the guard. `pinned` names'
    addresses ("host:port:address", libcurl's CURLOPT_RESOLVE) are for tests that play DNS."""
    timeout = float(broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS)  # each POST passes its own
    session = CurlMulti(concurrency, timeout, allow_address=allowed_address, pinned=pinned)
    try:
        yield functools.partial(post, session)
    finally:
        session.close()


def allowed_address(ip: str) -> bool:
    """The address guard, judging an address libcurl is about to connect to."""
    if broker_settings.BROKER_ALLOW_PRIVATE_CALLBACKS:
        return True
    try:
        return is_public_address(ip_address(ip.partition("%")[0]))
    except ValueError:
        return False


async def post(
    session: CurlMulti,
    request: DeliveryRequest,
    headers: dict[str, str],
    body: bytes | File[bytes],
    timeout: float,
    on_sent: Callable[[], None] | None,
) -> AttemptResult:
    started_at = datetime.now(UTC)
    started = time.perf_counter()
    try:
        check_delivery_url(request.url)  # local names, before libcurl resolves anything
    except UnsafeCallback as exc:
        return ended(request, started_at, started, "unsafe-callback", str(exc))
    stream: AsyncIterator[bytes] | None = None
    size = 0
    if isinstance(body, File):  # libcurl sends Content-Length from the size it is given
        stream, size, body = chunks_of(body), body.size, b""
    answer = await session.post(
        request.url, header_lines(headers), body, on_sent, stream=stream, size=size, timeout=timeout
    )
    if answer.error_code:
        error_class, error = _error_of(answer, request.url, timeout)
        return ended(request, started_at, started, error_class, error)
    status = answer.status
    excerpt = storable_text(answer.excerpt.decode("utf-8", errors="replace"))
    if 200 <= status < 300:  # its headers are neither kept nor read (jobs/delivery.py)
        return answered(request, started_at, started, status, excerpt, None)
    fields = header_fields(answer.header_lines)
    retry_after = _retry_after(status, fields)
    return answered(request, started_at, started, status, excerpt, retry_after, fields)


def header_lines(headers: dict[str, str]) -> list[bytes]:
    """libcurl's header lines, in UTF-8 (a kept metadata header's value may be any text). "Name;"
    sends an empty header: "Name:" would remove it."""
    lines = [f"{name}: {value}" if value else f"{name};" for name, value in headers.items()]
    return [line.encode() for line in lines] + FIXED_HEADERS


def _error_of(answer: Answer, url: str, timeout: float) -> tuple[str, str]:
    if answer.refused:
        reason = f"it resolves to the non-public address {answer.refused}"
        return "unsafe-callback", str(UnsafeCallback(urlsplit(url).hostname, reason))
    if answer.error_code == pycurl.E_OPERATION_TIMEDOUT:
        return "timeout", f"no answer within {timeout:g} s"
    # libcurl's messages name the host and port, never the URL's userinfo or query.
    return "connection", storable_text(f"curl error {answer.error_code}: {answer.error}"[:500])


def header_fields(lines: list[bytes]) -> list[tuple[bytes, bytes]]:
    """The (name, value) fields of the final answer among every header line libcurl read: those
    after the last status line, up to the blank line that ends them. An interim answer's (100
    Continue, 103 Early Hints) come before it, a chunked body's trailers after that blank line:
    neither mixes in."""
    start = 0
    for index in range(len(lines) - 1, -1, -1):
        if lines[index].startswith(b"HTTP/"):
            start = index + 1
            break
    fields: list[tuple[bytes, bytes]] = []
    for line in lines[start:]:
        if not line.strip():
            break
        if line[:1] in (b" ", b"\t") and fields:  # a folded line goes on the field before it
            name, value = fields[-1]
            fields[-1] = (name, value + b" " + line.strip())
            continue
        name, _, value = line.partition(b":")
        fields.append((name.strip(), value.strip()))
    return fields


def _retry_after(status: int, fields: list[tuple[bytes, bytes]]) -> float | None:
    value = None
    for name, text in fields:
        if name.lower() == b"retry-after":
            value = text.decode("latin-1")
    return retry_after_of(status, value)
