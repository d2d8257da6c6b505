"""Fixtures of the operator UI's tests."""

from __future__ import annotations

import pytest
from django.db import connection


@pytest.fixture
def staff_client(client):
    """The test client logged in as an operator (tests/helpers.py: make_operator)."""
    from tests.helpers import make_operator

    client.force_login(make_operator())
    return client


# A phone's screen, as the operator review used (390 by 844 CSS pixels, touch; double density keeps
# the screenshots small).
PHONE = {
    "viewport": {"width": 390, "height": 844},
    "device_scale_factor": 2,
    "is_mobile": True,
    "has_touch": True,
}


@pytest.fixture
def page(monkeypatch):
    """A headless Chromium page on a desktop screen (tests/ui/browser.py), closed after the
    test."""
    yield from _chromium_page(monkeypatch, {"viewport": {"width": 1280, "height": 800}})


@pytest.fixture
def phone_page(monkeypatch):
    """The same on a phone's screen (PHONE)."""
    yield from _chromium_page(monkeypatch, PHONE)


def _chromium_page(monkeypatch, screen):
    from playwright.sync_api import sync_playwright

    from tests.ui.browser import CHROMIUM, CHROMIUM_ARGS

    # Playwright's sync API keeps an event loop in this thread; the ORM calls the test makes
    # between browser steps are still plain synchronous code.
    monkeypatch.setenv("DJANGO_ALLOW_ASYNC_UNSAFE", "true")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(**screen)
        page.set_default_timeout(10_000)
        yield page
        browser.close()
        # The ORM work of the test ran in the context Playwright's sync API set up; its
        # connection would outlive the test and block the test database's teardown.
        connection.close()
