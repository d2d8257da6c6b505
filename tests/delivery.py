"""Push deliveries in the test process: a consumer on the loopback receiver, and the dispatcher's
steps (claim, deliver, record) run once, as its loop runs them (docs/dispatcher.md).

The `channel` and `dispatcher` fixtures that go with them are in tests/conftest.py.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from broker.models import Channel
from consumers.models import Consumer
from jobs.delivery import AttemptResult, DeliveryRequest, open_sender
from jobs.dispatch import Dispatcher
from tests.helpers import make_consumer


def push_consumer(channel: Channel, receiver, name="billing", path="/hook", **fields) -> Consumer:
    """A push consumer of `channel` whose callback is `path` on `receiver`, with `fields` set."""
    consumer = make_consumer(channel, name)
    consumer.callback_url = receiver.url(path)
    for field_name, value in fields.items():
        setattr(consumer, field_name, value)
    consumer.save()
    return consumer


def send(
    requests: list[DeliveryRequest],
    timeout: float = 2.0,
    on_sent: Callable[[], None] | None = None,
) -> list[AttemptResult]:
    """Deliver claimed requests concurrently over the dispatcher's sender, as its loop does."""

    async def all_of_them() -> list[AttemptResult]:
        async with open_sender(len(requests) or 1) as sender:
            sends = (sender(request, timeout, on_sent) for request in requests)
            return list(await asyncio.gather(*sends))

    return asyncio.run(all_of_them())


def run_once(
    dispatcher: Dispatcher,
    limit: int = 100,
    timeout: float = 2.0,
    on_sent: Callable[[], None] | None = None,
) -> list[AttemptResult]:
    """One dispatcher step: claim up to `limit` due jobs, deliver them, record the outcomes."""
    results = send(dispatcher.claim(limit), timeout, on_sent)
    dispatcher.complete(results)
    return results
