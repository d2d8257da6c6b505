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
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, TypeVar

import aiohttp
from django.db import InterfaceError, OperationalError, ProgrammingError, connection, transaction
from django.db.models import Count, F, Q
from django.utils import timezone

import broker
from broker import tracing
from broker.conf import broker_settings
from broker.models import Message
from broker.periodic import run_due_ticks
from broker.publishing import is_refused_metadata_header
from broker.scheduling import RELEASE_BATCH, release_due_messages
from broker.xids import new_xid
from consumers.models import Consumer
from jobs import circuit
from jobs.delivery import (
    REQUEST_ERROR,
    AttemptResult,
    DeliveryNames,
    DeliveryRequest,
    StoredBody,
    deliver,
    delivery_session,
    describe_error,
    unanswered,
)
from jobs.expiry import expire_old_jobs
from jobs.health import Health
from jobs.leases import sweep_expired_leases
from jobs.metrics import DELIVERIES, DELIVERY_SECONDS
from jobs.models import (
    DeliveryAttempt,
    DispatcherHeartbeat,
    Job,
    JobQuerySet,
    job_public_id,
)
from jobs.outcome_log import log_attempt
from jobs.retry import Outcome, Verdict, decide
from jobs.signing import chunked_signature_headers, signature_headers
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED, check_transition

logger = logging.getLogger(__name__)
T = TypeVar("T")
# What a lost or refused database connection raises: the step is skipped and tried again later.
CONNECTION_ERRORS = (OperationalError, InterfaceError)

