"""The pull worker: claims jobs in batches, runs a handler on each, reports outcomes in batches.

    worker = Worker(url, "orders", "erp", channel_token, consumer_token, concurrency=4, prefetch=46)
    worker.run(handle)          # blocks until worker.stop(), SIGTERM or SIGINT

One loop (the thread that calls `run`) claims up to `concurrency + prefetch` jobs, minus those it
holds, whenever no claimed job is left waiting; `concurrency` handler threads take the jobs one
by one (with one, the loop runs them itself); the loop reports their outcomes together, before
each claim, once everything it holds is done, or when the oldest has waited `flush_seconds`: a
batch of quick jobs costs two requests whatever its size. A thread of its own extends the leases
of the jobs held (_lease_keeper.py). Outcomes: outcomes.py. For users: the README's "Pull worker".
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType

from webhook_broker_client._held_jobs import (
    LOG,
    MAX_BATCH,
    Handler,
    HeldJobs,
    Outcome,
    handle,
    start_handler_threads,
)
from webhook_broker_client._http import RetryPolicy, is_transient
from webhook_broker_client._lease_keeper import LeaseKeeper
from webhook_broker_client._reports import log_refused, log_results, report_items
from webhook_broker_client.errors import BrokerError
from webhook_broker_client.outcomes import dead, given_back_unstarted, job_from_claim
from webhook_broker_client.pull_consumer import PullConsumer

DEFAULT_LEASE_SECONDS = 60
DEFAULT_JOB_TIMEOUT_SECONDS = 3600.0
MAX_CLAIM = 100  # the broker's largest `limit`
# While handlers run, a claim that finds nothing waits at most this long, so that the outcomes
# they produce meanwhile are not held back longer.
BUSY_WAIT_SECONDS = 1.0
# How long the worker waits before trying a broker that failed again, at first and at most.
FIRST_BACKOFF_SECONDS, MAX_BACKOFF_SECONDS = 0.5, 30.0


class Worker:
    """A pull consumer's worker. Options:

    - `concurrency`: handlers running at once (threads); `prefetch`: jobs held beyond those,
      claimed ahead so the handlers never wait for a claim. A claim takes up to
      `concurrency + prefetch` jobs (at most 100).
    - `lease_seconds`: how long each claimed job is leased (an integer, at least 2); the worker
      extends the lease of every job it holds when half of it is left, so a handler may run
      longer than the lease. When not given: `incremental_timeout` (webhook-broker's name for
      how long a job may stay in flight) if given, else 60.
    - `job_timeout`: the longest a handler may run, in seconds (3600; None for no limit). Past
      it the worker stops extending the job's lease: the broker takes the job back when the
      lease ends, counting the attempt, and hands it out again; the handler's outcome, if it
      ever returns, is dropped. Its thread is busy until then (one handler slot fewer).
    - `grace_seconds`: on stop, how long handlers in progress may take to finish (30).
    - `wait_seconds`: how long an idle worker's claim waits for jobs (the long poll; the broker
      waits 20 s at most); also the longest a stop waits for a claim under way (5).
    - `flush_seconds`: the longest an outcome waits for the next report (1).
    - `retry`: the HTTP retry rule of each request (`RetryPolicy`); beyond it, the worker keeps
      trying, backing off up to 30 s, until it is stopped: a broker restart never ends it.
    """

    def __init__(
        self,
        base_url: str,
        channel_id: str,
        consumer_id: str,
        channel_token: str,
        consumer_token: str,
        *,
        concurrency: int = 1,
        prefetch: int = 0,
        incremental_timeout: int | None = None,
        lease_seconds: int | None = None,
        job_timeout: float | None = DEFAULT_JOB_TIMEOUT_SECONDS,
        grace_seconds: float = 30.0,
        wait_seconds: float = 5.0,
        flush_seconds: float = 1.0,
        retry: RetryPolicy | None = None,
    ) -> None:
        if concurrency < 1 or prefetch < 0:
            raise ValueError("concurrency must be at least 1 and prefetch at least 0")
        lease = lease_seconds or incremental_timeout or DEFAULT_LEASE_SECONDS
        if not 2 <= lease <= 86400:
            raise ValueError(f"the lease must be from 2 to 86400 s, not {lease}")
        if job_timeout is not None and job_timeout <= 0:
            raise ValueError(f"job_timeout must be positive (or None), not {job_timeout}")
        self.base_url = base_url
        self.channel_id = channel_id
        self.consumer_id = consumer_id
        self._tokens = (channel_token, consumer_token)
        self.concurrency = concurrency
        self.prefetch = prefetch
        self.lease_seconds = int(lease)
        self.job_timeout = job_timeout
        self.grace_seconds = grace_seconds
        self.wait_seconds = wait_seconds
        self.flush_seconds = flush_seconds
        self.retry = retry
        self._stop = threading.Event()
        self._held: HeldJobs | None = None

    def run(self, handler: Handler) -> None:
        """Handle jobs until stopped; returns once handlers finished and outcomes are reported.

        Raises a BrokerError only for a refusal that trying again cannot fix (wrong tokens, an
        unknown channel or consumer, not a pull consumer), after stopping as on `stop()`; any
        other error of the loop (an answer that is not the broker's JSON) likewise.
        """
        held = HeldJobs(self.concurrency, self.prefetch)
        with held.changed:
            self._held = held
            if self._stop.is_set():  # stopped before it ran
                held.stop_starting()
        consumer = PullConsumer(
            self.base_url,
            self.channel_id,
            self.consumer_id,
            *self._tokens,
            timeout=self.wait_seconds + 30,  # a long poll is not a timeout
            retry=self.retry,
        )
        try:
            with consumer, _stopped_by_signals(self.stop):
                _Loop(self, consumer, held).run(handler)
        finally:
            self._stop.clear()
            self._held = None

    def stop(self) -> None:
        """Stop claiming and wind down (safe from any thread, and from a signal handler). No
        handler starts a job from now on, even while a claim or a report is still under way."""
        self._stop.set()
        held = self._held
        if held is not None:
            held.stop_starting()


@contextlib.contextmanager
def _stopped_by_signals(stop: Callable[[], None]) -> Iterator[None]:
    """SIGTERM and SIGINT stop the worker while it runs in the main thread (signals can only be
    handled there); the previous handlers come back after."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_signal(number: int, frame: FrameType | None) -> None:
        LOG.info("%s received: stopping", signal.Signals(number).name)
        stop()

    previous = {number: signal.signal(number, on_signal) for number in _STOP_SIGNALS}
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler if handler is not None else signal.SIG_DFL)


