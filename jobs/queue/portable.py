"""The queue through the ORM, for SQLite: the operations of jobs/queue/postgres.py, with the same
rules (jobs/queue/rules.py), in a few statements each.

SQLite has one writer at a time and no SKIP LOCKED: each operation is one transaction, and the
state machine's conditional UPDATE says which caller won a job or a message.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime

from django.db import transaction
from django.db.models import Count, F

from broker.message_states import SCHEDULED, status_after_fanout
from broker.models import Channel, Message, Producer
from consumers.models import Consumer
from jobs.delivery import AttemptResult
from jobs.models import DeliveryAttempt, Job
from jobs.queue.circuit import close_circuits
from jobs.queue.fanout import add_jobs, new_jobs
from jobs.queue.outcomes import attempt_row, by_keys, still_ours
from jobs.queue.portable_pull import PortablePullOperations
from jobs.queue.rules import (
    bookable_slots,
    first_free_slot,
    heads_of_their_keys,
    in_flight_cap,
    producer_may_publish,
    push_lease_expiry,
    receiving_push_consumers,
    slot_times,
    subscribed_consumer_ids,
)
from jobs.queue.types import (
    CLAIM_COLUMNS,
    ClaimedJob,
    ClaimRooms,
    Inserted,
    InsertedBatch,
    MessageBatch,
    NewMessage,
    TokenDigests,
)
from jobs.states import DELIVERED, INFLIGHT, QUEUED


class PortableQueue(PortablePullOperations):
    """jobs/queue's operations on any database Django supports."""

    concurrent_writers = False  # one writer at a time: outcomes are recorded between claims

    async def listen(self, wake: Callable[[], None], dispatcher_id: str) -> None:
        """No notifications without PostgreSQL: dispatchers poll."""
        await asyncio.Event().wait()

    def reclaim_from_dead_dispatchers(self, dispatcher_id: str, now: datetime) -> int:
        """No sessions to look at: a dead dispatcher's jobs wait for their leases."""
        return 0

    def insert_message(self, message: Message, tokens: TokenDigests | None = None) -> Inserted:
        channel_hash = _token_hash(Channel, message.channel_id)
        producer_hash = _token_hash(Producer, message.producer_id)
        if channel_hash is None or producer_hash is None:
            return Inserted(channel_hash is not None, producer_hash is not None)
        matched = not tokens or tokens.match(channel_hash, producer_hash)
        allowed = producer_may_publish(message.producer_id, message.channel_id)
        if not (matched and allowed):
            return Inserted(True, True, tokens_matched=matched, producer_allowed=allowed)
        consumer_ids = subscribed_consumer_ids(
            _consumers_of(message.channel_id), message.event_type
        )
        message.status = status_after_fanout(bool(consumer_ids))
        message.dispatched_at = message.received_at if consumer_ids else None
        # The message insert is the block's first write: a duplicate ID fails before anything
        # else happened, and rolling the block back leaves a caller's own work intact.
        with transaction.atomic():
            message.save(force_insert=True)
            add_jobs(message, consumer_ids, message.received_at)
        return Inserted(True, True)

    def insert_messages(self, batch: MessageBatch) -> InsertedBatch:
        channel_found = Channel.objects.filter(pk=batch.channel_id).exists()
        producer_found = Producer.objects.filter(pk=batch.producer_id).exists()
        if not (channel_found and producer_found):
            return InsertedBatch(channel_found, producer_found, [])
        if not producer_may_publish(batch.producer_id, batch.channel_id):
            return InsertedBatch(True, True, [], producer_allowed=False)
        consumers = _consumers_of(batch.channel_id)
        fanouts = [subscribed_consumer_ids(consumers, m.event_type) for m in batch.messages]
        rows = [
            _message_row(batch, message, bool(consumer_ids))
            for message, consumer_ids in zip(batch.messages, fanouts, strict=True)
        ]
        # One block: a duplicate ID rolls back every message of the batch, and only them.
        with transaction.atomic():
            Message.objects.bulk_create(rows)  # in the batch's order, keys set (RETURNING)
            Job.objects.bulk_create(
                job
                for row, consumer_ids in zip(rows, fanouts, strict=True)
                if row.scheduled_for is None
                for job in new_jobs(row, consumer_ids, batch.received_at)
            )
        return InsertedBatch(True, True, [row.pk for row in rows])

    def release_due_messages(self, now: datetime, limit: int) -> int:
        with transaction.atomic():
            due = list(
                Message.objects.filter(status=SCHEDULED, scheduled_for__lte=now)
                .order_by("scheduled_for", "pk")
                .only("pk", "channel_id", "priority", "ordering_key", "event_type")[:limit]
            )
            consumers: dict[str, list[tuple[int, list[str]]]] = {}
            for channel_id, consumer_id, patterns in (
                Consumer.objects.filter(channel_id__in={message.channel_id for message in due})
                .order_by("pk")
                .values_list("channel_id", "pk", "event_types")
            ):
                consumers.setdefault(channel_id, []).append((consumer_id, patterns))
            return sum(
                _release_one(
                    message,
                    subscribed_consumer_ids(
                        consumers.get(message.channel_id, []), message.event_type
                    ),
                    now,
                )
                for message in due
            )

    def claim_for_push(
        self, limit: int, now: datetime, rooms: ClaimRooms, dispatcher_id: str | None
    ) -> list[ClaimedJob]:
        with transaction.atomic():
            room = _consumer_room(now, rooms)
            taken = _due_jobs(room, limit, now)
            ids = [pk for pk, _ in taken]
            Job.objects.filter(pk__in=ids).transition(
                QUEUED,
                INFLIGHT,
                attempts=F("attempts") + 1,
                lease_expires_at=push_lease_expiry(now),
                claimed_by=dispatcher_id,
            )
            send_at = _book_slots([c for c in room if c.max_per_second], taken, now)
        rows = Job.objects.filter(pk__in=ids, status=INFLIGHT).values_list(*CLAIM_COLUMNS)
        order = {pk: position for position, pk in enumerate(ids)}  # the claim's, not the scan's
        claimed = sorted(rows, key=lambda row: order[row[0]])
        return [replace(ClaimedJob.from_row(row), send_at=send_at.get(row[0])) for row in claimed]

    def record_deliveries(
        self, results: list[AttemptResult], dispatcher_id: str, now: datetime
    ) -> None:
        present = set(
            by_keys((r.job_id, r.partition_at) for r in results).values_list("pk", flat=True)
        )
        DeliveryAttempt.objects.bulk_create(
            attempt_row(r, dispatcher_id) for r in results if r.job_id in present
        )
        for result in results:
            still_ours(result).transition(INFLIGHT, DELIVERED, lease_expires_at=None, last_error="")
        close_circuits({r.consumer_id for r in results})

    def wake_dispatchers(self) -> None:
        """Dispatchers poll the database: nothing to wake."""


