"""The wake-up protocol seen from outside (jobs/queue/wakeup.py): a connection that LISTENs (and
may guard, as an idle dispatcher does), the NOTIFYs it gets, and which sessions hold the guard."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from django.db import connection

from jobs.queue.queries import statement
from jobs.queue.rules import SESSION_PREFIX, WAKEUP_CHANNEL, WAKEUP_GUARD_LOCK
from jobs.queue.wakeup import _connection_kwargs


@contextmanager
def listening(guard: bool = False) -> Iterator[psycopg.Connection]:
    """A connection that LISTENs on the wake-up channel; with `guard`, it also holds the guard,
    as an idle dispatcher's does, so that publishes NOTIFY."""
    with psycopg.connect(**_connection_kwargs()) as listener:
        listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
        if guard:
            assert try_to_guard(listener) == "held"
        yield listener


def try_to_guard(session: psycopg.Connection) -> str:
    """What `try_to_guard` (sql/wakeup.sql) finds, run on `session`."""
    row = session.execute(statement("try_to_guard")).fetchone()
    assert row is not None
    return str(row[0])


def notified(listener: psycopg.Connection, seconds: float) -> list[str]:
    """The channels of the NOTIFYs `listener` gets within `seconds`."""
    return [notice.channel for notice in listener.notifies(timeout=seconds)]


def guard_holders() -> list[str]:
    """The application_name of each session that holds the guard in this database (advisory
    locks are a database's own; a dispatcher's LISTEN connection is named after it:
    `session_name`)."""
    high, low = divmod(WAKEUP_GUARD_LOCK, 1 << 32)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT activity.application_name FROM pg_locks held"
            " JOIN pg_stat_activity activity ON activity.pid = held.pid"
            " WHERE held.locktype = 'advisory' AND held.mode = 'ExclusiveLock' AND held.granted"
            " AND held.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
            " AND held.classid = %s AND held.objid = %s AND held.objsubid = 1",
            [high, low],
        )
        return [name for (name,) in cursor.fetchall()]


def session_name(dispatcher_id: str) -> str:
    """The application_name of a dispatcher's LISTEN connection (sql/dispatchers.sql)."""
    return SESSION_PREFIX + hashlib.md5(dispatcher_id.encode()).hexdigest()[:16]  # noqa: S324
