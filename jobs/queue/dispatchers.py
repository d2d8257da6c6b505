"""Dispatchers known to be dead, and the jobs they held (docs/dispatcher.md, "Failures").

A dispatcher beats every second (jobs/maintenance.py) and keeps a direct connection to
PostgreSQL, its LISTEN connection, named after it (NAME_SESSION_SQL). One is known dead when
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

from jobs.models import DispatcherHeartbeat, Job
from jobs.states import INFLIGHT

SILENT_SECONDS = 2.0
FROZEN_SECONDS = 15.0
SESSION_PREFIX = "webhook-broker dispatcher "

_JOB = Job._meta.db_table


def _session_name(dispatcher_id: str) -> str:
    """SQL: the application_name of the dispatcher whose ID is the SQL expression
    `dispatcher_id`, within PostgreSQL's 63 characters whatever the ID. The one rule, for the
    session that takes the name and for the query that looks for it."""
    return f"'{SESSION_PREFIX}' || left(md5({dispatcher_id}), 16)"


# A dispatcher's LISTEN connection takes its name (jobs/queue/wakeup.py).
NAME_SESSION_SQL = (
    f"SELECT set_config('application_name', {_session_name('%(dispatcher)s')}, false)"
)
# Both clauses of the module's rule: the dead dispatchers' heartbeats go, and say whose they were.
BURY_DEAD_SQL = f"""
DELETE FROM {DispatcherHeartbeat._meta.db_table} beat
WHERE beat.dispatcher_id <> %(me)s AND beat.last_beat_at < %(silent_since)s
    AND (beat.last_beat_at < %(frozen_since)s OR NOT EXISTS (
        SELECT FROM pg_stat_activity session
        WHERE session.application_name = {_session_name("beat.dispatcher_id")}
    ))
RETURNING beat.dispatcher_id
"""  # noqa: S608
# Their jobs' leases end now. The jobs are locked first (a frozen dispatcher's own transaction
# may hold some: they are left to their leases); no statement of the broker waits for another's
# lock.
END_THEIR_LEASES_SQL = f"""
WITH held AS (
    SELECT j.id, j.partition_at FROM {_JOB} j
    WHERE j.status = '{INFLIGHT.value}' AND j.claimed_by = ANY(%(dead)s)
    FOR UPDATE OF j SKIP LOCKED
)
UPDATE {_JOB} j SET lease_expires_at = %(now)s
FROM held WHERE j.id = held.id AND j.partition_at = held.partition_at
    AND j.lease_expires_at > %(now)s
"""  # noqa: S608


def reclaim_from_dead_dispatchers(me: str, now: datetime) -> int:
    """End the leases of the jobs that dead dispatchers held (never `me`'s own); how many. The
    usual case, nobody dead, is one statement over the heartbeats and touches no job."""
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            BURY_DEAD_SQL,
            {
                "me": me,
                "silent_since": now - timedelta(seconds=SILENT_SECONDS),
                "frozen_since": now - timedelta(seconds=FROZEN_SECONDS),
            },
        )
        dead = [dispatcher_id for (dispatcher_id,) in cursor.fetchall()]
        if not dead:
            return 0
        cursor.execute(END_THEIR_LEASES_SQL, {"dead": dead, "now": now})
        return int(cursor.rowcount)
