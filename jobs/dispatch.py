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
import functools
import json
import logging
import os
import socket
import uuid
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aiohttp
from django.db import InterfaceError, OperationalError, connection, transaction
from django.db.models import Count, F
from django.utils import timezone

import broker
from broker.conf import broker_settings
from broker.models import Message
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
        self._consumers: dict[int, Consumer] = {}  # decrypted, as of their changed_at
        self._finished: list[AttemptResult] = []  # kept until recorded, across database outages
        # Two database threads (started on first use), each with its own connection, so that
        # recording outcomes never holds up the next claim. SQLite has one writer at a time:
        # there one thread does both.
        self._claimer = ThreadPoolExecutor(1, thread_name_prefix="dispatch-claim")
        self._recorder = self._claimer
        if connection.vendor == "postgresql":
            self._recorder = ThreadPoolExecutor(1, thread_name_prefix="dispatch-record")

    # --- database steps: synchronous, one short transaction each ---------------------------

    def claim(self, limit: int) -> list[DeliveryRequest]:
        """Take up to `limit` due jobs of push consumers that may receive, and build requests."""
        now = timezone.now()
        check_transition(QUEUED, INFLIGHT)
        if connection.vendor == "postgresql":
            claimed = _claim_in_one_statement(limit, now)
        else:
            claimed = _claim_portably(limit, now)
        claimed.sort(key=lambda job: (-job.priority, job.due_at))
        consumers = self._consumers_as_of(claimed)
        return [_request(job, consumers[job.consumer_id], now) for job in claimed]

    def _consumers_as_of(self, claimed: list[ClaimedJob]) -> dict[int, Consumer]:
        """The claimed jobs' consumers, loaded (and their secrets decrypted) only when changed.

        Every change to a consumer moves its `changed_at`, which the claim returns: a new URL or
        a rotated secret applies from the next claim on.
        """
        stale = {
            job.consumer_id
            for job in claimed
            if job.consumer_id not in self._consumers
            or self._consumers[job.consumer_id].changed_at != job.consumer_changed_at
        }
        if stale:
            self._consumers.update(Consumer.objects.in_bulk(stale))
        return self._consumers

    def complete(self, results: Iterable[AttemptResult]) -> None:
        """Record attempts and move their jobs on, in one transaction for the whole batch."""
        results = list(results)
        if not results:
            return
        now = timezone.now()
        outcomes = {r.job_id: decide(r, self._policy(r.consumer_id), now) for r in results}
        delivered = [r for r in results if outcomes[r.job_id].verdict is Verdict.DELIVERED]
        failed = [r for r in results if outcomes[r.job_id].verdict is not Verdict.DELIVERED]
        with transaction.atomic():
            _record_deliveries(delivered, self.config.dispatcher_id, now)
            self._record_failures(failed, outcomes)
        for result in results:
            DELIVERY_SECONDS.observe(result.duration_ms / 1000)
        for outcome in outcomes.values():
            DELIVERIES.labels(outcome.verdict.value).inc()
        self.delivered += len(delivered)
        self.failed += len(failed)

    def _policy(self, consumer_id: int) -> Consumer:
        """The consumer whose retry policy applies: as it was at the claim."""
        if consumer_id not in self._consumers:  # only when a caller completes what it did not claim
            self._consumers.update(Consumer.objects.in_bulk([consumer_id]))
        return self._consumers.get(consumer_id) or Consumer()  # deleted: global defaults

    def _record_failures(self, failed: list[AttemptResult], outcomes: dict[int, Outcome]) -> None:
        """Failed attempts: a row each, then each job QUEUED at its own due time, or DEAD.

        The jobs are locked first, so that one deleted meanwhile (with its consumer) is skipped
        rather than given an attempt row that points nowhere.
        """
        if not failed:
            return
        present = set(
            Job.objects.select_for_update()
            .filter(pk__in=[r.job_id for r in failed])
            .values_list("pk", flat=True)
        )
        failed = [r for r in failed if r.job_id in present]
        DeliveryAttempt.objects.bulk_create(
            _attempt_row(result, self.config.dispatcher_id) for result in failed
        )
        for result in failed:
            _apply(result, outcomes[result.job_id])

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
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                await self._loop(session)
        finally:
            for executor in {self._claimer, self._recorder}:
                await asyncio.get_running_loop().run_in_executor(executor, _drop_connection)
                executor.shutdown()

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        in_flight: dict[asyncio.Task[AttemptResult], DeliveryRequest] = {}
        recording: asyncio.Task[None] | None = None
        next_housekeeping = 0.0
        loop = asyncio.get_running_loop()
        while not self.stopping or in_flight or self._finished or _running(recording):
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
            except DatabaseDown:
                await asyncio.sleep(self.config.poll_seconds)
                continue
            done = [task for task in in_flight if task.done()]
            for task in done:
                self._finished.append(task.result())
                del in_flight[task]
            if self._finished and not _running(recording):
                recording = asyncio.create_task(self._record(self._finished))
                recording.add_done_callback(lambda _: self._wake.set())
                self._finished = []
            if self.stopping and in_flight:
                await self._drain(in_flight)
            else:
                await self._idle(busy=bool(done))
        with contextlib.suppress(DatabaseDown):
            await self._db(self.retire)

    async def _record(self, results: list[AttemptResult]) -> None:
        """Record outcomes in the recording thread while the loop goes on claiming and sending.

        Results that could not be recorded (database down) are kept for a later pass.
        """
        try:
            await self._db(self.complete, results, thread=self._recorder)
        except DatabaseDown:
            self._finished[:0] = results
            await asyncio.sleep(self.config.poll_seconds)

    async def _send(
        self, session: aiohttp.ClientSession, request: DeliveryRequest
    ) -> AttemptResult:
        timeout = float(broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS)
        try:
            # `_drain` needs to know which requests went on the wire.
            return await deliver(session, request, timeout, on_sent=self._sent_marker(request))
        finally:
            self._sent.discard(request.job_id)

    def _sent_marker(self, request: DeliveryRequest) -> Callable[[], None]:
        return lambda: self._sent.add(request.job_id)

    async def _idle(self, busy: bool) -> None:
        """Wait for a finished delivery or recording, a NOTIFY or the poll interval."""
        if busy:
            await asyncio.sleep(0)  # claim again right away: slots were just freed
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), self.config.poll_seconds)
        self._wake.clear()

    async def _drain(self, in_flight: dict[asyncio.Task[AttemptResult], DeliveryRequest]) -> None:
        """On shutdown: let deliveries finish within the grace period, then cut them off.

        A cut-off request whose headers went out may have reached the consumer: that counts as
        an attempt and is retried by the policy. One that never got that far goes back to the
        queue without using an attempt.
        """
        done, pending = await asyncio.wait(in_flight, timeout=self.config.grace_seconds)
        self._finished += [task.result() for task in done]
        unsent = []
        for task in pending:
            task.cancel()
            request = in_flight[task]
            if request.job_id in self._sent:
                self._finished.append(_cut_off(request))
            else:
                unsent.append(request.job_id)
        if unsent:
            await self._db(self.release, unsent)
        in_flight.clear()

    async def _db(
        self, step: Callable[..., T], *args: Any, thread: ThreadPoolExecutor | None = None
    ) -> T:
        """Run a database step in a database thread (the claiming one unless told).

        On a lost connection the connection is dropped, so that the next step reconnects, and
        DatabaseDown is raised: the loop skips that pass. Claimed jobs stay INFLIGHT until their
        lease expires; finished results stay in memory and are recorded on a later pass.
        """
        thread = thread or self._claimer
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(thread, functools.partial(step, *args))
        except (OperationalError, InterfaceError) as exc:
            logger.warning("database unavailable during %s: %s", step.__name__, type(exc).__name__)
            await loop.run_in_executor(thread, _drop_connection)
            raise DatabaseDown from exc