USER_AGENT = f"webhook-broker-django/{broker.__version__}"
DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER = 100
POLICY_FIELDS = ("retry_delays", "non_retryable_statuses")  # what jobs/retry.py reads
HOUSEKEEPING_SECONDS = 5.0  # heartbeat and lease sweep
EXPIRY_SECONDS = 60.0  # jobs past their age limit (jobs/expiry.py)
RELEASE_SECONDS = 0.5  # scheduled messages and periodic ticks: released within a second
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
        self._recording = 0  # results being recorded right now
        self._next_expiry = 0.0  # monotonic time of the next expiry sweep
        self.health = Health()  # what --health-port serves (jobs/health.py)
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
        requests, unsendable = [], []
        for job in claimed:
            consumer = consumers.get(job.consumer_id)
            try:
                if consumer is None:
                    raise UnreadableConsumer(job.consumer_id)
                requests.append(delivery_request(job, consumer, now))
            except Exception as exc:  # this job's request alone cannot be made
                logger.error("cannot build the request of job %s: %s", job.job_id, exc)
                unsendable.append(_unsendable(job, consumer, exc))
        try:
            self.complete(unsendable)  # failed attempts like any other, recorded at once
        except CONNECTION_ERRORS:  # the requests are claimed: they go out; leases see to these
            logger.warning("could not record %d unsendable jobs", len(unsendable))
        return requests

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
            self._consumers.update(_load_consumers(stale))
        return self._consumers

    def complete(self, results: Iterable[AttemptResult]) -> None:
        """Record attempts and move their jobs on, in one transaction for the whole batch.

        Should that fail for anything but a lost connection (a bug, a value the database
        refuses), each result is recorded on its own: one that cannot be recorded keeps only its
        own job INFLIGHT, until the lease sweep returns it to the queue (or the DLQ). A
        connection lost meanwhile raises UnrecordedOutcomes with those not recorded yet.
        """
        results = list(results)
        try:
            recorded = self._complete_batch(results)
        except CONNECTION_ERRORS:
            raise
        except Exception:
            logger.exception("recording %d delivery outcomes failed", len(results))
            if len(results) > 1:
                self._complete_one_by_one(results)
            return
        # A line per attempt once it is recorded, out of the recording's reach (a batch that
        # failed is recorded, and so logged, one result at a time above).
        for result, outcome in recorded:
            log_attempt(result, outcome)

    def _complete_one_by_one(self, results: list[AttemptResult]) -> None:
        for done, result in enumerate(results):
            try:
                self.complete([result])
            except CONNECTION_ERRORS as exc:
                _drop_connection()
                raise UnrecordedOutcomes(results[done:]) from exc

    def _complete_batch(self, results: list[AttemptResult]) -> list[tuple[AttemptResult, Outcome]]:
        """Record a batch in one transaction; return each recorded attempt with its outcome."""
        if not results:
            return []
        now = timezone.now()
        policies = self._policies({r.consumer_id for r in results})
        outcomes = {r.job_id: decide(r, policies[r.consumer_id], now) for r in results}
        delivered = [r for r in results if outcomes[r.job_id].verdict is Verdict.DELIVERED]
        failed = [r for r in results if outcomes[r.job_id].verdict is not Verdict.DELIVERED]
        # Consumers that answered, and not with "unavailable": they are up (SPEC §6.4).
        answered = {
            r.consumer_id
            for r in results
            if r.status_code is not None and not outcomes[r.job_id].unavailable
        }
        with transaction.atomic():
            _record_deliveries(delivered, self.config.dispatcher_id, now)
            applied = self._record_failures(failed, outcomes, now, answered)
        for result in results:
            DELIVERY_SECONDS.observe(result.duration_ms / 1000)
        for outcome in outcomes.values():
            DELIVERIES.labels(outcome.verdict.value).inc()
        self.delivered += len(delivered)
        self.failed += len(failed)
        recorded = [(result, outcomes[result.job_id]) for result in delivered]
        return recorded + [(r, applied[r.job_id]) for r in failed if r.job_id in applied]

    def _policies(self, consumer_ids: set[int]) -> dict[int, Consumer]:
        """The consumers whose retry policies apply, as they were at the claim. One this
        dispatcher did not load (a caller completes what it did not claim, or the row could not
        be read) is read for its policy alone, no secret decrypted; a deleted one has the
        global defaults."""
        policies = {pk: self._consumers[pk] for pk in consumer_ids if pk in self._consumers}
        if missing := consumer_ids - policies.keys():
            policies.update(Consumer.objects.only(*POLICY_FIELDS).in_bulk(missing))
        return {pk: policies.get(pk) or Consumer() for pk in consumer_ids}

    def _record_failures(
        self,
        failed: list[AttemptResult],
        outcomes: dict[int, Outcome],
        now: datetime,
        answered: set[int],
    ) -> dict[int, Outcome]:
        """Failed attempts: a row each, the circuits of consumers that were unavailable, then
        each job QUEUED at its own due time, or DEAD. Returns the outcomes applied, by job.

        The jobs are locked first, so that one deleted meanwhile (with its consumer) is skipped
        rather than given an attempt row that points nowhere. Consumers in `answered` gave an
        answer in the same batch that shows them up (a 2xx, or a 4xx of their own choosing):
        their circuits close, and their failures do not count towards them.
        """
        if not failed:
            return {}
        present = set(
            Job.objects.select_for_update()
            .filter(pk__in=[r.job_id for r in failed])
            .values_list("pk", flat=True)
        )
        failed = [r for r in failed if r.job_id in present]
        DeliveryAttempt.objects.bulk_create(
            _attempt_row(result, self.config.dispatcher_id) for result in failed
        )
        unavailable = Counter(
            r.consumer_id
            for r in failed
            if outcomes[r.job_id].unavailable and r.consumer_id not in answered
        )
        reopened = circuit.record_unavailable(unavailable, now)
        circuit.close_circuits({r.consumer_id for r in failed} & answered)
        applied = {}
        for result in failed:
            outcome = outcomes[result.job_id]
            if outcome.unavailable and result.consumer_id in reopened:
                # A failed probe uses no attempt; it waits for the circuit to half-open again
                # (its error says so, never that attempts were used up: the job is QUEUED).
                reason = f"{result.error}; circuit open again, attempt not counted"
                outcome = Outcome(Verdict.RETRY, reason, reopened[result.consumer_id], refund=True)
            _apply(result, outcome)
            applied[result.job_id] = outcome
        return applied

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
        """Expired leases back to the queue; once a minute, jobs past their age limit to the DLQ
        (a limit counts in days, and its sweep makes a query per consumer)."""
        moved = sweep_expired_leases()
        if time.monotonic() >= self._next_expiry:
            moved += expire_old_jobs()
            self._next_expiry = time.monotonic() + EXPIRY_SECONDS
        return moved

    def release_due(self) -> int:
        """Release due scheduled messages and publish due periodic ticks (SPEC §5: every
        dispatcher does, exactly once between them); return how many messages that made.

        Their jobs wake the dispatchers with the NOTIFY of their publish or release.
        """
        released = 0
        while (batch := release_due_messages()) == RELEASE_BATCH:  # more may be due at once
            released += batch
        return released + batch + run_due_ticks()

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
        self.health.stopping = True
        self._wake.set()

    def wake(self) -> None:
        self._wake.set()

    async def run(self) -> None:
        """Claim, deliver and record until stopped. Raises BrokenDatabase, the one reason it
        ends on its own: no delivery or step failure ends it."""
        # DNS lookups and payload reads run in the loop's default executor: a thread for every
        # delivery that may be in flight, so that one consumer's names that are slow to resolve
        # cannot hold up everybody else's lookups (Python's default has 6 threads on 2 cores).
        io_threads = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="dispatch-io")
        asyncio.get_running_loop().set_default_executor(io_threads)
        try:
            async with delivery_session(self.config.concurrency) as session:
                await self._loop(session)
        finally:
            for executor in {self._claimer, self._recorder}:
                await asyncio.get_running_loop().run_in_executor(executor, _drop_connection)
                executor.shutdown()

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        in_flight: dict[asyncio.Task[AttemptResult], DeliveryRequest] = {}
        recording: asyncio.Task[None] | None = None
        next_housekeeping = next_release = 0.0
        loop = asyncio.get_running_loop()
        while not self.stopping or in_flight or self._finished or _running(recording):
            self.health.tick()
            try:
                if loop.time() >= next_housekeeping and not self.stopping:
                    await self._step(self.beat, len(in_flight))
                    await self._step(self.sweep)
                    next_housekeeping = loop.time() + HOUSEKEEPING_SECONDS
                if loop.time() >= next_release and not self.stopping:
                    await self._step(self.release_due)
                    next_release = loop.time() + RELEASE_SECONDS
                # Answered but unrecorded jobs are still INFLIGHT in the database: counting them
                # keeps what one dispatcher holds, and could deliver twice if it died, within
                # --concurrency.
                room = self.config.concurrency - len(in_flight) - self._unrecorded
                if not self.stopping and room > 0:
                    claimed = await self._step(self.claim, min(room, self.config.batch_size))
                    for request in claimed or []:
                        task = asyncio.create_task(self._send(session, request))
                        task.add_done_callback(lambda _: self._wake.set())
                        in_flight[task] = request
            except DatabaseDown:
                await asyncio.sleep(self.config.poll_seconds)
                continue
            done = [task for task in in_flight if task.done()]
            for task in done:
                self._finished.append(_result_of(task, in_flight.pop(task)))
            if self._finished and not _running(recording):
                recording = asyncio.create_task(self._record(self._finished))
                recording.add_done_callback(lambda _: self._wake.set())
                self._finished = []
            if self.stopping and in_flight:
                await self._drain(in_flight)
            else:
                await self._idle(busy=bool(done), until=next_release)
        with contextlib.suppress(DatabaseDown):
            await self._step(self.retire)

    async def _record(self, results: list[AttemptResult]) -> None:
        """Record outcomes in the recording thread while the loop goes on claiming and sending.

        Results that could not be recorded (database down) are kept for a later pass.
        """
        self._recording = len(results)
        try:
            await self._db(self.complete, results, thread=self._recorder)
        except (DatabaseDown, UnrecordedOutcomes) as exc:
            self._finished[:0] = exc.results if isinstance(exc, UnrecordedOutcomes) else results
            await asyncio.sleep(self.config.poll_seconds)
        finally:
            self._recording = 0

    @property
    def _unrecorded(self) -> int:
        return len(self._finished) + self._recording

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

    async def _idle(self, busy: bool, until: float) -> None:
        """Wait for a finished delivery or recording, a NOTIFY, the poll interval or the next
        release of scheduled messages (`until`, in loop time), whichever comes first."""
        if busy:
            await asyncio.sleep(0)  # claim again right away: slots were just freed
            return
        timeout = min(self.config.poll_seconds, until - asyncio.get_running_loop().time())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), max(timeout, 0))
        self._wake.clear()

    async def _drain(self, in_flight: dict[asyncio.Task[AttemptResult], DeliveryRequest]) -> None:
        """On shutdown: let deliveries finish within the grace period, then cut them off.

        A cut-off request whose headers went out may have reached the consumer: that counts as
        an attempt and is retried by the policy. One that never got that far goes back to the
        queue without using an attempt.
        """
        done, pending = await asyncio.wait(in_flight, timeout=self.config.grace_seconds)
        self._finished += [_result_of(task, in_flight[task]) for task in done]
        unsent = []
        for task in pending:
            task.cancel()
            request = in_flight[task]
            if request.job_id in self._sent:
                self._finished.append(_cut_off(request))
            else:
                unsent.append(request.job_id)
        if unsent:
            with contextlib.suppress(DatabaseDown):  # their leases will return them
                await self._step(self.release, unsent)
        in_flight.clear()

    async def _step(self, step: Callable[..., T], *args: Any) -> T | None:
        """Run a step of the loop in the claiming thread; None when it failed for anything but
        the database being down or broken: that is logged with its traceback, and the loop
        goes on serving every other job (the step runs again on its next turn)."""
        try:
            return await self._db(step, *args)
        except (DatabaseDown, BrokenDatabase):
            raise
        except Exception:
            logger.exception("dispatcher step %s failed; carrying on", step.__name__)
            await asyncio.get_running_loop().run_in_executor(self._claimer, _drop_connection)
            return None

    async def _db(
        self, step: Callable[..., T], *args: Any, thread: ThreadPoolExecutor | None = None
    ) -> T:
        """Run a database step in a database thread (the claiming one unless told).

        On a lost connection the connection is dropped, so that the next step reconnects, and
        DatabaseDown is raised: the loop skips that pass. Claimed jobs stay INFLIGHT until their
        lease expires; finished results stay in memory and are recorded on a later pass. A
        schema that is not this version's (migrations not run) raises BrokenDatabase.
        """
        thread = thread or self._claimer
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(thread, functools.partial(step, *args))
        except CONNECTION_ERRORS as exc:
            self.health.database_failed()
            logger.warning("database unavailable during %s: %s", step.__name__, type(exc).__name__)
            await loop.run_in_executor(thread, _drop_connection)
            raise DatabaseDown from exc
        except ProgrammingError as exc:
            raise BrokenDatabase(
                f"the database refused the dispatcher's {step.__name__} step ({exc}); "
                "is its schema this version's? Run `manage.py migrate`."
            ) from exc
        self.health.database_ok()
        return result


