"""The HTTP request that delivers a message to a push consumer: body, broker headers, the
producer's metadata, trace context and Standard Webhooks signatures.

Built the same way for a claimed job (jobs/dispatch.py) and for the operator's test event
(jobs/test_event.py), so that a test event that passes says that deliveries will pass.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from datetime import UTC, datetime

import broker
from broker import tracing
from broker.conf import broker_settings
from broker.publishing import is_refused_metadata_header
from broker.xids import new_xid
from consumers.models import Consumer
from jobs.delivery import DeliveryNames, DeliveryRequest, StoredBody
from jobs.models import job_public_id
from jobs.queue import ClaimedJob, OutgoingMessage
from jobs.signing import chunked_signature_headers, signature_headers

USER_AGENT = f"webhook-broker-django/{broker.__version__}"
# A test event's request is of no job, so of no job's time partition either: its result is never
# recorded.
NO_JOB_PARTITION = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class Delivery:
    """What a request is a delivery of: a claimed job's attempt, or nothing (a test event)."""

    job_id: int = 0
    partition_at: datetime = NO_JOB_PARTITION
    attempt: int = 1
    job_public_id: str = ""


def request_for_job(job: ClaimedJob, consumer: Consumer, now: datetime) -> DeliveryRequest:
    """The request of one claimed job's attempt, sent no earlier than the job's slot."""
    request = build_request(job.message, consumer, now, _delivery_of(job))
    return replace(request, send_at=job.send_at)


def build_request(
    message: OutgoingMessage, consumer: Consumer, now: datetime, delivery: Delivery = Delivery()
) -> DeliveryRequest:
    """The HTTP request that delivers `message` to `consumer`, signed at `now`.

    An offloaded payload (docs/delivery.md, "Large payloads") is not read here, on the claiming
    thread: `deliver` reads, signs and streams it when it sends the request.
    """
    stored = _stored_body(message, consumer) if message.payload_file else None
    trace = tracing.parse(message.traceparent, message.tracestate)
    headers = _broker_headers(message, consumer)
    if stored is None:
        headers.update(signature_headers(consumer, message.message_id, message.payload, now))
    reserved = {name.lower() for name in headers}
    if trace or tracing.enabled():
        # The trace context is the broker's to send (the message's, or the attempt's span's,
        # which `deliver` puts in): kept metadata of those names never goes with it.
        headers.update(trace.headers() if trace else {})
        reserved |= {tracing.TRACEPARENT, tracing.TRACESTATE}
    metadata = _metadata(message.headers, reserved=reserved)
    headers.update(metadata)
    # Always sent, the names sorted, empty when there are none: as webhook-broker sends it.
    headers["X-Broker-Metadata-Headers"] = ",".join(sorted(metadata))
    return DeliveryRequest(
        delivery.job_id,
        delivery.partition_at,
        delivery.attempt,
        consumer.pk,
        consumer.callback_url,
        headers,
        message.payload,
        stored,
        names=delivery_names(delivery, message, consumer, trace),
        trace=trace,
    )


def delivery_names(
    delivery: Delivery,
    message: OutgoingMessage,
    consumer: Consumer | None,
    trace: tracing.TraceContext | None,
) -> DeliveryNames:
    """The public IDs a delivery's log line and span name it by."""
    return DeliveryNames(
        delivery.job_public_id,
        message.message_id,
        consumer.channel_id if consumer else "",
        consumer.public_id if consumer else "",
        trace.trace_id if trace else "",
    )


def names_of_job(job: ClaimedJob, consumer: Consumer | None) -> DeliveryNames:
    """The names of a claimed job whose request could not be made."""
    trace = tracing.parse(job.message.traceparent, job.message.tracestate)
    return delivery_names(_delivery_of(job), job.message, consumer, trace)


def _delivery_of(job: ClaimedJob) -> Delivery:
    return Delivery(
        job.job_id, job.partition_at, job.attempt, job_public_id(job.job_id, job.created_at)
    )


def _broker_headers(message: OutgoingMessage, consumer: Consumer) -> dict[str, str]:
    return {
        "Content-Type": message.content_type,
        "X-Broker-Message-ID": message.message_id,
        "X-Broker-Message-Priority": str(message.priority),
        "X-Broker-Channel-ID": consumer.channel_id,
        "X-Broker-Consumer-ID": consumer.public_id,
        broker_settings.BROKER_CONSUMER_TOKEN_HEADER: consumer.token,
        "X-Request-ID": new_xid(),  # new per attempt, an xid as webhook-broker's
        "User-Agent": broker_settings.BROKER_DELIVERY_USER_AGENT or USER_AGENT,
        **({"X-Broker-Event-Type": message.event_type} if message.event_type else {}),
    }


def _stored_body(message: OutgoingMessage, consumer: Consumer) -> StoredBody:
    sign = functools.partial(chunked_signature_headers, consumer, message.message_id)
    return StoredBody(message.payload_file, sign)


def _metadata(kept: dict[str, str], reserved: set[str]) -> dict[str, str]:
    """The producer's kept headers, minus any that would shadow the broker's own (any case),
    such as Content-Type and User-Agent.

    Headers that are never safe to send are refused at publish and never stored
    (broker/publishing.py); the same rule drops any that reached the table another way (a
    restored backup, a bulk load in SQL), which would otherwise fail every attempt.
    """
    return {
        name: value
        for name, value in kept.items()
        if name.lower() not in reserved and not is_refused_metadata_header(name)
    }
