"""Wake idle dispatchers when jobs are published (docs/dispatcher.md): LISTEN/NOTIFY on PostgreSQL.
Requeues and replays notify too, on a channel of their own: the claim's lower bound of the
partitions to plan is then worked out again (jobs/partitions/pending.py).

Publishing sends one NOTIFY per statement, delivered by PostgreSQL at commit. The listener needs a
direct connection of its own (a pooler in transaction mode drops LISTEN); when it is lost the
dispatcher keeps polling and the listener reconnects by itself.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

import psycopg
from django.db import connection

from jobs.partitions import pending
from jobs.queue.queries import statement
from jobs.queue.rules import WAKEUP_CHANNEL

logger = logging.getLogger(__name__)

LIBPQ_OPTIONS = {"connect_timeout", "sslmode", "sslrootcert", "sslcert", "sslkey", "options"}
RECONNECT_SECONDS = 2.0


def _connection_kwargs() -> dict[str, Any]:
    settings = connection.settings_dict
    options = {k: v for k, v in settings.get("OPTIONS", {}).items() if k in LIBPQ_OPTIONS}
    return {
        "dbname": settings["NAME"],
        "user": settings["USER"] or None,
        "password": settings["PASSWORD"] or None,
        "host": settings["HOST"] or None,
        "port": settings["PORT"] or None,
        "autocommit": True,
        "application_name": "webhook-broker dispatcher",  # until it says whose
        **options,
    }


async def listen_for_jobs(wake: Callable[[], None], dispatcher_id: str) -> None:
    """Call `wake` on every notification, forever (cancel the task to stop); the connection is
    named after the dispatcher, so others see it alive (jobs/queue/dispatchers.py)."""
    while True:
        try:
            async with await psycopg.AsyncConnection.connect(**_connection_kwargs()) as listener:
                await listener.execute(statement("name_session"), {"dispatcher": dispatcher_id})
                await listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
                await listener.execute(f"LISTEN {pending.REOPENED_CHANNEL}")
                pending.forget()  # jobs may have been requeued while we were not listening
                wake()  # and published
                async for notice in listener.notifies():
                    if notice.channel == pending.REOPENED_CHANNEL:
                        pending.forget()
                    wake()
        except psycopg.Error as exc:
            logger.warning("LISTEN connection lost (%s); polling meanwhile", type(exc).__name__)
            await asyncio.sleep(RECONNECT_SECONDS)