class DatabaseDown(Exception):
    pass


class BrokenDatabase(Exception):
    """The database answers, but not as this version needs (tables or columns missing)."""


class UnrecordedOutcomes(Exception):
    """The connection was lost while outcomes were recorded one by one: these were not."""

    def __init__(self, results: list[AttemptResult]) -> None:
        super().__init__(f"{len(results)} outcomes not recorded")
        self.results = results


class UnreadableConsumer(LookupError):
    def __init__(self, consumer_id: int) -> None:
        super().__init__(f"consumer {consumer_id} cannot be read (see the dispatcher's log)")


def _result_of(task: asyncio.Task[AttemptResult], request: DeliveryRequest) -> AttemptResult:
    """A finished delivery's result; `deliver` never raises, but a task cancelled from outside
    (by aiohttp, say) counts as cut off rather than ending the loop."""
    return _cut_off(request) if task.cancelled() else task.result()


def _running(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()


def _cut_off(request: DeliveryRequest) -> AttemptResult:
    return unanswered(request, "shutdown", SHUTDOWN_MESSAGE)


def _unsendable(job: ClaimedJob, consumer: Consumer | None, exc: Exception) -> AttemptResult:
    """The failed attempt of a claimed job whose request could not be made."""
    return AttemptResult(
        job.job_id,
        job.attempt,
        job.consumer_id,
        timezone.now(),
        0.0,
        error_class=REQUEST_ERROR,
        error=f"the request could not be made: {describe_error(exc)}",
        names=_names(job, consumer, tracing.parse(job.traceparent, job.tracestate)),
    )


def _load_consumers(ids: set[int]) -> dict[int, Consumer]:
    """The consumers with these IDs, their secrets decrypted, each on its own: one whose row
    cannot be read (a secret that no configured key decrypts) is left out, and only its own jobs
    fail. Consumers are loaded when first seen and after a change only, so this is rare."""
    loaded = {}
    for pk in ids:
        try:
            loaded.update(Consumer.objects.in_bulk([pk]))
        except CONNECTION_ERRORS:
            raise
        except Exception:
            logger.exception("consumer %s cannot be loaded", pk)
    return loaded


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
    payload_file: str  # an offloaded payload's name in storage; "" when `payload` holds it
    content_type: str
    message_priority: int
    headers: dict[str, str]
    created_at: datetime | None = None  # the job's, for its public ID (none: a test event)
    traceparent: str | None = None  # the message's trace context (broker/tracing.py)
    tracestate: str | None = None

    @classmethod
    def from_row(cls, row: Sequence[Any]) -> ClaimedJob:
        """From a row of the fields in order; raw SQL gives memoryview payloads and JSON text
        (Django reads jsonb as text and leaves parsing to JSONField)."""
        *head, payload, payload_file, content_type, message_priority, headers = row[:-3]
        created_at, traceparent, tracestate = row[-3:]
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
            payload_file,
            content_type,
            message_priority,
            headers,
            created_at,
            traceparent,
            tracestate,
        )