def _message_row(batch: MessageBatch, message: NewMessage, has_consumers: bool) -> Message:
    """A batch's message as an unsaved row: SCHEDULED, or what its fan-out makes it."""
    scheduled = message.scheduled_for is not None
    return Message(
        channel_id=batch.channel_id,
        producer_id=batch.producer_id,
        public_id=message.public_id,
        payload=message.payload,
        payload_file=message.payload_file,
        payload_size=message.payload_size,
        content_type=message.content_type,
        priority=message.priority,
        headers=message.headers,
        ordering_key=message.ordering_key,
        event_type=message.event_type,
        status=SCHEDULED if scheduled else status_after_fanout(has_consumers),
        received_at=batch.received_at,
        dispatched_at=batch.received_at if has_consumers and not scheduled else None,
        scheduled_for=message.scheduled_for,
        traceparent=message.traceparent,
        tracestate=message.tracestate,
    )


def _consumers_of(channel_id: str) -> list[tuple[int, list[str]]]:
    """The channel's consumers in ID order, with their event type patterns."""
    return list(
        Consumer.objects.filter(channel_id=channel_id)
        .order_by("pk")
        .values_list("pk", "event_types")
    )


def _release_one(message: Message, consumer_ids: list[int], now: datetime) -> int:
    """A conditional UPDATE says which caller released the message; that one makes its jobs."""
    won = Message.objects.filter(pk=message.pk).transition(
        SCHEDULED,
        status_after_fanout(bool(consumer_ids)),
        dispatched_at=now if consumer_ids else None,
    )
    if won:
        add_jobs(message, consumer_ids, now)
    return won


