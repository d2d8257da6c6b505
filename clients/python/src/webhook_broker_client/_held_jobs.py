"""The jobs a pull worker holds, shared by its loop, its handler threads and its lease keeper.

A job is held from the claim that took it until the report of its outcome succeeds: first
waiting (claimed, not started), then running (a handler thread has it), then pending (its
outcome is known, its report not sent yet). It is INFLIGHT at the broker all that time, so its
lease is kept (`kept`) in all three states.

Each claim of a job is a `Claim` of its own, compared by identity: a job whose lease was lost
(or given up past `job_timeout`) may be claimed again by this very worker while its first
handler still runs, and the two must never be taken for each other. A claim that is no longer
`ours` gets no lease extension and its outcome is dropped, never reported.

One condition variable guards everything. Handler threads wake the loop only when it may have
something to do (room to claim, everything finished, a full report), so a batch of quick jobs
does not cost a wake-up per job.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any, NamedTuple

from webhook_broker_client.outcomes import Defer, Job, Reject, Retry, report_item

LOG = logging.getLogger("webhook_broker_client.worker")

# The broker takes at most this many items in one report or extension.
MAX_BATCH = 500

Handler = Callable[[Job], object]


class Claim:
    """One claim of a job by this worker: the job as claimed (its `attempts` fence the claim at
    the broker), the end of its lease, and whether the job is still the worker's."""

    __slots__ = ("job", "lease_ends", "ours", "started_at")

    def __init__(self, job: Job, lease_ends: float) -> None:
        self.job = job
        self.lease_ends = lease_ends
        self.started_at: float | None = None  # monotonic, once a handler took it
        self.ours = True


class Outcome(NamedTuple):
    """A report item waiting to be sent, and the claim it ends (None: a job never held)."""

    claim: Claim | None
    item: dict[str, Any]


