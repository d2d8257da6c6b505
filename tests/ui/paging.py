"""Walking a paged list of the operator UI from its first page to its last."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django.db import connection
from django.test.utils import CaptureQueriesContext


def every_page(client, url: str, listed: Callable[[Any], list[Any]]) -> tuple[list[Any], set[int]]:
    """What `listed(response)` reads from each page from `url` on, following the pages'
    `next_page` cursor, and the set of query counts the pages took. No page may count its rows
    but up to a bound (a count over a LIMITed subquery: the dead jobs list's "≥ 10,000")."""
    path = url.split("?")[0]
    seen: list[Any] = []
    query_counts: set[int] = set()
    while url:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        counts = [query["sql"].upper() for query in queries if "COUNT(" in query["sql"].upper()]
        assert all(" LIMIT " in count for count in counts), counts
        query_counts.add(len(queries))
        seen += listed(response)
        url = response.context["next_page"] and f"{path}?{response.context['next_page']}"
    return seen, query_counts
