"""Which implementation of the queue serves this connection: the one question of database vendor
the queue asks, so that its callers never do."""

from __future__ import annotations

from django.db import connection

from jobs.queue.portable import PortableQueue
from jobs.queue.postgres import PostgresQueue

_POSTGRES, _PORTABLE = PostgresQueue(), PortableQueue()


def implementation() -> PostgresQueue | PortableQueue:
    return _POSTGRES if connection.vendor == "postgresql" else _PORTABLE