class HeldJobs:
    def __init__(self, concurrency: int, prefetch: int) -> None:
        # Reentrant: stop() may run in a signal handler on a thread that holds the lock.
        self.changed = threading.Condition(threading.RLock())
        self.concurrency = concurrency
        self.capacity = concurrency + prefetch
        self.waiting: deque[Claim] = deque()
        self.running: set[Claim] = set()  # a hung handler's claim stays here, given up or not
        self.pending: list[Outcome] = []  # report items not sent yet
        self.pending_since = 0.0  # monotonic time the oldest of them was added
        self.kept: dict[str, Claim] = {}  # job ID -> the claim whose lease the worker keeps
        self.stopping = False

    # --- the loop ---------------------------------------------------------------------------

    def room(self) -> int:
        """How many jobs a claim may take now."""
        return self.capacity - len(self.waiting) - len(self.running)

    def add_claimed(self, jobs: Iterable[Job], lease_ends: float) -> None:
        with self.changed:
            for job in jobs:
                claim = Claim(job, lease_ends)
                self.kept[job.id] = claim
                self.waiting.append(claim)
            self.changed.notify_all()

    def add_outcome(self, item: dict[str, Any], claim: Claim | None = None) -> None:
        """An outcome decided without a handler (unstarted at stop, or its payload gone)."""
        with self.changed:
            self._pend(Outcome(claim, item))

    def take_outcomes(self) -> list[Outcome]:
        with self.changed:
            outcomes, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            if self.pending:
                self.pending_since = time.monotonic()
            return outcomes

    def put_back_outcomes(self, outcomes: list[Outcome]) -> None:
        """A report that failed: its outcomes wait for the next one, first in line."""
        with self.changed:
            if not self.pending:
                self.pending_since = time.monotonic()
            self.pending[:0] = outcomes

    def release(self, outcomes: Iterable[Outcome]) -> None:
        """Reported: no longer held, no lease to keep."""
        with self.changed:
            for claim, _ in outcomes:
                if claim is not None and self.kept.get(claim.job.id) is claim:
                    del self.kept[claim.job.id]

    def busy(self) -> list[Claim]:
        """The running claims still the worker's (a handler given up past job_timeout is not
        waited for: its outcome would be dropped anyway)."""
        with self.changed:
            return [claim for claim in self.running if claim.ours]

    def stop_starting(self) -> None:
        """No job starts from now on (the handler threads end once their jobs are done)."""
        with self.changed:
            self.stopping = True
            self.changed.notify_all()

    def begin_stop(self) -> list[Claim]:
        """No job starts from now on; the jobs waiting are returned, to be given back."""
        with self.changed:
            self.stop_starting()
            unstarted = list(self.waiting)
            self.waiting.clear()
            return unstarted

    # --- the lease keeper -------------------------------------------------------------------

    def leases_ending_before(self, moment: float) -> list[Claim]:
        with self.changed:
            return [claim for claim in self.kept.values() if claim.lease_ends <= moment]

    def extended(self, claims: Iterable[Claim], lease_ends: float) -> None:
        with self.changed:
            for claim in claims:
                claim.lease_ends = lease_ends

    def give_up_started_before(self, moment: float) -> list[Claim]:
        """Running claims whose handler started before `moment` (past `job_timeout`): their
        leases are no longer kept, so the broker takes the jobs back, counting the attempt."""
        with self.changed:
            overdue = [
                claim
                for claim in self.running
                if claim.ours and claim.started_at is not None and claim.started_at < moment
            ]
            for claim in overdue:
                self._forget(claim)
            return overdue

    def lost(self, claim: Claim) -> str | None:
        """The broker took the job back (its lease ran out, or it was claimed again since):
        forget it. Returns what the worker was doing with it, "waiting", "running" or "done"
        (an outcome not reported yet, now dropped), or None (already reported)."""
        with self.changed:
            if self.kept.get(claim.job.id) is not claim:
                return None
            self._forget(claim)
            if claim in self.running:
                return "running"
            if claim in self.waiting:
                self.waiting.remove(claim)
                self.changed.notify_all()  # room to claim
                return "waiting"
            before = len(self.pending)
            self.pending = [outcome for outcome in self.pending if outcome.claim is not claim]
            return "done" if len(self.pending) < before else None

    def _forget(self, claim: Claim) -> None:
        claim.ours = False
        if self.kept.get(claim.job.id) is claim:
            del self.kept[claim.job.id]

    # --- the handler threads ----------------------------------------------------------------

    def next_job(self) -> Claim | None:
        """The next job to run, once there is one; None when the worker stops."""
        with self.changed:
            while not self.waiting and not self.stopping:
                self.changed.wait()
            if self.stopping:
                return None
            claim = self.waiting.popleft()
            claim.started_at = time.monotonic()
            self.running.add(claim)
            if not self.waiting:
                self.changed.notify_all()  # room to claim, at the loop's low-water mark
            return claim

    def finished(self, claim: Claim, item: dict[str, Any]) -> None:
        with self.changed:
            self.running.discard(claim)
            if claim.ours:
                self._pend(Outcome(claim, item))
                return
            self.changed.notify_all()  # a slot a hung handler held is free again
        LOG.warning(
            "job %s's handler returned after the job was taken back (lease lost or job_timeout"
            " passed): its outcome (%s) is dropped, another worker may have the job",
            claim.job.id,
            item["NextState"],
        )

    def _pend(self, outcome: Outcome) -> None:
        if not self.pending:
            self.pending_since = time.monotonic()
        self.pending.append(outcome)
        idle = not self.waiting and len(self.running) < self.concurrency
        if idle or len(self.pending) >= MAX_BATCH:
            self.changed.notify_all()


def handle(handler: Handler, job: Job) -> dict[str, Any]:
    """Run the handler on one job; the report item of its outcome."""
    try:
        handler(job)
    except BaseException as raised:
        if not isinstance(raised, Retry | Reject | Defer):
            LOG.exception("handler failed on job %s (message %s)", job.id, job.message_id)
        return report_item(job.id, raised)
    return report_item(job.id, None)


def start_handler_threads(held: HeldJobs, handler: Handler) -> list[threading.Thread]:
    """`concurrency` threads that run jobs until the worker stops."""

    def serve() -> None:
        while True:
            try:
                if (claim := held.next_job()) is None:
                    return
                held.finished(claim, handle(handler, claim.job))
            except Exception:  # the worker's own code: the handler's errors are outcomes
                LOG.exception("a handler thread hit an error of the worker; it carries on")

    threads = [
        threading.Thread(target=serve, name=f"webhook-worker-handler-{n}", daemon=True)
        for n in range(held.concurrency)
    ]
    for thread in threads:
        thread.start()
    return threads
