"""The UI's statement timeout in headless Chromium, on a desktop and a phone (issue 38, docs/ui.md
"Statement timeout"): a page whose query would run for 30 s answers its 503 page at once, in
the UI's layout, readable without sideways scrolling, with a way back to the page unfiltered."""

from __future__ import annotations

import time

from django.db.backends.utils import CursorWrapper

from tests.ui.browser import browser_test, log_in
from tests.ui.test_browser_dead_jobs_list import fits_the_screen
from tests.ui.test_statement_timeout import SLOW_PAGE, SLOW_TABLE

pytestmark = browser_test


def test_a_page_too_slow_answers_at_once_saying_what_to_narrow(
    screen, live_server, settings, monkeypatch
):
    settings.BROKER_UI_STATEMENT_TIMEOUT_SECONDS = 0.2
    log_in(screen, live_server, "/ui/")
    execute = CursorWrapper._execute  # type: ignore[attr-defined]  # (Django's, undeclared in its stubs)

    def slow_list(self, sql, params, *rest):
        """The page's list query, as a bad plan would run it: 30 s (the server's thread too)."""
        if SLOW_TABLE in sql:
            execute(self, "SELECT pg_sleep(30)", None, *rest)
        return execute(self, sql, params, *rest)

    monkeypatch.setattr(CursorWrapper, "_execute", slow_list)
    started = time.monotonic()
    response = screen.goto(f"{live_server.url}{SLOW_PAGE}?channel=orders")
    elapsed = time.monotonic() - started

    assert response is not None
    assert response.status == 503
    assert elapsed < 5
    assert screen.locator("h1").inner_text() == "This took too long"
    assert "more than 0.2 s" in screen.locator("main").inner_text()
    back = screen.locator("main a", has_text="Open the page without filters")
    assert back.is_visible()
    assert fits_the_screen(screen)
    monkeypatch.undo()
    back.click()
    screen.wait_for_url(f"**{SLOW_PAGE}")
    assert screen.locator("h1").inner_text() != "This took too long"
