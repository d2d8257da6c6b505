"""The push dispatcher's database threads (jobs/dispatch.py): its steps run there, never on its
event loop, and what a lost or refused connection does to a step.

Two threads, each with its own connection (started on first use), so that recording outcomes
never holds up the next claim. A lost connection is dropped, so that the next step reconnects,
and the step raises DatabaseDown: the loop skips that pass. A schema that is not this version's
(migrations not run) raises BrokenDatabase, the one reason a dispatcher ends on its own.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from django.db import InterfaceError, OperationalError, ProgrammingError, connection

from jobs.delivery import AttemptResult
from jobs.health import Health

logger = logging.getLogger("jobs.dispatch")  # the dispatcher's log, as operators filter it
T = TypeVar("T")
# What a lost or refused database connection raises: the step is skipped and tried again later.
CONNECTION_ERRORS = (OperationalError, InterfaceError)


class DatabaseDown(Exception):
    pass


class BrokenDatabase(Exception):
    """The database answers, but not as this version needs (tables or columns missing)."""


class UnrecordedOutcomes(Exception):
    """The connection was lost while outcomes were recorded one by one: these were not."""

    def __init__(self, results: list[AttemptResult]) -> None:
        super().__init__(f"{len(results)} outcomes not recorded")
        self.results = results


class DatabaseThreads:
    """The claiming thread (claims and every other step) and the recording thread."""

    def __init__(self, health: Health) -> None:
        self.health = health  # told of every step's database, up or down (jobs/health.py)
        self.claimer = ThreadPoolExecutor(1, thread_name_prefix="dispatch-claim")
        self.recorder = ThreadPoolExecutor(1, thread_name_prefix="dispatch-record")

    async def run(
        self, step: Callable[..., T], *args: Any, thread: ThreadPoolExecutor | None = None
    ) -> T:
        """Run a database step in a database thread (the claiming one unless told).

        On a lost connection the connection is dropped and DatabaseDown raised. Claimed jobs
        stay INFLIGHT until their lease expires; finished results stay in memory and are
        recorded on a later pass.
        """
        thread = thread or self.claimer
        loop = asyncio.get_running_loop()
        try:
            result = await loop.run_in_executor(thread, functools.partial(step, *args))
        except CONNECTION_ERRORS as exc:
            self.health.database_failed()
            logger.warning("database unavailable during %s: %s", step.__name__, type(exc).__name__)
            await self.drop_connection(thread)
            raise DatabaseDown from exc
        except ProgrammingError as exc:
            raise BrokenDatabase(
                f"the database refused the dispatcher's {step.__name__} step ({exc}); "
                "is its schema this version's? Run `manage.py migrate`."
            ) from exc
        self.health.database_ok()
        return result

    async def drop_connection(self, thread: ThreadPoolExecutor | None = None) -> None:
        """Close a thread's connection (the claiming one unless told): its next step opens
        another."""
        await asyncio.get_running_loop().run_in_executor(thread or self.claimer, drop_connection)

    async def close(self) -> None:
        for executor in (self.claimer, self.recorder):
            await self.drop_connection(executor)
            executor.shutdown()


def drop_connection() -> None:
    connection.close()
