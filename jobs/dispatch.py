"""The push dispatcher (SPEC §5): claims due jobs, delivers them concurrently, records outcomes.

Database work happens in small synchronous steps (`claim`, `complete`, `sweep`, `beat`,
`release`), each one short transaction, run one at a time in a single worker thread; deliveries run
concurrently on an asyncio loop with one keep-alive connection pool. No transaction or row lock is
ever held across an HTTP request. Tests drive the steps directly, never the loop.

Any number of dispatchers can share one database: a claim takes rows with FOR UPDATE SKIP LOCKED
and moves them with the state machine's conditional UPDATE, so no job is taken twice. A job's
attempt is counted when it is claimed, before anything is sent: a message that crashes every
dispatcher still runs out of attempts and ends DEAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aiohttp
from asgiref.sync import sync_to_async
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Count, F
from django.utils import timezone

import broker
from broker.conf import broker_settings
from consumers.models import Consumer
from consumers.safety import SafeResolver
from jobs.delivery import AttemptResult, DeliveryRequest, deliver
from jobs.leases import sweep_expired_leases
from jobs.metrics import DELIVERIES, DELIVERY_SECONDS
from jobs.models import DeliveryAttempt, DispatcherHeartbeat, Job
from jobs.retry import Outcome, Verdict, decide
from jobs.signing import signature_headers
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, check_transition

logger = logging.getLogger(__name__)
T = TypeVar("T")

USER_AGENT = f"webhook-broker-django/{broker.__version__}"
DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER = 100
HOUSEKEEPING_SECONDS = 5.0  # heartbeat and lease sweep
SHUTDOWN_MESSAGE = "dispatcher stopped before the consumer answered"


@dataclass
class DispatcherConfig:
    concurrency: int = 128  # deliveries in flight in this process
    batch_size: int = 100  # jobs taken per claim
    poll_seconds: float = 1.0  # longest idle wait when no NOTIFY arrives
    grace_seconds: float = 10.0  # on SIGTERM, how long in-flight deliveries may finish
    dispatcher_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )


class Dispatcher:
    def __init__(self, config: DispatcherConfig | None = None) -> None:
        self.config = config or DispatcherConfig()
        self.started_at = timezone.now()
        self.delivered = self.failed = 0
        self.stopping = False
        self._wake = asyncio.Event()
        self._sent: set[int] = set()  # job IDs whose request headers are on the wire

    # --- database steps: synchronous, one short transaction each ---------------------------

    def claim(self, limit: int) -> list[DeliveryRequest]:
        """Take up to `limit` due jobs of push consumers that may receive, and build requests."""
        now = timezone.now()
        with transaction.atomic():
            ids = self._due_job_ids(limit, now)
            Job.objects.filter(pk__in=ids).transition(
                QUEUED,
                INFLIGHT,
                attempts=F("attempts") + 1,
                lease_expires_at=now + _lease(),
            )
        jobs = list(
            Job.objects.filter(pk__in=ids, status=INFLIGHT)
            .select_related("message")
            .order_by("-priority", "next_attempt_at")
        )
        # Once per consumer, not per job: loading one decrypts its token and secrets.
        consumers = Consumer.objects.in_bulk({job.consumer_id for job in jobs})
        return [_request(job, consumers[job.consumer_id], now) for job in jobs]

    def _due_job_ids(self, limit: int, now: datetime) -> list[int]:
        """Per consumer, its due jobs up to its in-flight room; then the best `limit` overall.

        Looking per consumer keeps a paused consumer's backlog, or a slow consumer at its cap,
        from being scanned or from taking every slot.
        """
        candidates: list[tuple[int, datetime, int]] = []
        for consumer_id, room in self._consumer_room().items():
            candidates += (
                Job.objects.select_for_update(skip_locked=True)
                .filter(consumer_id=consumer_id, status=QUEUED, next_attempt_at__lte=now)
                .order_by("-priority", "next_attempt_at")
                .values_list("priority", "next_attempt_at", "pk")[: min(room, limit)]
            )
        candidates.sort(key=lambda row: (-row[0], row[1]))
        return [pk for _, _, pk in candidates[:limit]]

    def _consumer_room(self) -> dict[int, int]:
        """How many more jobs each receiving push consumer may have in flight."""
        caps = dict(
            Consumer.objects.filter(type=Consumer.Type.PUSH, paused=False).values_list(
                "pk", "max_in_flight"
            )
        )
        # Counted through the partial index on INFLIGHT rows, never a join over all jobs.
        in_flight = dict(
            Job.objects.filter(status=INFLIGHT, consumer_id__in=caps)
            .values("consumer")
            .annotate(n=Count("pk"))
            .values_list("consumer", "n")
        )
        room = {
            pk: (cap or DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER) - in_flight.get(pk, 0)
            for pk, cap in caps.items()
        }
        return {pk: free for pk, free in room.items() if free > 0}

    def complete(self, results: Iterable[AttemptResult]) -> None:
        """Record attempts and move their jobs on, in one transaction for the whole batch."""
        results = list(results)
        if not results:
            return
        now = timezone.now()
        consumer_of = dict(
            Job.objects.filter(pk__in=[r.job_id for r in results]).values_list("pk", "consumer")
        )
        # Only what the retry policy reads: no secret is decrypted to record an outcome.
        policies = Consumer.objects.only("retry_delays", "non_retryable_statuses").in_bulk(
            set(consumer_of.values())
        )
        outcomes = {
            r.job_id: decide(r, policies[consumer_of[r.job_id]], now)
            for r in results
            if r.job_id in consumer_of
        }
        recorded = [r for r in results if r.job_id in consumer_of]  # not deleted meanwhile
        delivered = [r for r in recorded if outcomes[r.job_id].verdict is Verdict.DELIVERED]
        failed = [r for r in recorded if outcomes[r.job_id].verdict is not Verdict.DELIVERED]
        with transaction.atomic():
            _record_deliveries(delivered, self.config.dispatcher_id)
            DeliveryAttempt.objects.bulk_create(
                _attempt_row(result, self.config.dispatcher_id) for result in failed
            )
            self._apply({r.job_id: outcomes[r.job_id] for r in failed})
        for result in results:
            DELIVERY_SECONDS.observe(result.duration_ms / 1000)
        for outcome in outcomes.values():
            DELIVERIES.labels(outcome.verdict.value).inc()
        self.delivered += sum(o.verdict is Verdict.DELIVERED for o in outcomes.values())
        self.failed += sum(o.verdict is not Verdict.DELIVERED for o in outcomes.values())

    def _apply(self, outcomes: dict[int, Outcome]) -> None:
        """Failed attempts: each job to QUEUED at its own due time, or DEAD."""
        for pk, outcome in outcomes.items():
            if outcome.verdict is Verdict.RETRY:
                Job.objects.filter(pk=pk).transition(
                    INFLIGHT,
                    QUEUED,
                    next_attempt_at=outcome.due_at,
                    lease_expires_at=None,
                    last_error=outcome.reason,
                )
            elif outcome.verdict is Verdict.DEAD:
                Job.objects.filter(pk=pk).transition(
                    INFLIGHT, DEAD, lease_expires_at=None, last_error=outcome.reason
                )
            if outcome.pause_consumer:
                Consumer.objects.filter(jobs__pk=pk).update(paused=True)

    def release(self, job_ids: Iterable[int]) -> int:
        """Give claimed jobs that were never sent back to the queue, without using an attempt."""
        return Job.objects.filter(pk__in=list(job_ids)).transition(
            INFLIGHT,
            QUEUED,
            attempts=F("attempts") - 1,
            lease_expires_at=None,
            next_attempt_at=timezone.now(),
        )

    def sweep(self) -> int:
        return sweep_expired_leases()

    def beat(self, in_flight: int = 0) -> None:
        DispatcherHeartbeat.objects.update_or_create(
            dispatcher_id=self.config.dispatcher_id,
            defaults={
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": self.started_at,
                "last_beat_at": timezone.now(),
                "in_flight": in_flight,
                "delivered": self.delivered,
                "failed": self.failed,
            },
        )

    def retire(self) -> None:
        DispatcherHeartbeat.objects.filter(dispatcher_id=self.config.dispatcher_id).delete()

    # --- the loop ------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming (signal handlers call this); the loop then drains and exits."""
        self.stopping = True
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        connector = aiohttp.TCPConnector(limit=self.config.concurrency, resolver=SafeResolver())
        async with aiohttp.ClientSession(
            connector=connector, trace_configs=[self._trace()]
        ) as session:
            await self._loop(session)

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        in_flight: dict[asyncio.Task[AttemptResult], DeliveryRequest] = {}
        finished: list[AttemptResult] = []  # kept until recorded, across database outages
        next_housekeeping = 0.0
        loop = asyncio.get_running_loop()
        while not self.stopping or in_flight or finished:
            try:
                if loop.time() >= next_housekeeping and not self.stopping:
                    await self._db(self.beat, len(in_flight))
                    await self._db(self.sweep)
                    next_housekeeping = loop.time() + HOUSEKEEPING_SECONDS
                room = self.config.concurrency - len(in_flight)
                if not self.stopping and room > 0:
                    claimed = await self._db(self.claim, min(room, self.config.batch_size))
                    for request in claimed:
                        task = asyncio.create_task(self._send(session, request))
                        task.add_done_callback(lambda _: self._wake.set())
                        in_flight[task] = request
                done = [task for task in in_flight if task.done()]
                for task in done:
                    finished.append(task.result())
                    del in_flight[task]
                if finished:
                    await self._db(self.complete, finished)
                    finished = []
            except DatabaseDown:
                await asyncio.sleep(self.config.poll_seconds)
                continue
            if self.stopping and in_flight:
                await self._drain(in_flight, finished)
            else:
                await self._idle(busy=bool(done) or room <= 0)
        with contextlib.suppress(DatabaseDown):
            await self._db(self.retire)

    async def _send(
        self, session: aiohttp.ClientSession, request: DeliveryRequest
    ) -> AttemptResult:
        timeout = float(broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS)
        try:
            return await deliver(
                session, request, timeout, trace_context={"job_id": request.job_id}
            )
        finally:
            self._sent.discard(request.job_id)

    def _trace(self) -> aiohttp.TraceConfig:
        """Note which requests have put their headers on the wire (see `_drain`)."""
        trace = aiohttp.TraceConfig()

        async def headers_sent(session: Any, context: Any, params: Any) -> None:
            self._sent.add(context.trace_request_ctx["job_id"])

        trace.on_request_headers_sent.append(headers_sent)
        return trace

    async def _idle(self, busy: bool) -> None:
        """Wait for a finished delivery, a NOTIFY or the poll interval."""
        if busy:
            await asyncio.sleep(0)  # let finished deliveries be collected right away
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.config.poll_seconds)
        self._wake.clear()

    async def _drain(
        self,
        in_flight: dict[asyncio.Task[AttemptResult], DeliveryRequest],
        finished: list[AttemptResult],
    ) -> None:
        """On shutdown: let deliveries finish within the grace period, then cut them off.

        A cut-off request whose headers went out may have reached the consumer: that counts as
        an attempt and is retried by the policy. One that never got that far goes back to the
        queue without using an attempt.
        """
        done, pending = await asyncio.wait(in_flight, timeout=self.config.grace_seconds)
        finished += [task.result() for task in done]
        unsent = []
        for task in pending:
            task.cancel()
            request = in_flight[task]
            if request.job_id in self._sent:
                finished.append(_cut_off(request))
            else:
                unsent.append(request.job_id)
        if unsent:
            await self._db(self.release, unsent)
        in_flight.clear()

    async def _db(self, step: Callable[..., T], *args: Any) -> T:
        """Run a database step in the one database thread.

        On a lost connection the connection is dropped, so that the next step reconnects, and
        DatabaseDown is raised: the loop skips that pass. Claimed jobs stay INFLIGHT until their
        lease expires; finished results stay in memory and are recorded on a later pass.
        """
        try:
            return await sync_to_async(step, thread_sensitive=True)(*args)
        except (OperationalError, InterfaceError) as exc:
            logger.warning("database unavailable during %s: %s", step.__name__, type(exc).__name__)
            await sync_to_async(_drop_connection, thread_sensitive=True)()
            raise DatabaseDown from exc


