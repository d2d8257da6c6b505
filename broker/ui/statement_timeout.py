"""The statement timeout of the operator UI's pages (docs/ui.md, "Statement timeout").

A page whose query PostgreSQL plans badly (an index missing, a filter that reads millions of
rows) would hold a web server thread until gunicorn kills the worker, and answer nothing. Under
`BROKER_UI_STATEMENT_TIMEOUT_SECONDS`, PostgreSQL stops such a statement and the page answers
503, saying what to narrow (`ui.access.operator_view` runs every view in `statement_timeout`).

The limit is a session setting, set on each connection a view uses just before the view's first
statement on it (so a page that never reads from the replica opens no connection to it), and
reset when the view returns. That reset is what keeps it from the next user of the connection:
with the pool the connection goes back to it, without the pool it stays with the thread, and
either way an API request (a long-poll claim among them) or the admin may use it next.
`SET LOCAL` would reset itself, but only inside a transaction, and a transaction around a whole
page would send its reads to the primary (broker/db_routing.py) and make the bulk actions'
batches one long transaction.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import psycopg
from django.db import OperationalError, connections
from django.db.backends.base.base import BaseDatabaseWrapper
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from broker.conf import broker_settings

logger = logging.getLogger(__name__)


class TimeoutSetter:
    """A Django execute wrapper that sets the timeout on a connection before the first statement
    the view runs on it, and resets it on each connection it set (`reset`)."""

    def __init__(self, milliseconds: int) -> None:
        self.milliseconds = milliseconds
        self.set_on: list[tuple[BaseDatabaseWrapper, psycopg.Connection[Any]]] = []

    def __call__(
        self,
        execute: Callable[..., Any],
        sql: str,
        params: Any,
        many: bool,
        context: dict[str, Any],
    ) -> Any:
        database: BaseDatabaseWrapper = context["connection"]
        raw = database.connection
        if not any(raw is done for _, done in self.set_on):
            with database.wrap_database_errors:  # a failure is Django's OperationalError
                _run(
                    raw,
                    "SELECT set_config('statement_timeout', %s, false)",
                    [str(self.milliseconds)],
                )
            self.set_on.append((database, raw))
        return execute(sql, params, many, context)

    def reset(self) -> None:
        for database, raw in self.set_on:
            # A connection Django replaced during the view was closed as broken, not pooled.
            if database.connection is not raw or raw.closed:
                continue
            try:
                _run(raw, "RESET statement_timeout")
            except psycopg.Error:
                # It cannot be reset (a transaction left failed): it must not serve anyone else
                # with the limit on, so it is closed, and the next statement opens another.
                raw.close()
                database.close()


def _run(raw: psycopg.Connection[Any], statement: str, params: list[str] | None = None) -> None:
    # On the driver's connection, beneath Django's cursors: no execute wrapper runs again, and
    # the pages' query counts (tests) stay those of the pages. Never prepared: it is a setting.
    with raw.cursor() as cursor:
        cursor.execute(statement, params, prepare=False)


@contextmanager
def statement_timeout() -> Iterator[None]:
    """Within: every statement on the process's connections (primary and replica) is stopped
    after BROKER_UI_STATEMENT_TIMEOUT_SECONDS; afterwards, the connections as they were."""
    seconds = broker_settings.BROKER_UI_STATEMENT_TIMEOUT_SECONDS
    if not seconds:
        yield
        return
    setter = TimeoutSetter(max(1, round(seconds * 1000)))
    try:
        with ExitStack() as wrappers:
            for database in connections.all():
                wrappers.enter_context(database.execute_wrapper(setter))
            yield
    finally:
        setter.reset()


def timed_out(error: OperationalError) -> bool:
    """Whether `error` is PostgreSQL stopping a statement (the timeout, or an operator's
    pg_cancel_backend), not the database being unreachable."""
    return isinstance(error.__cause__, psycopg.errors.QueryCanceled)


def took_too_long(request: HttpRequest) -> HttpResponse:
    """The page saying the query took too long, and what to narrow; 503, as the database is
    there but cannot answer this in time."""
    logger.warning(
        "UI statement timeout (%s s): %s %s",
        broker_settings.BROKER_UI_STATEMENT_TIMEOUT_SECONDS,
        request.method,
        request.path,
    )
    context = {
        "seconds": f"{broker_settings.BROKER_UI_STATEMENT_TIMEOUT_SECONDS:g}",
        "filtered": request.method == "GET" and bool(request.GET),
    }
    return render(request, "ui/took_too_long.html", context, status=503)