_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Backoff:
    """Growing waits between tries of a broker that keeps failing, reset by a success."""

    def __init__(self) -> None:
        self.failures = 0

    def next_delay(self) -> float:
        self.failures += 1
        ceiling = min(MAX_BACKOFF_SECONDS, FIRST_BACKOFF_SECONDS * 2 ** (self.failures - 1))
        return random.uniform(ceiling / 2, ceiling)  # noqa: S311 - jitter, not a secret

    def reset(self) -> None:
        self.failures = 0


class _Loop:
    """One run of a worker: the claims, the reports, and the stop."""

    def __init__(self, worker: Worker, consumer: PullConsumer, held: HeldJobs) -> None:
        self.worker = worker
        self.consumer = consumer
        self.held = held
        self.stop_requested = worker._stop
        self.claim_not_before = 0.0
        self.flush_not_before = 0.0
        self.claim_backoff = _Backoff()
        self.flush_backoff = _Backoff()
        self.inline_handler: Handler | None = None  # concurrency 1: jobs run on this thread

    def run(self, handler: Handler) -> None:
        worker = self.worker
        keeper = LeaseKeeper(self.consumer, self.held, worker.lease_seconds, worker.job_timeout)
        # One job at a time runs on this very thread: no hand-off between threads twice a batch,
        # which on a busy machine costs a scheduler's wake-up each (bench/pull.py --worker).
        if worker.concurrency == 1:
            self.inline_handler = handler
        else:
            start_handler_threads(self.held, handler)
        keeper.start()
        try:
            while not self.stop_requested.is_set():
                self._round()
        except BrokerError as error:
            LOG.error("stopping: the broker refused the worker (%s)", error)
            raise
        except Exception:
            LOG.exception("stopping: the worker's loop failed")
            raise
        finally:
            # Whatever ended the loop, the handlers stop starting jobs, the outcomes known are
            # reported, and the lease keeper ends with the run.
            try:
                self._wind_down()
            finally:
                keeper.stop()

    # --- a round of the loop ----------------------------------------------------------------

    def _round(self) -> None:
        """Claim, report, or wait until one of them is due (or the worker stops); with one
        handler, run the next job held first."""
        held = self.held
        if self.inline_handler is not None and held.waiting:
            self._run_next(self.inline_handler)
            return
        with held.changed:
            if self.stop_requested.is_set():
                return
            now = time.monotonic()
            limit = self._claim_limit(now)
            flush = bool(held.pending) and now >= self.flush_not_before
            flush = flush and (limit > 0 or self._flush_due(now))
            if not limit and not flush:
                held.changed.wait(self._sleep(now))
                return
        if flush and not self._flush():
            return  # the broker failed: no claim either, until it answers again
        if limit:
            self._claim(limit)

    def _run_next(self, handler: Handler) -> None:
        """The next job held, run on the loop's thread (concurrency 1); outcomes that have
        waited `flush_seconds` are reported first, so slow jobs do not hold them back."""
        if self.held.pending and self._flush_due(time.monotonic()):
            self._flush()
        claim = self.held.next_job()  # not None: a job waits, and only this thread takes jobs
        if claim is not None:
            self.held.finished(claim, handle(handler, claim.job))

    def _claim_limit(self, now: float) -> int:
        """How many jobs to claim now: none while jobs wait for a handler (the low-water mark is
        an empty waiting line) or while a Retry-After or a backoff runs."""
        if now < self.claim_not_before or self.held.waiting:
            return 0
        return max(0, min(MAX_CLAIM, self.held.room()))

    def _flush_due(self, now: float) -> bool:
        held = self.held
        return (
            (not held.waiting and not held.running)
            or len(held.pending) >= MAX_BATCH
            or now - held.pending_since >= self.worker.flush_seconds
        )

    def _sleep(self, now: float) -> float:
        """Until the next report or claim falls due; woken earlier by the handler threads."""
        moments = [now + 1.0]  # an upper bound: a missed wake-up costs a second, never a hang
        if self.held.pending:
            flush_at = self.held.pending_since + self.worker.flush_seconds
            moments.append(max(flush_at, self.flush_not_before))
        if not self.held.waiting and self.held.room() > 0:
            moments.append(self.claim_not_before)
        return max(0.0, min(moments) - now)

    # --- requests -----------------------------------------------------------------------------

    def _claim(self, limit: int) -> None:
        held = self.held
        idle = not held.running and not held.pending
        wait = self.worker.wait_seconds
        if not idle:
            wait = min(BUSY_WAIT_SECONDS, wait)
        asked_at = time.monotonic()
        try:
            claimed = self.consumer.claim(limit, lease_seconds=self.worker.lease_seconds, wait=wait)
        except BrokerError as error:
            if not is_transient(error):
                raise
            delay = self.claim_backoff.next_delay()
            LOG.warning("claim failed (%s); trying again in %.1f s", error, delay)
            self.claim_not_before = time.monotonic() + delay
            return
        self.claim_backoff.reset()
        jobs = []
        for entry in claimed.jobs:
            job = job_from_claim(entry)
            if job is None:  # its payload is gone: nothing a handler could do with it
                held.add_outcome(dead(entry["ID"], "payload-missing"))
            else:
                jobs.append(job)
        held.add_claimed(jobs, asked_at + self.worker.lease_seconds)
        if not claimed.jobs and claimed.retry_after is not None:  # no waiting place was free
            self.claim_not_before = time.monotonic() + claimed.retry_after

    def _flush(self) -> bool:
        """Report the pending outcomes; False when the broker could not be reached."""
        outcomes = self.held.take_outcomes()
        if not outcomes:
            return True
        try:
            results = self.consumer.report(report_items(outcomes))
        except BrokerError as error:
            if is_transient(error):
                self._report_later(outcomes, error)
                return False
            if error.status == 400 and len(outcomes) > 1:
                # One item the broker refuses refuses the whole report: find it, send the rest.
                LOG.warning(
                    "the broker refused a report of %d outcomes (%s); reporting them one by one",
                    len(outcomes),
                    error,
                )
                return self._report_one_by_one(outcomes)
            log_refused(outcomes, error)
        else:
            self.flush_backoff.reset()
            log_results(outcomes, results)
        self.held.release(outcomes)
        return True

    def _report_one_by_one(self, outcomes: list[Outcome]) -> bool:
        for index, outcome in enumerate(outcomes):
            try:
                results = self.consumer.report(report_items([outcome]))
            except BrokerError as error:
                if is_transient(error):
                    self.held.release(outcomes[:index])
                    self._report_later(outcomes[index:], error)
                    return False
                log_refused([outcome], error)
            else:
                log_results([outcome], results)
        self.flush_backoff.reset()
        self.held.release(outcomes)
        return True

    def _report_later(self, outcomes: list[Outcome], error: BrokerError) -> None:
        self.held.put_back_outcomes(outcomes)
        delay = self.flush_backoff.next_delay()
        LOG.warning("report failed (%s); trying again in %.1f s", error, delay)
        self.flush_not_before = time.monotonic() + delay

    # --- the stop -----------------------------------------------------------------------------

    def _wind_down(self) -> None:
        """Give back what did not start, let what runs finish within the grace, report it all."""
        held = self.held
        unstarted = held.begin_stop()
        for claim in unstarted:
            held.add_outcome(given_back_unstarted(claim.job.id), claim)
        LOG.info(
            "stopping: %d jobs given back unstarted, %d handlers finishing",
            len(unstarted),
            len(held.busy()),
        )
        deadline = time.monotonic() + self.worker.grace_seconds
        while (held.busy() or held.pending) and time.monotonic() < deadline:
            if held.pending and time.monotonic() >= self.flush_not_before:
                self._flush()
                continue
            with held.changed:
                until = self.flush_not_before if held.pending else time.monotonic() + 1.0
                held.changed.wait(max(0.0, min(deadline, until) - time.monotonic()))
        if held.pending:  # a handler finished at the deadline, or the broker was failing
            self.flush_not_before = 0.0
            self._flush()
        if held.busy():
            LOG.warning(
                "stopped with handlers still running after the %s s grace; their jobs come back"
                " when their leases end: %s",
                self.worker.grace_seconds,
                ", ".join(claim.job.id for claim in held.busy()),
            )
        if held.pending:
            LOG.error(
                "stopped without reporting %d outcomes (the broker did not answer); their jobs"
                " come back when their leases end: %s",
                len(held.pending),
                ", ".join(outcome.item["ID"] for outcome in held.pending),
            )
