"""Fixtures of the operator UI's tests."""

from __future__ import annotations

import pytest

from tests.ui.browser import PHONE, SCREENS, chromium_browser, chromium_page


@pytest.fixture
def staff_client(client):
    """The test client logged in as an operator (tests/helpers.py: make_operator)."""
    from tests.helpers import make_operator

    client.force_login(make_operator())
    return client


@pytest.fixture(scope="module")
def chromium():
    """One headless Chromium for the browser tests of a module (tests/ui/browser.py)."""
    with chromium_browser() as browser:
        yield browser


@pytest.fixture
def page(chromium):
    """A headless Chromium page on a desktop screen (tests/ui/browser.py), closed after the
    test."""
    yield from chromium_page(chromium, {"viewport": {"width": 1280, "height": 800}})


@pytest.fixture
def phone_page(chromium):
    """The same on a phone's screen (PHONE)."""
    yield from chromium_page(chromium, PHONE)


@pytest.fixture(params=list(SCREENS))
def screen(request, chromium):
    """A Chromium page on each screen in turn: a desktop's (1440 by 900) and a phone's."""
    yield from chromium_page(chromium, SCREENS[request.param])
