"""Dispatchers known to be dead, and the jobs they held (docs/dispatcher.md, "Failures").

A dispatcher beats every second (jobs/maintenance.py) and keeps a direct connection to
PostgreSQL, its LISTEN connection, named after it (sql/dispatchers.sql, `name_session`). One
is known dead when
- its connection is gone and it has not beaten for SILENT_SECONDS: a process that ends, however
  it ends, loses its connection at once (the kernel closes the socket, PostgreSQL ends the
  session). The silence guards against a database restart, which drops every connection of
  every dispatcher: each beats again within a second of being back;
- or it has not beaten for FROZEN_SECONDS, connection or not: a process stopped (SIGSTOP, a VM
  paused) or cut off from the database keeps its connection for a long time.
Its heartbeat row goes, and its INFLIGHT jobs' leases end now: the next lease sweep gives them
back to the queue, or to the DLQ when their attempts are used (jobs/queue/leases.py), seconds
after its death instead of a whole lease later. A dispatcher that was only frozen and comes back
records its outcomes as one whose lease ran out does: the job is left to its new holder, and the
consumer may get the message twice, the at-least-once price.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from django.db import connection, transaction

from jobs.queue.queries import statement

SILENT_SECONDS = 2.0
FROZEN_SECONDS = 15.0


def reclaim_from_dead_dispatchers(me: str, now: datetime) -> int:
    """End the leases of the jobs that dead dispatchers held (never `me`'s own); how many. The
    usual case, nobody dead, is one statement over the heartbeats and touches no job."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            statement("bury_dead_dispatchers"),
            {
                "me": me,
                "silent_since": now - timedelta(seconds=SILENT_SECONDS),
                "frozen_since": now - timedelta(seconds=FROZEN_SECONDS),
            },
        )
        dead = [dispatcher_id for (dispatcher_id,) in cursor.fetchall()]
        if not dead:
            return 0
        cursor.execute(statement("end_their_leases"), {"dead": dead, "now": now})
        return int(cursor.rowcount)