class DatabaseDown(Exception):
    pass


def _cut_off(request: DeliveryRequest) -> AttemptResult:
    return AttemptResult(
        request.job_id,
        request.attempt,
        timezone.now(),
        0.0,
        error_class="shutdown",
        error=SHUTDOWN_MESSAGE,
    )


def _drop_connection() -> None:
    connection.close()


def _lease() -> timedelta:
    seconds = (
        broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS
        + broker_settings.BROKER_RATIONAL_DELAY_SECONDS
    )
    return timedelta(seconds=seconds)


def _request(job: Job, consumer: Consumer, now: datetime) -> DeliveryRequest:
    """The HTTP request for one claimed job: payload, broker headers, metadata, signatures."""
    message = job.message
    payload = bytes(message.payload)
    headers = {
        "Content-Type": message.content_type,
        "X-Broker-Message-ID": message.public_id,
        "X-Broker-Message-Priority": str(message.priority),
        "X-Broker-Channel-ID": consumer.channel_id,
        "X-Broker-Consumer-ID": consumer.public_id,
        broker_settings.BROKER_CONSUMER_TOKEN_HEADER: consumer.token,
        "X-Request-ID": uuid.uuid4().hex,
        "User-Agent": USER_AGENT,
        **signature_headers(consumer, message.public_id, payload, now),
    }
    metadata = _metadata(message.headers, reserved={name.lower() for name in headers})
    if metadata:
        headers.update(metadata)
        headers["X-Broker-Metadata-Headers"] = ",".join(metadata)
    return DeliveryRequest(job.pk, job.attempts, consumer.callback_url, headers, payload)


