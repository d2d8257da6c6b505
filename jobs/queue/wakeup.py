"""Waking idle dispatchers (docs/dispatcher.md, "Waking up"): LISTEN/NOTIFY on PostgreSQL, sent
only while a dispatcher guards, so that commits under load do not take turns.

PostgreSQL lets transactions that NOTIFY commit one at a time (a lock held through each one's WAL
flush): every publish notifying held single publishes to about half of what they reach without.
So a publish NOTIFYs only while some dispatcher waits for work, and the lost wake-up is ruled out
with one advisory lock, the guard (sql/wakeup.sql):

- A dispatcher that has caught up (its claim came back empty) tries to take the guard, exclusive,
  on its LISTEN connection, where it is held until given back or the connection ends (a
  dispatcher that dies takes its guard with it).
- A publishing statement tries to take the guard shared, for its transaction. When it cannot (a
  dispatcher guards), it NOTIFYs, delivered at commit to every listening dispatcher. When it can,
  it sends nothing, and holds the shared lock until its transaction ends.
- So the exclusive try succeeds only when no publishing transaction without a NOTIFY is open:
  every job those made is committed and visible to a new snapshot (PostgreSQL releases a
  transaction's locks after making its commit visible). The dispatcher then claims once more, and
  waits only if that claim is empty too; every later publish finds the guard held and NOTIFYs.
- The try fails either because publishing transactions are open (the dispatcher claims again
  after a few milliseconds, backing off; jobs/dispatch_idle.py) or because another dispatcher
  guards (the NOTIFYs it makes publishers send reach every listener; the dispatcher tries again
  at its next turn, in case that one died).
- A dispatcher that gets work gives the guard back: under load nobody guards and publishes commit
  without a NOTIFY; it tries again when a claim of its comes back empty, before it waits.

Requeues and replays notify too, on a channel of their own, whoever guards: the claim's lower
bound of the partitions to plan is then worked out again (jobs/partitions/pending.py).

The listener needs a direct connection of its own (a pooler in transaction mode drops LISTEN and
session locks); when it is lost the dispatcher polls and the listener reconnects by itself.
Notifications are read from the socket by an event-loop reader between the guard's statements.
"""

from __future__ import annotations

import asyncio
import enum
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


class Guard(enum.Enum):
    """What a try to take the guard found."""

    HELD = "held"  # this dispatcher guards now: publishes NOTIFY
    PUBLISHING = "publishing"  # publishing transactions without a NOTIFY are open
    HELD_ELSEWHERE = "held elsewhere"  # another dispatcher guards
    UNAVAILABLE = "unavailable"  # no LISTEN connection at the moment


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


class Listener:
    """A dispatcher's LISTEN connection and the guard held on it. `run` keeps the connection (and
    calls `wake` on every notification); the dispatcher's loop, on the same event loop, takes and
    gives back the guard. The connection is named after the dispatcher, so others see it alive
    (jobs/queue/dispatchers.py)."""

    def __init__(self, wake: Callable[[], None], dispatcher_id: str) -> None:
        self.wake = wake
        self.dispatcher_id = dispatcher_id
        self.guarding = False
        self._connection: psycopg.AsyncConnection[Any] | None = None
        self._lost: asyncio.Future[BaseException] | None = None
        self._watched: int | None = None  # the socket the event loop reads for us
        self._statements = asyncio.Lock()  # one statement at a time on the connection

    async def run(self) -> None:
        """Listen forever (cancel the task to stop: the connection, and the guard, go)."""
        while True:
            try:
                await self._listen()
            except psycopg.Error as exc:
                logger.warning("LISTEN connection lost (%s); polling meanwhile", type(exc).__name__)
            self.wake()  # nobody may guard now: look at the queue
            await asyncio.sleep(RECONNECT_SECONDS)

    async def try_guard(self) -> Guard:
        if self.guarding:
            return Guard.HELD
        found = await self._run("try_to_guard")
        guard = Guard.UNAVAILABLE if found is None else Guard(found)
        self.guarding = guard is Guard.HELD
        return guard

    async def stop_guarding(self) -> None:
        if self.guarding:
            self.guarding = False
            await self._run("stop_guarding")  # if the connection is lost, so is the guard

    async def _listen(self) -> None:
        self._lost = asyncio.get_running_loop().create_future()
        async with await psycopg.AsyncConnection.connect(**_connection_kwargs()) as listener:
            listener.add_notify_handler(self._notified)
            await listener.execute(statement("name_session"), {"dispatcher": self.dispatcher_id})
            await listener.execute(f"LISTEN {WAKEUP_CHANNEL}")
            await listener.execute(f"LISTEN {pending.REOPENED_CHANNEL}")
            pending.forget()  # jobs may have been requeued while we were not listening
            self._connection = listener
            self._read_between_statements(True)
            try:
                self.wake()  # and published
                raise await self._lost
            finally:
                self._read_between_statements(False)
                self._connection, self.guarding = None, False

    def _notified(self, notice: psycopg.Notify) -> None:
        if notice.channel == pending.REOPENED_CHANNEL:
            pending.forget()
        self.wake()

    def _read_between_statements(self, reading: bool) -> None:
        """Watch the socket for notifications while no statement runs (psycopg reads it while
        one does, and hands what arrives to `_notified` too)."""
        loop = asyncio.get_running_loop()
        if self._watched is not None:
            loop.remove_reader(self._watched)
            self._watched = None
        if reading and self._connection is not None:
            self._watched = self._connection.pgconn.socket
            loop.add_reader(self._watched, self._readable)

    def _readable(self) -> None:
        if self._connection is None:
            return
        pgconn = self._connection.pgconn
        try:
            pgconn.consume_input()  # raises once the server has closed the connection
        except psycopg.Error as exc:
            self._connection_lost(exc)
            return
        while (notice := pgconn.notifies()) is not None:
            if pgconn.notify_handler:  # psycopg's: it calls `_notified`
                pgconn.notify_handler(notice)

    async def _run(self, name: str) -> Any:
        """Run a statement of sql/wakeup.sql; its one value, or None without a connection (a
        statement that fails drops the connection: the guard goes with it)."""
        async with self._statements:
            listener = self._connection
            if listener is None:
                return None
            self._read_between_statements(False)
            try:
                cursor = await listener.execute(statement(name))
                row = await cursor.fetchone()
            except psycopg.Error as exc:
                self._connection_lost(exc)
                return None
            if self._connection is listener:
                self._read_between_statements(True)
            return row[0] if row else None

    def _connection_lost(self, exc: BaseException) -> None:
        self._read_between_statements(False)
        self._connection, self.guarding = None, False
        if self._lost is not None and not self._lost.done():
            self._lost.set_result(exc)