class DatabaseDown(Exception):
    pass


def _running(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()


def _cut_off(request: DeliveryRequest) -> AttemptResult:
    return AttemptResult(
        request.job_id,
        request.attempt,
        request.consumer_id,
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


@dataclass(frozen=True)
class ClaimedJob:
    """What a claim returns for one job: everything its request needs but the consumer."""

    job_id: int
    attempt: int  # the job's attempts, this one included
    priority: int
    due_at: datetime
    consumer_id: int
    consumer_changed_at: datetime
    message_id: str
    payload: bytes
    content_type: str
    message_priority: int
    headers: dict[str, str]

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ClaimedJob:
        """From a row of the fields in order; raw SQL gives memoryview payloads and JSON text
        (Django reads jsonb as text and leaves parsing to JSONField)."""
        *head, payload, content_type, message_priority, headers = row
        if isinstance(headers, str):
            headers = json.loads(headers)
        job_id, attempt, priority, due_at, consumer_id, consumer_changed_at, message_id = head
        return cls(
            job_id,
            attempt,
            priority,
            due_at,
            consumer_id,
            consumer_changed_at,
            message_id,
            bytes(payload),
            content_type,
            message_priority,
            headers,
        )


_JOB = Job._meta.db_table
_MESSAGE = Message._meta.db_table
_CONSUMER = Consumer._meta.db_table

# The claim on PostgreSQL, one statement and one round trip (SPEC §11):
# - room: each receiving push consumer's free in-flight slots (counted on the INFLIGHT index);
# - candidate: per consumer, its best due jobs up to its room (an index scan each, no locks), then
#   the best overall. Twice the batch is read, so that rows a concurrent dispatcher holds can be
#   skipped without coming back short;
# - taken: those rows locked, skipping any already locked, up to the batch size;
# - the UPDATE moves them to INFLIGHT with a lease, counts the attempt and returns the request data.
# A consumer's cap holds per claim; claims of several dispatchers at the same moment can each fill
# the same room (docs/dispatcher.md).
_CLAIM_SQL = f"""
WITH room AS (
    SELECT c.id, coalesce(c.max_in_flight, %(default_cap)s) - (
        SELECT count(*) FROM {_JOB} f WHERE f.consumer_id = c.id AND f.status = %(inflight)s
    ) AS free
    FROM {_CONSUMER} c
    WHERE c.type = %(push)s AND NOT c.paused
),
candidate AS (
    SELECT due.id, due.priority, due.next_attempt_at
    FROM room CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.next_attempt_at
        FROM {_JOB} j
        WHERE j.consumer_id = room.id AND j.status = %(queued)s AND j.next_attempt_at <= %(now)s
        ORDER BY j.priority DESC, j.next_attempt_at
        LIMIT least(room.free, %(candidates)s)
    ) due
    WHERE room.free > 0
    ORDER BY due.priority DESC, due.next_attempt_at
    LIMIT %(candidates)s
),
taken AS MATERIALIZED (
    SELECT j.id
    FROM {_JOB} j JOIN candidate ON candidate.id = j.id
    WHERE j.status = %(queued)s
    ORDER BY candidate.priority DESC, candidate.next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {_JOB} j
SET status = %(inflight)s, status_changed_at = %(now)s, attempts = j.attempts + 1,
    lease_expires_at = %(lease_until)s
FROM taken, {_MESSAGE} m, {_CONSUMER} c
WHERE j.id = taken.id AND j.status = %(queued)s AND m.id = j.message_id AND c.id = j.consumer_id
RETURNING j.id, j.attempts, j.priority, j.next_attempt_at, c.id, c.changed_at,
    m.public_id, m.payload, m.content_type, m.priority, m.headers
"""  # noqa: S608 (table names from model metadata; every value a parameter)


def _claim_in_one_statement(limit: int, now: datetime) -> list[ClaimedJob]:
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SQL,
            {
                "default_cap": DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER,
                "push": Consumer.Type.PUSH.value,
                "queued": QUEUED.value,
                "inflight": INFLIGHT.value,
                "now": now,
                "lease_until": now + _lease(),
                "limit": limit,
                "candidates": 2 * limit,
            },
        )
        rows = cursor.fetchall()
    return [ClaimedJob.from_row(row) for row in rows]


def _claim_portably(limit: int, now: datetime) -> list[ClaimedJob]:
    """The same claim through the ORM, for SQLite (one writer at a time, so no SKIP LOCKED)."""
    with transaction.atomic():
        ids = _due_job_ids(limit, now)
        Job.objects.filter(pk__in=ids).transition(
            QUEUED, INFLIGHT, attempts=F("attempts") + 1, lease_expires_at=now + _lease()
        )
    rows = Job.objects.filter(pk__in=ids, status=INFLIGHT).values_list(
        "pk",
        "attempts",
        "priority",
        "next_attempt_at",
        "consumer_id",
        "consumer__changed_at",
        "message__public_id",
        "message__payload",
        "message__content_type",
        "message__priority",
        "message__headers",
    )
    return [ClaimedJob.from_row(row) for row in rows]


def _due_job_ids(limit: int, now: datetime) -> list[int]:
    """Per consumer, its due jobs up to its in-flight room; then the best `limit` overall.

    Looking per consumer keeps a paused consumer's backlog, or a slow consumer at its cap, from
    being scanned or from taking every slot.
    """
    candidates: list[tuple[int, datetime, int]] = []
    for consumer_id, room in _consumer_room().items():
        candidates += (
            Job.objects.filter(consumer_id=consumer_id, status=QUEUED, next_attempt_at__lte=now)
            .order_by("-priority", "next_attempt_at")
            .values_list("priority", "next_attempt_at", "pk")[: min(room, limit)]
        )
    candidates.sort(key=lambda row: (-row[0], row[1]))
    return [pk for _, _, pk in candidates[:limit]]


def _consumer_room() -> dict[int, int]:
    """How many more jobs each receiving push consumer may have in flight."""
    caps = dict(
        Consumer.objects.filter(type=Consumer.Type.PUSH, paused=False).values_list(
            "pk", "max_in_flight"
        )
    )
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


def _apply(result: AttemptResult, outcome: Outcome) -> None:
    """One failed attempt's outcome: its job QUEUED again at its due time, or DEAD."""
    jobs = Job.objects.filter(pk=result.job_id)
    if outcome.verdict is Verdict.RETRY:
        jobs.transition(
            INFLIGHT,
            QUEUED,
            next_attempt_at=outcome.due_at,
            lease_expires_at=None,
            last_error=outcome.reason,
        )
    elif outcome.verdict is Verdict.DEAD:
        jobs.transition(INFLIGHT, DEAD, lease_expires_at=None, last_error=outcome.reason)
    if outcome.pause_consumer:
        Consumer.objects.filter(pk=result.consumer_id).update(paused=True)


def _request(job: ClaimedJob, consumer: Consumer, now: datetime) -> DeliveryRequest:
    """The HTTP request for one claimed job: payload, broker headers, metadata, signatures."""
    headers = {
        "Content-Type": job.content_type,
        "X-Broker-Message-ID": job.message_id,
        "X-Broker-Message-Priority": str(job.message_priority),
        "X-Broker-Channel-ID": consumer.channel_id,
        "X-Broker-Consumer-ID": consumer.public_id,
        broker_settings.BROKER_CONSUMER_TOKEN_HEADER: consumer.token,
        "X-Request-ID": uuid.uuid4().hex,
        "User-Agent": USER_AGENT,
        **signature_headers(consumer, job.message_id, job.payload, now),
    }
    metadata = _metadata(job.headers, reserved={name.lower() for name in headers})
    if metadata:
        headers.update(metadata)
        headers["X-Broker-Metadata-Headers"] = ",".join(metadata)
    return DeliveryRequest(
        job.job_id, job.attempt, job.consumer_id, consumer.callback_url, headers, job.payload
    )


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
# at-least-once price); its attempt is recorded all the same. A job deleted meanwhile (with its
# consumer or message) gets no attempt row: `present` locks the jobs against deletion before
# anything else touches them (a row this statement had already updated could not be locked).
_RECORD_DELIVERIES_SQL = f"""
WITH present AS MATERIALIZED (
    SELECT id FROM {_JOB} WHERE id = ANY(%(jobs)s::bigint[]) FOR KEY SHARE
),
moved AS (
    UPDATE {_JOB}
    SET status = %(delivered)s, status_changed_at = %(now)s, lease_expires_at = NULL,
        last_error = ''
    WHERE id IN (SELECT id FROM present) AND status = %(inflight)s
)
INSERT INTO {DeliveryAttempt._meta.db_table} (job_id, attempt_number, started_at, duration_ms,
    status_code, error_class, response_excerpt, dispatcher_id)
SELECT job_id, attempt_number, started_at, duration_ms, status_code, '', excerpt, %(dispatcher)s
FROM unnest(%(jobs)s::bigint[], %(attempts)s::int[], %(started)s::timestamptz[],
    %(durations)s::float8[], %(statuses)s::smallint[], %(excerpts)s::text[])
    AS result(job_id, attempt_number, started_at, duration_ms, status_code, excerpt)
WHERE job_id IN (SELECT id FROM present)
"""  # noqa: S608 (table names from model metadata; every value a parameter)


def _record_deliveries(results: list[AttemptResult], dispatcher_id: str, now: datetime) -> None:
    if not results:
        return
    check_transition(INFLIGHT, DELIVERED)
    if connection.vendor != "postgresql":  # SQLite: the same through the ORM
        present = set(
            Job.objects.filter(pk__in=[r.job_id for r in results]).values_list("pk", flat=True)
        )
        DeliveryAttempt.objects.bulk_create(
            _attempt_row(r, dispatcher_id) for r in results if r.job_id in present
        )
        Job.objects.filter(pk__in=present).transition(
            INFLIGHT, DELIVERED, lease_expires_at=None, last_error=""
        )
        return
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
                "now": now,
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