# Framing headers aiohttp computes; a replayed one would corrupt the request.
FRAMING_HEADERS = {"host", "content-length", "transfer-encoding", "connection"}


def _metadata(kept: dict[str, str], reserved: set[str]) -> dict[str, str]:
    """The producer's kept headers, minus any that would shadow the broker's own (any case)."""
    return {
        name: value
        for name, value in kept.items()
        if name.lower() not in reserved | FRAMING_HEADERS
        and not name.lower().startswith(("x-broker-", "webhook-"))
    }


# The common case, 2xx answers: their attempt rows and their jobs' move to DELIVERED in one
# statement, one round trip for the whole batch. Only jobs still INFLIGHT move: one whose lease
# expired and was swept meanwhile is left to its new holder (its duplicate delivery is the
# at-least-once price); its attempt is recorded all the same.
_RECORD_DELIVERIES_SQL = f"""
WITH attempt AS (
    INSERT INTO {DeliveryAttempt._meta.db_table} (job_id, attempt_number, started_at,
        duration_ms, status_code, error_class, response_excerpt, dispatcher_id)
    SELECT job_id, attempt_number, started_at, duration_ms, status_code, '', excerpt, %(dispatcher)s
    FROM unnest(%(jobs)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[],
        %(durations)s::float8[], %(statuses)s::smallint[], %(excerpts)s::text[])
        AS result(job_id, attempt_number, started_at, duration_ms, status_code, excerpt)
)
UPDATE {Job._meta.db_table}
SET status = %(delivered)s, status_changed_at = %(now)s, lease_expires_at = NULL, last_error = ''
WHERE id = ANY(%(jobs)s::bigint[]) AND status = %(inflight)s
"""  # noqa: S608 (table names from model metadata; every value a parameter)


