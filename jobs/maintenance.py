"""The work every dispatcher does beside delivering: its heartbeat, the lease sweep, the age
limit, and the release of scheduled messages and periodic ticks.

Each is a step of its own, one short transaction, that the dispatcher's loop runs on its
schedule (jobs/dispatch.py) and tests call directly. Any number of dispatchers run them at once:
each operation is safe to run concurrently (jobs/queue).
"""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass, field
from datetime import datetime

from django.utils import timezone

from broker.periodic import run_due_ticks
from jobs import queue
from jobs.models import DispatcherHeartbeat

# Heartbeat, dead dispatchers' jobs and the lease sweep: a dispatcher's death is seen, and its
# jobs back in the queue, within a few seconds (jobs/queue/dispatchers.py).
HOUSEKEEPING_SECONDS = 1.0
EXPIRY_SECONDS = 60.0  # jobs past their age limit (jobs/queue/expiry.py)
RELEASE_SECONDS = 0.5  # scheduled messages and periodic ticks: released within a second


@dataclass
class Maintenance:
    dispatcher_id: str
    started_at: datetime = field(default_factory=timezone.now)
    _next_expiry: float = 0.0  # monotonic time of the next expiry sweep

    def beat(self, in_flight: int, delivered: int, failed: int) -> None:
        """Say that this dispatcher is alive, and what it is doing (UI and /_status)."""
        DispatcherHeartbeat.objects.update_or_create(
            dispatcher_id=self.dispatcher_id,
            defaults={
                "hostname": socket.gethostname(),
                "pid": os.getpid(),
                "started_at": self.started_at,
                "last_beat_at": timezone.now(),
                "in_flight": in_flight,
                "delivered": delivered,
                "failed": failed,
            },
        )

    def retire(self) -> None:
        DispatcherHeartbeat.objects.filter(dispatcher_id=self.dispatcher_id).delete()

    def sweep(self) -> int:
        """Jobs of dead dispatchers and expired leases back to the queue; once a minute, jobs
        past their age limit to the DLQ (a limit counts in days, and its sweep makes a query
        per consumer)."""
        queue.reclaim_from_dead_dispatchers(self.dispatcher_id)
        moved = queue.sweep_expired_leases()
        if time.monotonic() >= self._next_expiry:
            moved += queue.expire_old_jobs()
            self._next_expiry = time.monotonic() + EXPIRY_SECONDS
        return moved

    def release_due(self) -> int:
        """Release due scheduled messages and publish due periodic ticks (every dispatcher does,
        exactly once between them); return how many messages that made. Their jobs wake the
        dispatchers as a publish does."""
        released = 0
        while (batch := queue.release_due_messages()) == queue.RELEASE_BATCH:  # more may be due
            released += batch
        return released + batch + run_due_ticks()
