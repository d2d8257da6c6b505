"""The one place that chooses what sends webhooks (BROKER_DISPATCH_HTTP_CLIENT): the dispatcher, the
UI's test events and the tests all open their sender here.

Both clients keep the same guarantees (docs/dispatcher.md: the address guard on the address really
connected to, no redirects, no cookies or credentials shared between requests, no decompression,
a total timeout, a bounded read of the answer, keep-alive, offloaded payloads streamed, the
"request sent" signal), and the same tests run against both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from broker.conf import broker_settings
from jobs.delivery import AttemptResult, DeliveryRequest, Post, deliver

# Delivers one request within a timeout, calling `on_sent` as it goes on the wire; never raises.
Send = Callable[
    [DeliveryRequest, float, Callable[[], None] | None], Coroutine[Any, Any, AttemptResult]
]


@asynccontextmanager
async def open_sender(concurrency: int) -> AsyncIterator[Send]:
    """Delivers over the configured client, up to `concurrency` requests at a time."""
    async with _client_post(concurrency) as post:

        async def send(
            request: DeliveryRequest, timeout: float, on_sent: Callable[[], None] | None = None
        ) -> AttemptResult:
            return await deliver(post, request, timeout, on_sent)

        yield send


def _client_post(concurrency: int) -> AbstractAsyncContextManager[Post]:
    # Imported here: a process runs one of the two clients, and needs only its library.
    if broker_settings.BROKER_DISPATCH_HTTP_CLIENT == "aiohttp":
        from jobs.aiohttp_delivery import aiohttp_post

        return aiohttp_post(concurrency)
    from jobs.curl_delivery import curl_post

    return curl_post(concurrency)