_JOB = Job._meta.db_table
_MESSAGE = Message._meta.db_table
_CONSUMER = Consumer._meta.db_table

# The claim on PostgreSQL, one statement and one round trip (SPEC §11):
# - cap, room: each push consumer's free in-flight slots, for those that are not paused and whose
#   circuit is closed, or half-open (then one probe at a time). Counted once per claim (hence
#   MATERIALIZED), and only up to the cap: a plain index scan that stops there, and that marks
#   the dead index entries of finished jobs as it passes, so that the next claim skips them;
# - due: per consumer, its best due jobs up to its room, read from an index without locks. For an
#   ordered consumer (§6.3) only the head of each key qualifies: the key's pending (QUEUED or
#   INFLIGHT) job with the lowest id, when it is QUEUED and due. The heads are found by walking
#   the consumer's keys through job_consumer_key_pending_idx, one index probe per key, so the
#   cost grows with the number of keys with pending jobs, not with the backlog behind them;
# - candidate: the best of those overall. Twice the batch is read, so that rows a concurrent
#   dispatcher holds can be skipped without coming back short;
# - taken: those rows locked, skipping any already locked, up to the batch size;
# - the UPDATE moves them to INFLIGHT with a lease, counts the attempt and returns the request data.
# Statuses and other code constants are literals, so that PostgreSQL matches the partial indexes
# even with a generic plan. A consumer's cap holds per claim; claims of several dispatchers at the
# same moment can each fill the same room (docs/dispatcher.md).
_PENDING = f"('{QUEUED.value}', '{INFLIGHT.value}')"
_CLAIM_SQL = f"""
WITH cap AS (
    SELECT c.id, c.ordering = '{Consumer.Ordering.ORDERED.value}' AS ordered,
        CASE WHEN c.circuit_open_until IS NULL
            THEN coalesce(c.max_in_flight, %(default_cap)s) ELSE 1 END AS cap
    FROM {_CONSUMER} c
    WHERE c.type = '{Consumer.Type.PUSH.value}' AND NOT c.paused
        AND (c.circuit_open_until IS NULL OR c.circuit_open_until <= %(now)s)
),
room AS MATERIALIZED (
    SELECT cap.id, cap.ordered, cap.cap - (
        SELECT count(*) FROM (
            SELECT FROM {_JOB} f
            WHERE f.consumer_id = cap.id AND f.status = '{INFLIGHT.value}'
            LIMIT cap.cap
        ) in_flight
    ) AS free
    FROM cap
),
due AS (
    SELECT next.id, next.priority, next.next_attempt_at
    FROM room CROSS JOIN LATERAL (
        SELECT j.id, j.priority, j.next_attempt_at
        FROM {_JOB} j
        WHERE j.consumer_id = room.id AND j.status = '{QUEUED.value}'
            AND j.next_attempt_at <= %(now)s
        ORDER BY j.priority DESC, j.next_attempt_at
        LIMIT least(room.free, %(candidates)s)
    ) next
    WHERE room.free > 0 AND NOT room.ordered
    UNION ALL
    SELECT head.id, head.priority, head.next_attempt_at
    FROM room CROSS JOIN LATERAL (
        WITH RECURSIVE key_head AS (
            (SELECT j.ordering_key, j.id, j.status, j.priority, j.next_attempt_at
             FROM {_JOB} j
             WHERE j.consumer_id = room.id AND j.status IN {_PENDING}
             ORDER BY j.ordering_key, j.id LIMIT 1)
            UNION ALL
            SELECT next_key.*
            FROM key_head CROSS JOIN LATERAL (
                SELECT j.ordering_key, j.id, j.status, j.priority, j.next_attempt_at
                FROM {_JOB} j
                WHERE j.consumer_id = room.id AND j.status IN {_PENDING}
                    AND j.ordering_key > key_head.ordering_key
                ORDER BY j.ordering_key, j.id LIMIT 1
            ) next_key
        )
        SELECT id, priority, next_attempt_at FROM key_head
        WHERE status = '{QUEUED.value}' AND next_attempt_at <= %(now)s
        ORDER BY priority DESC, next_attempt_at
        LIMIT least(room.free, %(candidates)s)
    ) head
    WHERE room.free > 0 AND room.ordered
),
candidate AS (
    SELECT * FROM due ORDER BY priority DESC, next_attempt_at LIMIT %(candidates)s
),
taken AS MATERIALIZED (
    SELECT j.id
    FROM {_JOB} j JOIN candidate ON candidate.id = j.id
    WHERE j.status = '{QUEUED.value}'
    ORDER BY candidate.priority DESC, candidate.next_attempt_at
    LIMIT %(limit)s
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {_JOB} j
SET status = '{INFLIGHT.value}', status_changed_at = %(now)s, attempts = j.attempts + 1,
    lease_expires_at = %(lease_until)s
FROM taken, {_MESSAGE} m, {_CONSUMER} c
WHERE j.id = taken.id AND j.status = '{QUEUED.value}' AND m.id = j.message_id
    AND c.id = j.consumer_id
RETURNING j.id, j.attempts, j.priority, j.next_attempt_at, c.id, c.changed_at,
    m.public_id, m.payload, m.payload_file, m.content_type, m.priority, m.headers,
    j.created_at, m.traceparent, m.tracestate
"""  # noqa: S608 (table names and constants from code; every value a parameter)


