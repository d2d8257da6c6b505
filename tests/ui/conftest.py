"""Fixtures of the operator UI's tests."""

from __future__ import annotations

import pytest

from tests.ui.browser import PHONE, chromium_page


@pytest.fixture
def staff_client(client):
    """The test client logged in as an operator (tests/helpers.py: make_operator)."""
    from tests.helpers import make_operator

    client.force_login(make_operator())
    return client


@pytest.fixture
def page(monkeypatch):
    """A headless Chromium page on a desktop screen (tests/ui/browser.py), closed after the
    test."""
    yield from chromium_page(monkeypatch, {"viewport": {"width": 1280, "height": 800}})


@pytest.fixture
def phone_page(monkeypatch):
    """The same on a phone's screen (PHONE)."""
    yield from chromium_page(monkeypatch, PHONE)
