"""Keeps the leases of the jobs a pull worker holds, so a long job is not handed out twice.

A claim leases its jobs for `lease_seconds`. A thread of its own (so that a long poll or a report
retried through a broker restart never delays it) wakes every quarter lease and extends, in one
`POST …/extend`, every held job whose lease has half or less left: each then ends a full lease
from now. Each extension is fenced by the job's `Attempts` as claimed. A job the broker says is
no longer INFLIGHT was swept back when its lease ran out, and one answered 409 was claimed again
since (another worker may have it now): either way the job is no longer the worker's; a waiting
one is dropped, a running one is warned about and its outcome will be dropped.

A handler running longer than `job_timeout` is taken for hung: its job's lease is no longer
extended, so the broker takes the job back when the lease ends and counts the attempt (a job
that hangs its worker every time ends DEAD, as a poison message).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from webhook_broker_client._held_jobs import LOG, MAX_BATCH, Claim, HeldJobs
from webhook_broker_client.errors import BrokerError
from webhook_broker_client.pull_consumer import PullConsumer


class LeaseKeeper:
    def __init__(
        self,
        consumer: PullConsumer,
        held: HeldJobs,
        lease_seconds: int,
        job_timeout: float | None = None,
    ) -> None:
        self.consumer = consumer
        self.held = held
        self.lease_seconds = lease_seconds
        self.job_timeout = job_timeout
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._keep, name="webhook-worker-leases", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=60)

    def _keep(self) -> None:
        while not self.done.wait(self.lease_seconds / 4):
            try:
                self._round()
            except Exception:  # a bug or a strange answer must not end the leases' keeping
                LOG.exception("the lease keeper's round failed; it carries on")

    def _round(self) -> None:
        if self.job_timeout is not None:
            overdue = self.held.give_up_started_before(time.monotonic() - self.job_timeout)
            for claim in overdue:
                LOG.warning(
                    "job %s (message %s) has run past job_timeout (%s s): its lease is no longer"
                    " extended, the broker takes it back when the lease ends (an attempt), and"
                    " its handler's outcome will not be reported",
                    claim.job.id,
                    claim.job.message_id,
                    self.job_timeout,
                )
        due = self.held.leases_ending_before(time.monotonic() + self.lease_seconds / 2)
        for start in range(0, len(due), MAX_BATCH):
            self._extend(due[start : start + MAX_BATCH])

    def _extend(self, claims: list[Claim]) -> None:
        asked_at = time.monotonic()
        try:
            fenced = [(claim.job.id, claim.job.attempts) for claim in claims]
            results = self.consumer.extend(fenced, self.lease_seconds)
        except BrokerError as error:
            LOG.warning("could not extend the leases of %d jobs: %s", len(claims), error)
            return
        kept = []
        for claim, result in zip(claims, results, strict=False):
            if result.get("Status") == 202:
                kept.append(claim)
            else:
                self._lost(claim, result)
        self.held.extended(kept, asked_at + self.lease_seconds)

    def _lost(self, claim: Claim, result: dict[str, Any]) -> None:
        doing = self.held.lost(claim)
        if doing == "waiting":
            LOG.warning(
                "job %s was taken back before it started (%s); dropped", claim.job.id, _why(result)
            )
        elif doing == "running":
            LOG.warning(
                "job %s was taken back while its handler runs (%s); another worker may have it,"
                " and this handler's outcome will be dropped",
                claim.job.id,
                _why(result),
            )
        elif doing == "done":
            LOG.warning(
                "job %s was taken back before its outcome was reported (%s); the outcome is"
                " dropped, another worker may have the job",
                claim.job.id,
                _why(result),
            )


def _why(result: dict[str, Any]) -> str:
    return str(result.get("Error") or f"HTTP {result.get('Status')}")
