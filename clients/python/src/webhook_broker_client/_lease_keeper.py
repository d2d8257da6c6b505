"""Keeps the leases of the jobs a pull worker holds, so a long job is not handed out twice.

A claim leases its jobs for `lease_seconds`. A thread of its own (so that a long poll or a report
retried through a broker restart never delays it) wakes every quarter lease and extends, in one
`POST …/extend`, every held job whose lease has half or less left: each then ends a full lease
from now. A job the broker says is no longer INFLIGHT was swept back when its lease ran out
(another worker may have it now): a waiting one is dropped, a running one is warned about.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from webhook_broker_client._held_jobs import LOG, MAX_BATCH, HeldJobs
from webhook_broker_client.errors import BrokerError
from webhook_broker_client.pull_consumer import PullConsumer


class LeaseKeeper:
    def __init__(self, consumer: PullConsumer, held: HeldJobs, lease_seconds: int) -> None:
        self.consumer = consumer
        self.held = held
        self.lease_seconds = lease_seconds
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._keep, name="webhook-worker-leases", daemon=True)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.done.set()
        self.thread.join(timeout=60)

    def _keep(self) -> None:
        while not self.done.wait(self.lease_seconds / 4):
            due = self.held.leases_ending_before(time.monotonic() + self.lease_seconds / 2)
            for start in range(0, len(due), MAX_BATCH):
                self._extend(due[start : start + MAX_BATCH])

    def _extend(self, job_ids: list[str]) -> None:
        asked_at = time.monotonic()
        try:
            results = self.consumer.extend(job_ids, self.lease_seconds)
        except BrokerError as error:
            LOG.warning("could not extend the leases of %d jobs: %s", len(job_ids), error)
            return
        kept = [result["ID"] for result in results if result.get("Status") == 202]
        self.held.extended(kept, asked_at + self.lease_seconds)
        for result in results:
            if result.get("Status") != 202:
                self._lost(result)

    def _lost(self, result: dict[str, Any]) -> None:
        job_id = result.get("ID", "?")
        doing = self.held.lost(job_id)
        if doing == "waiting":
            LOG.warning(
                "job %s was taken back before it started (%s); dropped", job_id, _why(result)
            )
        elif doing == "running":
            LOG.warning(
                "job %s was taken back while its handler runs (%s); another worker may have it",
                job_id,
                _why(result),
            )


def _why(result: dict[str, Any]) -> str:
    return str(result.get("Error") or f"HTTP {result.get('Status')}")
