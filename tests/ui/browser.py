"""Shared parts of the end-to-end UI tests in headless Chromium (docs/ui.md).

Playwright drives Debian's /usr/bin/chromium (never a downloaded browser; tests/tools.py finds
it, and without it the browser tests skip, naming what to install); the `page` fixture is in
tests/ui/conftest.py. Set UI_SCREENSHOTS=1 to refresh the screenshots in docs/screenshots/.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connection

from jobs.delivery import AttemptResult
from jobs.dispatch import Dispatcher, DispatcherConfig
from tests import ROOT
from tests.delivery import run_once
from tests.helpers import make_operator
from tests.tools import require_tool

if TYPE_CHECKING:
    from playwright.sync_api import Browser, Page

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
PHONE: dict[str, Any] = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}
DESKTOP: dict[str, Any] = {"viewport": {"width": 1440, "height": 900}}
# The two screens of tests that run on each (a fixture parametrized over the keys).
SCREENS = {"desktop": DESKTOP, "phone": PHONE}


@contextmanager
def chromium_browser() -> Iterator[Browser]:
    """A headless Chromium, for a module's browser tests to share (tests/ui/conftest.py:
    `chromium`): starting Playwright's driver and the browser costs a second of CPU or more,
    a new page in it a few milliseconds."""
    from playwright.sync_api import sync_playwright

    chromium = require_tool("chromium")
    # Playwright's sync API keeps an event loop in this thread while it runs; the ORM calls the
    # tests make between browser steps are still plain synchronous code.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(chromium), args=CHROMIUM_ARGS)
            yield browser
            browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


def chromium_page(browser: Browser, screen: dict[str, Any]) -> Iterator[Page]:
    """A page of its own (cookies, storage) on `screen` (Playwright's new_context options), for
    a fixture to yield; closed after the test."""
    context = browser.new_context(**screen)
    page = context.new_page()
    page.set_default_timeout(10_000)
    try:
        yield page
    finally:
        context.close()
        # The ORM work of the test ran in the context Playwright's sync API set up; its
        # connection would outlive the test and block the test database's teardown.
        connection.close()