def _claim_in_one_statement(limit: int, now: datetime) -> list[ClaimedJob]:
    with connection.cursor() as cursor:
        cursor.execute(
            _CLAIM_SQL,
            {
                "default_cap": DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER,
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
        "message__payload_file",
        "message__content_type",
        "message__priority",
        "message__headers",
        "created_at",
        "message__traceparent",
        "message__tracestate",
    )
    return [ClaimedJob.from_row(row) for row in rows]


def _due_job_ids(limit: int, now: datetime) -> list[int]:
    """Per consumer, its due jobs up to its in-flight room; then the best `limit` overall.

    Looking per consumer keeps a paused consumer's backlog, or a slow consumer at its cap, from
    being scanned or from taking every slot.
    """
    candidates: list[tuple[int, datetime, int]] = []
    for consumer, room in _consumer_room(now).items():
        due = Job.objects.filter(consumer_id=consumer.pk, status=QUEUED, next_attempt_at__lte=now)
        if consumer.ordering == Consumer.Ordering.ORDERED:
            due = due.heads_of_their_keys()
        candidates += due.order_by("-priority", "next_attempt_at").values_list(
            "priority", "next_attempt_at", "pk"
        )[: min(room, limit)]
    candidates.sort(key=lambda row: (-row[0], row[1]))
    return [pk for _, _, pk in candidates[:limit]]


def _consumer_room(now: datetime) -> dict[Consumer, int]:
    """How many more jobs each push consumer that may receive can have in flight.

    A consumer whose circuit is open receives nothing; a half-open one gets one probe.
    """
    consumers = Consumer.objects.filter(type=Consumer.Type.PUSH, paused=False).filter(
        Q(circuit_open_until__isnull=True) | Q(circuit_open_until__lte=now)
    )
    in_flight = dict(
        Job.objects.filter(status=INFLIGHT, consumer__in=consumers)
        .values("consumer")
        .annotate(n=Count("pk"))
        .values_list("consumer", "n")
    )
    room = {
        consumer: _cap(consumer) - in_flight.get(consumer.pk, 0)
        for consumer in consumers.only("ordering", "max_in_flight", "circuit_open_until")
    }
    return {consumer: free for consumer, free in room.items() if free > 0}


def _cap(consumer: Consumer) -> int:
    if consumer.circuit_open_until is not None:  # half-open: one probe at a time
        return 1
    return consumer.max_in_flight or DEFAULT_MAX_IN_FLIGHT_PER_CONSUMER


def _apply(result: AttemptResult, outcome: Outcome) -> None:
    """One failed attempt's outcome: its job QUEUED again at its due time, or DEAD."""
    jobs = _still_ours(result)
    if outcome.verdict is Verdict.RETRY:
        jobs.transition(
            INFLIGHT,
            QUEUED,
            next_attempt_at=outcome.due_at,
            lease_expires_at=None,
            last_error=outcome.reason,
            attempts=F("attempts") - 1 if outcome.refund else F("attempts"),
        )
    elif outcome.verdict is Verdict.DEAD:
        jobs.transition(INFLIGHT, DEAD, lease_expires_at=None, last_error=outcome.reason)
    if outcome.pause_consumer:
        Consumer.objects.filter(pk=result.consumer_id).update(paused=True)


def _still_ours(result: AttemptResult) -> JobQuerySet:
    """The result's job if it still holds the claim the result is of: a job whose lease expired
    and that another dispatcher took again has one more attempt, and is left to that holder."""
    return Job.objects.filter(pk=result.job_id, attempts=result.attempt)


def delivery_request(job: ClaimedJob, consumer: Consumer, now: datetime) -> DeliveryRequest:
    """The HTTP request for one claimed job: payload, broker headers, metadata, signatures.

    An offloaded payload (SPEC §6.7) is not read here, on the claiming thread: `deliver` reads,
    signs and streams it when it sends the request.
    """
    stored = _stored_body(job, consumer) if job.payload_file else None
    trace = tracing.parse(job.traceparent, job.tracestate)
    headers = {
        "Content-Type": job.content_type,
        "X-Broker-Message-ID": job.message_id,
        "X-Broker-Message-Priority": str(job.message_priority),
        "X-Broker-Channel-ID": consumer.channel_id,
        "X-Broker-Consumer-ID": consumer.public_id,
        broker_settings.BROKER_CONSUMER_TOKEN_HEADER: consumer.token,
        "X-Request-ID": new_xid(),  # new per attempt, an xid as webhook-broker's
        "User-Agent": broker_settings.BROKER_DELIVERY_USER_AGENT or USER_AGENT,
    }
    if stored is None:
        headers.update(signature_headers(consumer, job.message_id, job.payload, now))
    reserved = {name.lower() for name in headers}
    if trace or tracing.enabled():
        # The trace context is the broker's to send (the message's, or the attempt's span's,
        # which `deliver` puts in): kept metadata of those names never goes with it.
        headers.update(trace.headers() if trace else {})
        reserved |= {tracing.TRACEPARENT, tracing.TRACESTATE}
    metadata = _metadata(job.headers, reserved=reserved)
    headers.update(metadata)
    # Always sent, the names sorted, empty when there are none: as webhook-broker sends it.
    headers["X-Broker-Metadata-Headers"] = ",".join(sorted(metadata))
    return DeliveryRequest(
        job.job_id,
        job.attempt,
        job.consumer_id,
        consumer.callback_url,
        headers,
        job.payload,
        stored,
        names=_names(job, consumer, trace),
        trace=trace,
    )


def _names(
    job: ClaimedJob, consumer: Consumer | None, trace: tracing.TraceContext | None
) -> DeliveryNames:
    """The public IDs a claimed job's log line and span name it by."""
    return DeliveryNames(
        job_public_id(job.job_id, job.created_at) if job.created_at else "",
        job.message_id,
        consumer.channel_id if consumer else "",
        consumer.public_id if consumer else "",
        trace.trace_id if trace else "",
    )


def _stored_body(job: ClaimedJob, consumer: Consumer) -> StoredBody:
    sign = functools.partial(chunked_signature_headers, consumer, job.message_id)
    return StoredBody(job.payload_file, sign)


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


# The common case, 2xx answers: their attempt rows and their jobs' move to DELIVERED in one
# statement, one round trip for the whole batch. Only jobs still INFLIGHT under the claim the
# result is of (the same attempt count) move: one whose lease expired and was swept, and perhaps
# taken again, meanwhile is left to the queue or its new holder (its duplicate delivery is the
# at-least-once price); its attempt is recorded all the same. A job deleted meanwhile (with its
# consumer or message) gets no attempt row: `present` locks the jobs against deletion before
# anything else touches them (a row this statement had already updated could not be locked).
_RECORD_DELIVERIES_SQL = f"""
WITH present AS MATERIALIZED (
    SELECT id FROM {_JOB} WHERE id = ANY(%(jobs)s::bigint[]) FOR KEY SHARE
),
closed AS ({circuit.CLOSE_CIRCUITS_SQL}),
moved AS (
    UPDATE {_JOB} j
    SET status = %(delivered)s, status_changed_at = %(now)s, lease_expires_at = NULL,
        last_error = ''
    FROM unnest(%(jobs)s::bigint[], %(attempts)s::int[]) AS claimed(id, attempts)
    WHERE j.id = claimed.id AND j.attempts = claimed.attempts
        AND j.id IN (SELECT id FROM present) AND j.status = %(inflight)s
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
        for result in results:
            _still_ours(result).transition(
                INFLIGHT, DELIVERED, lease_expires_at=None, last_error=""
            )
        circuit.close_circuits({r.consumer_id for r in results})
        return
    with connection.cursor() as cursor:
        cursor.execute(
            _RECORD_DELIVERIES_SQL,
            {
                "dispatcher": dispatcher_id,
                "jobs": [r.job_id for r in results],
                "consumers": list({r.consumer_id for r in results}),
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
