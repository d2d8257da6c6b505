from __future__ import annotations

import pytest
from django.db import connection


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if connection.vendor == "postgresql":
        return
    skip = pytest.mark.skip(reason="needs PostgreSQL (set DATABASE_URL=postgres://...)")
    for item in items:
        if item.get_closest_marker("postgres"):
            item.add_marker(skip)


ADMIN_TOKEN = "test-admin-token"
FORM = "application/x-www-form-urlencoded"


@pytest.fixture
def admin_client(client, settings):
    """A test client that authenticates as admin with a BROKER_ADMIN_TOKENS bearer token."""
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    client.defaults["HTTP_AUTHORIZATION"] = f"Bearer {ADMIN_TOKEN}"
    return client


@pytest.fixture
def receiver():
    """A webhook receiver on loopback (tests/receiver.py), stopped after the test."""
    from tests.receiver import Receiver

    running = Receiver().start()
    yield running
    running.stop()
