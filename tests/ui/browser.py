"""Shared parts of the end-to-end UI tests in headless Chromium (docs/ui.md).

Playwright drives Debian's /usr/bin/chromium (never a downloaded browser; tests/tools.py finds
it, and without it the browser tests skip, naming what to install); the `page` fixture is in
tests/ui/conftest.py. Set UI_SCREENSHOTS=1 to refresh the screenshots in docs/screenshots/.
"""

from __future__ import annotations

import os
import threading

import pytest
from django.db import connection

from jobs.delivery import AttemptResult
from jobs.dispatch import Dispatcher, DispatcherConfig
from tests import ROOT
from tests.delivery import run_once
from tests.helpers import make_operator
from tests.tools import require_tool

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    # Without these Chromium keeps trying to reach Google's hosts, which this network refuses.
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SCREENSHOTS = ROOT / "docs" / "screenshots"

# Module-level marks of every browser test file.
browser_test = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.needs_tool("chromium"),
]


def log_in(page, live_server, next_path: str) -> None:
    """Create an operator (staff, in the group "broker admin") and log in through the admin's
    login page, landing on next_path."""
    make_operator("ops", "ops-password")
    page.goto(f"{live_server.url}/admin/login/?next={next_path}")
    page.fill("#id_username", "ops")
    page.fill("#id_password", "ops-password")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{next_path}")


def screenshot(page, name: str) -> None:
    if os.environ.get("UI_SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=SCREENSHOTS / name, full_page=True)


def in_own_thread(work) -> None:
    """Run work() in a thread of its own: Playwright's sync API keeps an event loop in the
    test's thread, so asyncio.run (and async-unsafe ORM checks) must happen elsewhere."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # re-raised in the test's thread
            errors.append(error)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(timeout=30)
    if errors:
        raise errors[0]


def dispatch_once() -> list[AttemptResult]:
    """One dispatcher step (claim, deliver, record), in a thread of its own."""
    results: list[AttemptResult] = []

    def step() -> None:
        dispatcher = Dispatcher(DispatcherConfig(dispatcher_id="ui-test-dispatcher"))
        results.extend(run_once(dispatcher, limit=10))

    in_own_thread(step)
    return results


# A phone's screen, as the operator review used (390 by 844 CSS pixels, touch; double density keeps
# the screenshots small).
PHONE = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}


def chromium_page(monkeypatch, screen):
    """A headless Chromium page on `screen` (Playwright's new_page options), for a fixture to
    yield; closed after the test."""
    from playwright.sync_api import sync_playwright

    chromium = require_tool("chromium")
    # Playwright's sync API keeps an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
        page = browser.new_page(**screen)
        page.set_default_timeout(10_000)
        yield page
        browser.close()
        # The ORM work of the test ran in the context Playwright's sync API set up; its
        # connection would outlive the test and block the test database's teardown.
        connection.close()
