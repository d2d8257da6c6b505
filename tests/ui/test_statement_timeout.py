"""The UI's statement timeout (issue 38, docs/ui.md "Statement timeout"): a page whose query runs
too long answers a 503 page at once, saying what to narrow, and the limit never stays on the
connection for the requests that use it next (the API, the dispatchers, the admin).

Transactional: a statement stopped inside the test's own transaction would abort it."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection

pytestmark = pytest.mark.django_db(transaction=True)

SLOW_PAGE = "/ui/periodic"
SLOW_TABLE = "broker_periodicmessage"  # the page's list: the statement made slow


def sleeping_before(matches: Callable[[str], bool], seconds: float) -> Callable[..., Any]:
    """An execute wrapper that runs `pg_sleep(seconds)` before each statement `matches` picks,
    through the same executor: on the same connection and under its settings, as a slow plan
    of that statement would be."""

    def wrapper(execute, sql, params, many, context):
        if matches(sql):
            execute(f"SELECT pg_sleep({seconds})", None, False, context)
        return execute(sql, params, many, context)

    return wrapper


def statement_timeout_now() -> str:
    with connection.cursor() as cursor:
        cursor.execute("SHOW statement_timeout")
        (value,) = cursor.fetchone()
    return str(value)


def test_a_page_whose_query_runs_too_long_answers_at_once_saying_what_to_narrow(
    staff_client, settings
):
    settings.BROKER_UI_STATEMENT_TIMEOUT_SECONDS = 0.2
    before = statement_timeout_now()

    started = time.monotonic()
    with connection.execute_wrapper(sleeping_before(lambda sql: SLOW_TABLE in sql, 30)):
        response = staff_client.get(SLOW_PAGE, {"channel": "orders"})
    elapsed = time.monotonic() - started

    assert response.status_code == 503
    assert elapsed < 5  # stopped after 0.2 s, not after the 30 s the statement would take
    page = response.content.decode()
    assert "<h1>This took too long</h1>" in page
    assert "more than 0.2 s" in page
    assert "a shorter time range" in page
    assert f'<a href="{SLOW_PAGE}">Open the page without filters</a>' in page
    assert 'href="/ui/dead-jobs"' in page  # in the UI's layout, with its navigation
    assert statement_timeout_now() == before


def test_the_limit_stays_with_the_page_and_never_reaches_the_next_request(staff_client, settings):
    settings.BROKER_UI_STATEMENT_TIMEOUT_SECONDS = 0.1
    before = statement_timeout_now()
    during: list[str] = []

    def record(execute, sql, params, many, context):
        if SLOW_TABLE in sql:
            during.append(statement_timeout_now())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        assert staff_client.get(SLOW_PAGE).status_code == 200
    # The next request on this thread's connection (the test client's, like a pooled or
    # persistent one) is the API's, with a statement longer than the UI's limit.
    with connection.execute_wrapper(sleeping_before(lambda sql: sql == "SELECT 1", 0.4)):
        status = staff_client.get("/_status")

    assert during == ["100ms"]
    assert status.json()["status"] == "ok"
    assert statement_timeout_now() == before


def test_no_limit_when_set_to_zero(staff_client, settings):
    settings.BROKER_UI_STATEMENT_TIMEOUT_SECONDS = 0

    with connection.execute_wrapper(sleeping_before(lambda sql: SLOW_TABLE in sql, 0.3)):
        response = staff_client.get(SLOW_PAGE)

    assert response.status_code == 200
