"""The operator UI's "send test event": one signed delivery of a small JSON payload to a push
consumer's callback URL, made synchronously while the operator waits.

It goes the way every webhook goes: jobs/outgoing.py builds the request (broker headers, consumer
token, Standard Webhooks signatures with every active secret, jobs/signing.py) and the
dispatcher's sender sends it (jobs/delivery.py's `open_sender`: the address guard, no redirects,
a response excerpt), with BROKER_DELIVERY_TIMEOUT_SECONDS capped at 10 s. So a test that passes
says that deliveries will pass, signatures included.

A test event is not a channel message: it creates no Message, Job or DeliveryAttempt, counts in
no statistics, and neither opens nor closes the consumer's circuit. The operator sees the outcome;
the log gets one line without the URL (its query may carry a token) or any secret.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import uuid
from datetime import datetime

from django.utils import timezone

from broker.conf import broker_settings
from consumers.models import Consumer
from jobs.delivery import AttemptResult, DeliveryRequest, open_sender
from jobs.outgoing import build_request
from jobs.queue import OutgoingMessage

logger = logging.getLogger(__name__)

CONTENT_TYPE = "application/json"
EVENT_TYPE = "broker.test"
# The operator's request waits for the answer: stay well inside web servers' worker timeouts
# (gunicorn kills a worker after 30 s by default), even when deliveries may take longer.
MAX_TIMEOUT_SECONDS = 10
# Lets a receiver acknowledge a test without acting on it; deliveries of messages never carry it.
TEST_EVENT_HEADER = "X-Broker-Test-Event"


class NotPushConsumer(ValueError):
    """Test events are pushed; a pull consumer has no callback the broker calls."""


def event_payload(consumer: Consumer, event_id: str, now: datetime) -> bytes:
    body = {
        "type": EVENT_TYPE,
        "id": event_id,
        "channel": consumer.channel_id,
        "consumer": consumer.public_id,
        "sentAt": now.isoformat(),
    }
    return json.dumps(body).encode()


def build_test_request(consumer: Consumer, now: datetime) -> DeliveryRequest:
    """The request a delivery of a test payload would make, built by the dispatcher itself."""
    event_id = f"test-{uuid.uuid4().hex}"
    payload = event_payload(consumer, event_id, now)
    message = OutgoingMessage(event_id, payload, "", CONTENT_TYPE, 0, {}, event_type=EVENT_TYPE)
    request = build_request(message, consumer, now)  # of no job: nothing is recorded
    return dataclasses.replace(request, headers={**request.headers, TEST_EVENT_HEADER: "true"})


def send_test_event(consumer: Consumer, *, sent_by: str = "") -> AttemptResult:
    """Deliver a test event to a push consumer and describe what happened; never raises for a
    delivery failure (the result says what it was). Blocks for up to the delivery timeout, at
    most MAX_TIMEOUT_SECONDS."""
    if consumer.is_pull:
        raise NotPushConsumer("Test events are push deliveries; pull consumers fetch their jobs.")
    timeout = float(min(broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS, MAX_TIMEOUT_SECONDS))
    result = asyncio.run(_deliver_once(build_test_request(consumer, timezone.now()), timeout))
    logger.info(
        "test event to %s by %s: status=%s error_class=%s duration_ms=%.1f",
        consumer,
        sent_by or "-",
        result.status_code,
        result.error_class or "-",
        result.duration_ms,
    )
    return result


async def _deliver_once(request: DeliveryRequest, timeout: float) -> AttemptResult:
    async with open_sender(1) as send:
        return await send(request, timeout, None)
