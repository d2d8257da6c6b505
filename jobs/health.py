"""The dispatcher's liveness and readiness, for container health checks (docs/deploy.md).

`manage.py dispatch --health-port PORT` serves them from a small threaded HTTP server beside the
dispatcher's asyncio loop:

- `GET /livez`: 200 while the loop turns (it ticked within `stale_after` seconds), 503 when it is
  stuck. An orchestrator restarts a process that stays unlive.
- `GET /readyz`: 200 while the last database step succeeded within `stale_after` seconds and none
  has failed since, that is while the dispatcher can claim; 503 before its first step, while the
  database is unreachable, and once it is stopping.

The loop only records monotonic timestamps (attribute assignments, atomic under the GIL) and the
server's threads only read them: a probe never touches the database or waits for the loop, so a
stuck loop cannot hang its own health check.

The housekeeping cluster (`manage.py qcluster`) has a check here too, `overdue_schedules`, which
its container runs as a command.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

logger = logging.getLogger(__name__)

DEFAULT_STALE_AFTER_SECONDS = 60.0
SCHEDULE_SLACK = timedelta(minutes=5)


class Health:
    """What the dispatcher's loop reports about itself, with the clock that dates it."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.started_at = clock()
        self.ticked_at: float | None = None
        self.database_ok_at: float | None = None
        self.database_failed_at: float | None = None
        self.stopping = False

    def tick(self) -> None:
        """The loop went round once."""
        self.ticked_at = self._clock()

    def database_ok(self) -> None:
        """A database step (a claim, a heartbeat, a recording) succeeded."""
        self.database_ok_at = self._clock()

    def database_failed(self) -> None:
        """A database step lost its connection, or could not make one."""
        self.database_failed_at = self._clock()

    def liveness(self, stale_after: float) -> tuple[bool, str]:
        """Whether the loop is making progress, and why not. Before its first turn, the time
        since the process started counts; while stopping it drains, on purpose, for its grace
        period, and stays live."""
        if self.stopping:
            return True, "stopping: draining in-flight deliveries"
        idle = self._clock() - (self.ticked_at if self.ticked_at is not None else self.started_at)
        if idle > stale_after:
            return False, f"the dispatcher's loop has not turned for {idle:.0f} s"
        return True, "the dispatcher's loop is turning"

    def readiness(self, stale_after: float) -> tuple[bool, str]:
        """Whether the dispatcher can claim jobs now, and why not."""
        if self.stopping:
            return False, "stopping: no longer claiming"
        if self.database_ok_at is None:
            return False, "no database step has succeeded yet"
        if self.database_failed_at is not None and self.database_failed_at >= self.database_ok_at:
            return False, "the database is unavailable"
        quiet = self._clock() - self.database_ok_at
        if quiet > stale_after:
            return False, f"no database step has succeeded for {quiet:.0f} s"
        return True, "the last database step succeeded"

    def ages(self) -> dict[str, float | None]:
        """Seconds since each event, for the probe's body (None: not yet)."""
        now = self._clock()

        def age(at: float | None) -> float | None:
            return None if at is None else round(now - at, 3)

        return {
            "lastTickSecondsAgo": age(self.ticked_at),
            "lastDatabaseSuccessSecondsAgo": age(self.database_ok_at),
            "lastDatabaseFailureSecondsAgo": age(self.database_failed_at),
        }


class HealthServer(ThreadingHTTPServer):
    daemon_threads = True  # a probe still being answered never holds up the process's exit

    def __init__(self, address: tuple[str, int], health: Health, stale_after: float) -> None:
        super().__init__(address, _HealthHandler)
        self.health = health
        self.stale_after = stale_after


class _HealthHandler(BaseHTTPRequestHandler):
    server: HealthServer
    timeout = 5  # seconds a connection may idle: an idle client cannot hold a thread for ever

    def do_GET(self) -> None:
        checks = {"/livez": Health.liveness, "/readyz": Health.readiness}
        check = checks.get(self.path.partition("?")[0])
        if check is None:
            self._answer(404, {"status": "not found", "paths": sorted(checks)})
            return
        ok, reason = check(self.server.health, self.server.stale_after)
        body = {"status": "ok" if ok else "unavailable", "reason": reason}
        self._answer(200 if ok else 503, {**body, **self.server.health.ages()})

    def _answer(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        # Probes come every few seconds: not worth a log line each.
        logger.debug("health probe: " + format, *args)


def start_health_server(
    health: Health,
    port: int,
    address: str = "127.0.0.1",
    stale_after: float = DEFAULT_STALE_AFTER_SECONDS,
) -> HealthServer:
    """Serve /livez and /readyz on `address:port` from a daemon thread; `shutdown()` stops it."""
    server = HealthServer((address, port), health, stale_after)
    threading.Thread(target=server.serve_forever, name="dispatch-health", daemon=True).start()
    return server


def overdue_schedules(slack: timedelta = SCHEDULE_SLACK) -> list[str]:
    """The names of django-q2 schedules due more than `slack` ago and not started.

    A working cluster's scheduler starts every due schedule within about 30 seconds, and the
    broker installs one that is due every minute (`install_schedules`): a schedule long overdue
    means that no cluster is running them, or that it cannot reach the database (which raises).
    """
    from django.utils import timezone
    from django_q.models import Schedule  # type: ignore[import-untyped]

    overdue = Schedule.objects.filter(next_run__lt=timezone.now() - slack).exclude(repeats=0)
    return sorted(overdue.values_list("name", flat=True))
