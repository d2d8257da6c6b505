"""Keyset pagination for the operator UI's lists: a page never costs an OFFSET or a COUNT(*).

A list is ordered by a `Keyset` (a sort key and a unique tie-breaker); the cursor in the URL is
the position of the previous page's last row, "<key>~<tie-breaker>". Neither part can contain
"~": resource IDs are letters, digits, "_" and "-", and ISO dates and numbers have none. A
cursor comes back from the browser, so each part is parsed by a checking function of
broker/ui/inputs.py: a cursor that does not parse is refused (`inputs.CursorField`), never queried.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from django.db.models import Model, Q, QuerySet
from django.http import HttpRequest

from broker.ui import inputs

PAGE_SIZE = 50

M = TypeVar("M", bound=Model)
Row = TypeVar("Row")


@dataclass(frozen=True)
class Keyset:
    """A list's order: `key`, then `tiebreaker`, both ascending or both descending."""

    key: str
    tiebreaker: str
    parse_key: Callable[[str], Any]  # raises ValueError
    parse_tiebreaker: Callable[[str], Any]
    descending: bool = False

    def ordered(self, rows: QuerySet[M]) -> QuerySet[M]:
        sign = "-" if self.descending else ""
        return rows.order_by(f"{sign}{self.key}", f"{sign}{self.tiebreaker}")

    def after(self, rows: QuerySet[M], position: tuple[Any, Any] | None) -> QuerySet[M]:
        """The rows after a parsed cursor's position; all of them without one.

        The first condition alone bounds the scan of an index on the key; the OR only skips
        the rows that share the cursor's key up to its tie-breaker.
        """
        if position is None:
            return rows
        key, tiebreaker = position
        beyond = "lt" if self.descending else "gt"
        return rows.filter(
            Q(**{f"{self.key}__{beyond}e": key}),
            Q(**{f"{self.key}__{beyond}": key}) | Q(**{f"{self.tiebreaker}__{beyond}": tiebreaker}),
        )

    def through(self, rows: QuerySet[M], position: tuple[Any, Any]) -> QuerySet[M]:
        """The rows up to a position, the row at it included: those `after` leaves out."""
        key, tiebreaker = position
        side = "gt" if self.descending else "lt"
        return rows.filter(
            Q(**{f"{self.key}__{side}e": key}),
            Q(**{f"{self.key}__{side}": key}) | Q(**{f"{self.tiebreaker}__{side}e": tiebreaker}),
        )

    def cursor_of(self, row: Model) -> str:
        return "~".join(_text(getattr(row, name)) for name in (self.key, self.tiebreaker))

    def parse(self, cursor: str) -> tuple[Any, Any]:
        """The position a cursor names; ValueError when it is not one."""
        key, separator, tiebreaker = cursor.rpartition("~")
        if not separator:
            raise ValueError("no separator")
        return self.parse_key(key), self.parse_tiebreaker(tiebreaker)

    def cursor_field(self) -> inputs.CursorField:
        """The form field of a cursor of this order."""
        return inputs.CursorField(self.parse)


# Consumers and periodic messages: the order of each one's unique (channel, public ID) index.
BY_CHANNEL_AND_ID = Keyset("channel_id", "public_id", inputs.resource_id, inputs.resource_id)


def _text(value: object) -> str:
    return value.isoformat() if isinstance(value, datetime) else str(value)


@dataclass(frozen=True)
class Page(Generic[Row]):
    rows: list[Row]
    next_page: str | None  # the next page's query string; None on the last page
    first_page: str  # the query string of the first page with the same filters
    is_first_page: bool

    def links(self) -> dict[str, Any]:
        """The template context of the page's navigation links."""
        return {
            "next_page": self.next_page,
            "first_page": self.first_page,
            "is_first_page": self.is_first_page,
        }


def page_of(
    request: HttpRequest,
    rows: QuerySet[M] | Sequence[M],
    cursor_of: Callable[[M], str],
    parameter: str = "cursor",
) -> Page[M]:
    """The page of `rows` (already filtered by the request's cursor and ordered), with the query
    strings of the next and the first page: the request's own, `parameter` set or removed."""
    # One row more than a page says whether there is a next page, without a COUNT(*).
    fetched = list(rows[: PAGE_SIZE + 1])
    shown = fetched[:PAGE_SIZE]
    next_page = None
    if len(fetched) > PAGE_SIZE:
        query = request.GET.copy()
        query[parameter] = cursor_of(shown[-1])
        next_page = query.urlencode()
    first_page = request.GET.copy()
    first_page.pop(parameter, None)
    return Page(shown, next_page, first_page.urlencode(), not request.GET.get(parameter))
