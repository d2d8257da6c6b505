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