def _due_jobs(room: dict[Consumer, int], limit: int, now: datetime) -> list[tuple[int, int]]:
    """Per consumer, its due jobs up to its room; then the best `limit` overall, as (job ID,
    consumer ID) in the order they are claimed.

    Looking per consumer keeps a paused consumer's backlog, or a slow consumer at its cap, from
    being scanned or from taking every slot.
    """
    candidates: list[tuple[int, datetime, int, int]] = []
    for consumer, free in room.items():
        due = Job.objects.filter(consumer_id=consumer.pk, status=QUEUED, next_attempt_at__lte=now)
        if consumer.ordering == Consumer.Ordering.ORDERED:
            due = heads_of_their_keys(due)
        candidates += due.order_by("-priority", "next_attempt_at", "pk").values_list(
            "priority", "next_attempt_at", "pk", "consumer_id"
        )[: min(free, limit)]
    candidates.sort(key=lambda row: (-row[0], row[1], row[2]))
    return [(pk, consumer_id) for _, _, pk, consumer_id in candidates[:limit]]


def _consumer_room(now: datetime, rooms: ClaimRooms) -> dict[Consumer, int]:
    """How many more jobs each push consumer that may receive can be handed now: its free
    in-flight slots, no more than the dispatcher's room for it (its budget for new consumers
    is PostgreSQL's alone), and for a rate-limited one no more than the slots it can book."""
    consumers = receiving_push_consumers(now)
    in_flight = dict(
        Job.objects.filter(status=INFLIGHT, consumer__in=consumers)
        .values("consumer")
        .annotate(n=Count("pk"))
        .values_list("consumer", "n")
    )
    room = {}
    for consumer in consumers.only(
        "ordering", "max_in_flight", "circuit_open_until", "max_per_second", "next_slot_at"
    ):
        free = in_flight_cap(consumer) - in_flight.get(consumer.pk, 0)
        free = min(free, rooms.rooms.get(consumer.pk, rooms.new_room))
        if consumer.max_per_second:
            first_slot = first_free_slot(consumer.next_slot_at, now)
            free = min(free, bookable_slots(first_slot, consumer.max_per_second, now))
        if free > 0:
            room[consumer] = free
    return room


def _book_slots(
    paced: list[Consumer], taken: list[tuple[int, int]], now: datetime
) -> dict[int, datetime]:
    """The send times of the rate-limited consumers' jobs just taken (rules.slot_times), by job
    ID, and each consumer's next free slot moved past them."""
    send_at: dict[int, datetime] = {}
    for consumer in paced:
        jobs = [pk for pk, owner in taken if owner == consumer.pk]
        if not jobs or consumer.max_per_second is None:
            continue
        first_slot = first_free_slot(consumer.next_slot_at, now)
        *slots, next_slot = slot_times(first_slot, consumer.max_per_second, len(jobs) + 1)
        send_at.update(zip(jobs, slots, strict=True))
        Consumer.objects.filter(pk=consumer.pk).update(next_slot_at=next_slot)
    return send_at


def _token_hash(model: type[Channel] | type[Producer], pk: str) -> str | None:
    """The stored token digest of the channel or producer `pk`; None when there is none."""
    return model.objects.filter(pk=pk).values_list("token_hash", flat=True).first()
