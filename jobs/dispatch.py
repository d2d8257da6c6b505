"""The push dispatcher (docs/dispatcher.md): claims due jobs, delivers them concurrently, records
outcomes. A thin loop over small synchronous steps, each one short transaction on the job queue
(jobs/queue): `claim`, `complete`, `release`, and the maintenance steps beside them
(jobs/maintenance.py). They run in database threads (jobs/dispatch_threads.py); deliveries run
concurrently on an asyncio loop with one keep-alive connection pool. No transaction or row lock
is ever held across an HTTP request. Tests drive the steps directly, never the loop.

Any number of dispatchers can share one database: the queue never hands a job out twice. A job's
attempt is counted when it is claimed, before anything is sent: a message that crashes every
dispatcher still runs out of attempts and ends DEAD.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from django.utils import timezone

from broker.conf import broker_settings
from consumers.models import Consumer
from jobs import queue
from jobs.consumer_cache import ConsumerCache, UnreadableConsumer
from jobs.delivery import (
    REQUEST_ERROR,
    AttemptResult,
    DeliveryRequest,
    Send,
    describe_error,
    open_sender,
    unanswered,
)
from jobs.dispatch_idle import IdleWait
from jobs.dispatch_threads import (
    CONNECTION_ERRORS,
    BrokenDatabase,
    DatabaseDown,
    DatabaseThreads,
    UnrecordedOutcomes,
    drop_connection,
)
from jobs.fair_share import FairShare
from jobs.health import Health
from jobs.maintenance import HOUSEKEEPING_SECONDS, RELEASE_SECONDS, Maintenance
from jobs.metrics import DELIVERIES, DELIVERY_SECONDS
from jobs.outcome_log import log_attempt
from jobs.outgoing import names_of_job, request_for_job
from jobs.queue import ClaimedJob, JobKey
from jobs.retry import Outcome, Verdict, decide, throttle_seconds

logger = logging.getLogger(__name__)
T = TypeVar("T")

SHUTDOWN_MESSAGE = "dispatcher stopped before the consumer answered"
Delivering = asyncio.Task[AttemptResult | None]  # a delivery in flight (`_send`)


@dataclass
class DispatcherConfig:
    concurrency: int = 128  # deliveries in flight in this process
    batch_size: int = 100  # jobs taken per claim
    poll_seconds: float = 1.0  # longest idle wait (jobs/dispatch_idle.py)
    grace_seconds: float = 10.0  # on SIGTERM, how long in-flight deliveries may finish
    # Fair share (jobs/fair_share.py): an answer slower than this makes its consumer slow, and
    # slow consumers together hold at most this share of the slots.
    slow_seconds: float = 1.0
    slow_share: float = 0.5
    dispatcher_id: str = field(
        default_factory=lambda: f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    )


class Dispatcher:
    def __init__(self, config: DispatcherConfig | None = None) -> None:
        self.config = config or DispatcherConfig()
        self.maintenance = Maintenance(self.config.dispatcher_id)
        self.delivered = self.failed = 0
        self.stopping = False
        self._wake = asyncio.Event()
        self.idle = IdleWait(self.config.poll_seconds)  # its `listener`: manage.py dispatch's
        self._sent: set[int] = set()  # job IDs whose request headers are on the wire
        self._consumers = ConsumerCache()  # decrypted, as of their changed_at
        self.fair_share = FairShare(
            self.config.concurrency, self.config.slow_seconds, self.config.slow_share
        )
        self._finished: list[AttemptResult] = []  # kept until recorded, across database outages
        # Consumers that answered 429 with Retry-After, until when (monotonic): jobs of theirs
        # waiting for a slot here are given back unsent.
        self._throttled_until: dict[int, float] = {}
        self._held_back: list[JobKey] = []  # their keys, until given back
        self._recording = 0  # results being recorded right now
        self.health = Health()  # what --health-port serves (jobs/health.py)
        self.threads = DatabaseThreads(self.health)  # where the steps run

    # --- steps: synchronous, one short transaction each --------------------------------------

    def claim(self, limit: int) -> list[DeliveryRequest]:
        """Take up to `limit` due jobs of push consumers that may receive, and build requests."""
        now = timezone.now()
        claimed = queue.claim_for_push(
            limit, now, self.fair_share.rooms(), self.config.dispatcher_id
        )
        self.fair_share.claimed(claimed)
        logger.debug("claimed %d of up to %d jobs", len(claimed), limit)
        consumers = self._consumers.as_of_claim(claimed)
        requests, unsendable = [], []
        for job in claimed:
            consumer = consumers.get(job.consumer_id)
            try:
                if consumer is None:
                    raise UnreadableConsumer(job.consumer_id)
                requests.append(request_for_job(job, consumer, now))
            except Exception as exc:  # this job's request alone cannot be made
                logger.error("cannot build the request of job %s: %s", job.job_id, exc)
                unsendable.append(_unsendable(job, consumer, exc))
        try:
            self.complete(unsendable)  # failed attempts like any other, recorded at once
        except CONNECTION_ERRORS:  # the requests are claimed: they go out; leases see to these
            logger.warning("could not record %d unsendable jobs", len(unsendable))
        return requests

    def complete(self, results: Iterable[AttemptResult]) -> None:
        """Record attempts and move their jobs on, in one transaction for the whole batch.

        Should that fail for anything but a lost connection (a bug, a value the database
        refuses), each result is recorded on its own: one that cannot be recorded keeps only its
        own job INFLIGHT, until the lease sweep returns it to the queue (or the DLQ). A
        connection lost meanwhile raises UnrecordedOutcomes with those not recorded yet.
        """
        results = list(results)
        self.fair_share.finished(results)  # their slots are this dispatcher's again
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
        for result in results:
            if result.job_id in recorded:
                log_attempt(result, recorded[result.job_id])

    def _complete_one_by_one(self, results: list[AttemptResult]) -> None:
        for done, result in enumerate(results):
            try:
                self.complete([result])
            except CONNECTION_ERRORS as exc:
                drop_connection()
                raise UnrecordedOutcomes(results[done:]) from exc

    def _complete_batch(self, results: list[AttemptResult]) -> dict[int, Outcome]:
        """Record a batch in one transaction; return the outcome of each recorded attempt."""
        if not results:
            return {}
        now = timezone.now()
        policies = self._consumers.policies({r.consumer_id for r in results})
        outcomes = {r.job_id: decide(r, policies[r.consumer_id], now) for r in results}
        recorded = queue.record_outcomes(results, outcomes, self.config.dispatcher_id, now)
        for result in results:
            DELIVERY_SECONDS.observe(result.duration_ms / 1000)
        for outcome in outcomes.values():
            DELIVERIES.labels(outcome.verdict.value).inc()
        delivered = sum(o.verdict is Verdict.DELIVERED for o in outcomes.values())
        self.delivered += delivered
        self.failed += len(results) - delivered
        return recorded

    def release(self, keys: Iterable[JobKey]) -> int:
        """Give claimed jobs that were never sent back to the queue, without using an attempt;
        by their whole primary keys, (id, partition_at)."""
        keys = list(keys)
        self.fair_share.released(job_id for job_id, _ in keys)
        return queue.release_unsent(keys)

    def beat(self, in_flight: int = 0) -> None:
        self.maintenance.beat(in_flight, self.delivered, self.failed)

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
        # Payload reads run in the loop's default executor (libcurl resolves names in threads of
        # its own): a thread for every delivery that may be in flight, so that one consumer's slow
        # storage cannot hold up everybody else's reads (Python's default has 6 threads on 2 cores).
        io_threads = ThreadPoolExecutor(self.config.concurrency, thread_name_prefix="dispatch-io")
        asyncio.get_running_loop().set_default_executor(io_threads)
        try:
            async with open_sender(self.config.concurrency) as send:
                await self._loop(send)
        finally:
            await self.threads.close()

    async def _loop(self, send: Send) -> None:
        in_flight: dict[Delivering, DeliveryRequest] = {}
        recording: asyncio.Task[None] | None = None
        next_housekeeping = next_release = 0.0
        loop = asyncio.get_running_loop()
        while not self.stopping or in_flight or self._finished or _running(recording):
            self.health.tick()
            try:
                if loop.time() >= next_housekeeping and not self.stopping:
                    await self._step(self.beat, len(in_flight))
                    await self._step(self.maintenance.sweep)
                    next_housekeeping = loop.time() + HOUSEKEEPING_SECONDS
                if loop.time() >= next_release and not self.stopping:
                    await self._step(self.maintenance.release_due)
                    next_release = loop.time() + RELEASE_SECONDS
                # Answered but unrecorded jobs are still INFLIGHT in the database: counting them
                # keeps what one dispatcher holds, and could deliver twice if it died, within
                # --concurrency.
                room = self.config.concurrency - len(in_flight) - self._unrecorded
                if not self.stopping and room > 0:
                    asked = min(room, self.config.batch_size)
                    claimed = await self._step(self.claim, asked)
                    for request in claimed or []:
                        task = asyncio.create_task(self._send(send, request))
                        task.add_done_callback(lambda _: self._wake.set())
                        in_flight[task] = request
                    await self.idle.claimed(None if claimed is None else len(claimed), asked)
                else:
                    await self.idle.not_claiming()
            except DatabaseDown:
                await asyncio.sleep(self.config.poll_seconds)
                continue
            done = [task for task in in_flight if task.done()]
            self._held_back += self._collect(done, in_flight)
            if self._held_back and not self._finished and not _running(recording):
                # Only once the 429 that held them back is recorded: the claim then skips
                # their consumer, rather than taking them again at once.
                with contextlib.suppress(DatabaseDown):  # else their leases return them
                    await self._step(self.release, self._held_back)
                    self._held_back = []
            if self._finished and not _running(recording):
                recording = asyncio.create_task(self._record(self._finished))
                recording.add_done_callback(lambda _: self._wake.set())
                self._finished = []
            if self.stopping and in_flight:
                await self._drain(in_flight)
            else:
                await self._idle(busy=bool(done), until=next_release)
        with contextlib.suppress(DatabaseDown):
            await self._step(self.maintenance.retire)

    async def _record(self, results: list[AttemptResult]) -> None:
        """Record outcomes in the recording thread while the loop goes on claiming and sending.

        Results that could not be recorded (database down) are kept for a later pass.
        """
        self._recording = len(results)
        try:
            await self.threads.run(self.complete, results, thread=self.threads.recorder)
        except (DatabaseDown, UnrecordedOutcomes) as exc:
            self._finished[:0] = exc.results if isinstance(exc, UnrecordedOutcomes) else results
            await asyncio.sleep(self.config.poll_seconds)
        finally:
            self._recording = 0

    @property
    def _unrecorded(self) -> int:
        return len(self._finished) + self._recording

    def _collect(
        self, done: list[Delivering], in_flight: dict[Delivering, DeliveryRequest]
    ) -> list[JobKey]:
        """Move finished deliveries out of `in_flight`, their results to be recorded; return
        the keys of the jobs held back unsent, to be given back."""
        held_back = []
        for task in done:
            request = in_flight.pop(task)
            result = _result_of(task, request)
            if result is None:
                held_back.append(_key_of(request))
            else:
                self._finished.append(result)
        return held_back

    async def _send(self, send: Send, request: DeliveryRequest) -> AttemptResult | None:
        """Deliver one request, at its slot if it has one (docs/delivery.md, "Rate limit").
        None: held back unsent, its consumer having answered 429 with Retry-After meanwhile."""
        timeout = float(broker_settings.BROKER_DELIVERY_TIMEOUT_SECONDS)
        if request.send_at is not None:
            await asyncio.sleep(max((request.send_at - timezone.now()).total_seconds(), 0))
        if self._throttled_until.get(request.consumer_id, 0.0) > time.monotonic():
            return None
        self.fair_share.sending(request.consumer_id, request.job_id)
        try:
            # `_drain` needs to know which requests went on the wire.
            result = await send(request, timeout, self._sent_marker(request))
        finally:
            self._sent.discard(request.job_id)
        wait = throttle_seconds(result)
        if wait is not None:
            # The claim skips the consumer once the outcome is recorded; this holds back the
            # jobs this dispatcher has already taken.
            self._throttled_until[request.consumer_id] = time.monotonic() + wait
        return result

    def _sent_marker(self, request: DeliveryRequest) -> Callable[[], None]:
        return lambda: self._sent.add(request.job_id)

    async def _idle(self, busy: bool, until: float) -> None:
        """Wait for a finished delivery or recording, a NOTIFY, the time the last claim allows
        (jobs/dispatch_idle.py) or the next release (`until`, loop time), whichever is first."""
        if busy:
            await asyncio.sleep(0)  # claim again right away: slots were just freed
            return
        await self.idle.wait(self._wake, until - asyncio.get_running_loop().time())
        self._wake.clear()

    async def _drain(self, in_flight: dict[Delivering, DeliveryRequest]) -> None:
        """On shutdown: let deliveries finish within the grace period, then cut them off.

        A cut-off request whose headers went out may have reached the consumer: that counts as
        an attempt and is retried by the policy. One that never got that far goes back to the
        queue without using an attempt.
        """
        done, pending = await asyncio.wait(in_flight, timeout=self.config.grace_seconds)
        unsent = self._collect(list(done), in_flight) + self._held_back
        self._held_back = []
        for task in pending:
            task.cancel()
            request = in_flight[task]
            if request.job_id in self._sent:
                self._finished.append(_cut_off(request))
            else:
                unsent.append(_key_of(request))
        if unsent:
            with contextlib.suppress(DatabaseDown):  # their leases will return them
                await self._step(self.release, unsent)
        in_flight.clear()

    async def _step(self, step: Callable[..., T], *args: Any) -> T | None:
        """Run a step of the loop in the claiming thread; None when it failed for anything but
        the database being down or broken: that is logged with its traceback, and the loop
        goes on serving every other job (the step runs again on its next turn)."""
        try:
            return await self.threads.run(step, *args)
        except (DatabaseDown, BrokenDatabase):
            raise
        except Exception:
            logger.exception("dispatcher step %s failed; carrying on", step.__name__)
            await self.threads.drop_connection()
            return None


def _result_of(task: Delivering, request: DeliveryRequest) -> AttemptResult | None:
    """A finished delivery's result; `deliver` never raises, but a task cancelled from outside
    (by the HTTP client, say) counts as cut off rather than ending the loop."""
    return _cut_off(request) if task.cancelled() else task.result()


def _running(task: asyncio.Task[None] | None) -> bool:
    return task is not None and not task.done()


def _cut_off(request: DeliveryRequest) -> AttemptResult:
    return unanswered(request, "shutdown", SHUTDOWN_MESSAGE)


def _unsendable(job: ClaimedJob, consumer: Consumer | None, exc: Exception) -> AttemptResult:
    """The failed attempt of a claimed job whose request could not be made."""
    return AttemptResult(
        job.job_id,
        job.partition_at,
        job.attempt,
        job.consumer_id,
        timezone.now(),
        0.0,
        error_class=REQUEST_ERROR,
        error=f"the request could not be made: {describe_error(exc)}",
        names=names_of_job(job, consumer),
    )


def _key_of(request: DeliveryRequest) -> JobKey:
    return request.job_id, request.partition_at