def _record_deliveries(results: list[AttemptResult], dispatcher_id: str) -> None:
    if not results:
        return
    if connection.vendor != "postgresql":  # SQLite: the same through the ORM
        DeliveryAttempt.objects.bulk_create(_attempt_row(r, dispatcher_id) for r in results)
        Job.objects.filter(pk__in=[r.job_id for r in results]).transition(
            INFLIGHT, DELIVERED, lease_expires_at=None, last_error=""
        )
        return
    check_transition(INFLIGHT, DELIVERED)
    with connection.cursor() as cursor:
        cursor.execute(
            _RECORD_DELIVERIES_SQL,
            {
                "dispatcher": dispatcher_id,
                "jobs": [r.job_id for r in results],
                "attempts": [r.attempt for r in results],
                "started": [r.started_at for r in results],
                "durations": [r.duration_ms for r in results],
                "statuses": [r.status_code for r in results],
                "excerpts": [r.response_excerpt for r in results],
                "delivered": DELIVERED.value,
                "inflight": INFLIGHT.value,
                "now": timezone.now(),
            },
        )


def _attempt_row(result: AttemptResult, dispatcher_id: str) -> DeliveryAttempt:
    return DeliveryAttempt(
        job_id=result.job_id,
        attempt_number=result.attempt,
        started_at=result.started_at,
        duration_ms=result.duration_ms,
        status_code=result.status_code,
        error_class=result.error_class,
        response_excerpt=result.response_excerpt,
        dispatcher_id=dispatcher_id,
    )
