"""The jobs a pull worker holds, shared by its loop, its handler threads and its lease keeper.

A job is held from the claim that took it until the report of its outcome succeeds: first
waiting (claimed, not started), then running (a handler thread has it), then pending (its
outcome is known, its report not sent yet). It is INFLIGHT at the broker all that time, so its
lease is kept (`leases`) in all three states.

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
from typing import Any

from webhook_broker_client.outcomes import Defer, Job, Reject, Retry, report_item

LOG = logging.getLogger("webhook_broker_client.worker")

# The broker takes at most this many items in one report or extension.
MAX_BATCH = 500

Handler = Callable[[Job], object]


class HeldJobs:
    def __init__(self, concurrency: int, prefetch: int) -> None:
        # Reentrant: stop() may run in a signal handler on a thread that holds the lock.
        self.changed = threading.Condition(threading.RLock())
        self.concurrency = concurrency
        self.capacity = concurrency + prefetch
        self.waiting: deque[Job] = deque()
        self.running: dict[str, Job] = {}
        self.pending: list[dict[str, Any]] = []  # report items not sent yet
        self.pending_since = 0.0  # monotonic time the oldest of them was added
        self.leases: dict[str, float] = {}  # job ID -> monotonic end of its lease
        self.stopping = False

    # --- the loop ---------------------------------------------------------------------------

    def room(self) -> int:
        """How many jobs a claim may take now."""
        return self.capacity - len(self.waiting) - len(self.running)

    def add_claimed(self, jobs: Iterable[Job], lease_ends: float) -> None:
        with self.changed:
            for job in jobs:
                self.leases[job.id] = lease_ends
                self.waiting.append(job)
            self.changed.notify_all()

    def add_outcome(self, item: dict[str, Any]) -> None:
        """An outcome decided without a handler (a job whose payload is gone)."""
        with self.changed:
            self._pend(item)

    def take_outcomes(self) -> list[dict[str, Any]]:
        with self.changed:
            items, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            if self.pending:
                self.pending_since = time.monotonic()
            return items

    def put_back_outcomes(self, items: list[dict[str, Any]]) -> None:
        """A report that failed: its outcomes wait for the next one, first in line."""
        with self.changed:
            if not self.pending:
                self.pending_since = time.monotonic()
            self.pending[:0] = items

    def release(self, job_ids: Iterable[str]) -> None:
        """Reported: no longer held, no lease to keep."""
        with self.changed:
            for job_id in job_ids:
                self.leases.pop(job_id, None)

    def begin_stop(self) -> list[Job]:
        """No job starts from now on; the jobs waiting are returned, to be given back."""
        with self.changed:
            self.stopping = True
            unstarted = list(self.waiting)
            self.waiting.clear()
            self.changed.notify_all()
            return unstarted

    # --- the lease keeper -------------------------------------------------------------------

    def leases_ending_before(self, moment: float) -> list[str]:
        with self.changed:
            return [job_id for job_id, ends in self.leases.items() if ends <= moment]

    def extended(self, job_ids: Iterable[str], lease_ends: float) -> None:
        with self.changed:
            for job_id in job_ids:
                if job_id in self.leases:
                    self.leases[job_id] = lease_ends

    def lost(self, job_id: str) -> str | None:
        """The broker took the job back (its lease ran out): forget it. Returns what the worker
        was doing with it, "waiting" or "running" (worth a warning), or None (already done)."""
        with self.changed:
            if self.leases.pop(job_id, None) is None:
                return None
            if job_id in self.running:
                return "running"
            for job in self.waiting:
                if job.id == job_id:
                    self.waiting.remove(job)
                    return "waiting"
            return None  # its outcome is pending: the report will say what became of it

    # --- the handler threads ----------------------------------------------------------------

    def next_job(self) -> Job | None:
        """The next job to run, once there is one; None when the worker stops."""
        with self.changed:
            while not self.waiting and not self.stopping:
                self.changed.wait()
            if self.stopping:
                return None
            job = self.waiting.popleft()
            self.running[job.id] = job
            if not self.waiting:
                self.changed.notify_all()  # room to claim, at the loop's low-water mark
            return job

    def finished(self, job_id: str, item: dict[str, Any]) -> None:
        with self.changed:
            del self.running[job_id]
            self._pend(item)

    def _pend(self, item: dict[str, Any]) -> None:
        if not self.pending:
            self.pending_since = time.monotonic()
        self.pending.append(item)
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
        while (job := held.next_job()) is not None:
            held.finished(job.id, handle(handler, job))

    threads = [
        threading.Thread(target=serve, name=f"webhook-worker-handler-{n}", daemon=True)
        for n in range(held.concurrency)
    ]
    for thread in threads:
        thread.start()
    return threads
