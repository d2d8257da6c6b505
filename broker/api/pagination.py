"""Keyset ("cursor") pagination in webhook-broker's shape (docs/api.md).

Lists are newest first, 25 items a page. `?next=` continues with older items and `?previous=` with
newer ones. Cursors are signed: a tampered cursor is a 400, never a query on arbitrary values.
As in webhook-broker, a non-empty page carries both links and an empty `Result` means "no more";
unlike it, links keep the request's other query parameters (such as `status`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import urlencode

from django.core import signing
from django.core.exceptions import ValidationError
from django.db.models import Field, Model, Q, QuerySet
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from broker.api.errors import ApiError

PAGE_SIZE = 25
CURSOR_SALT = "broker.api.pagination"
M = TypeVar("M", bound=Model)


def paginate(
    request: Request, queryset: QuerySet[M], keys: Sequence[str] = ("created_at", "pk")
) -> tuple[list[M], dict[str, str]]:
    """One page of `queryset` ordered by `keys` descending, and its `Pages` links."""
    next_cursor = request.query_params.get("next")
    previous_cursor = request.query_params.get("previous")
    if next_cursor and previous_cursor:
        raise ApiError(status.HTTP_400_BAD_REQUEST, "Use either next or previous, not both.")
    descending = [f"-{key}" for key in keys]
    if previous_cursor:
        boundary = _read_cursor(previous_cursor, queryset.model, keys)
        newer = queryset.filter(_beyond(keys, boundary, "gt")).order_by(*keys)[:PAGE_SIZE]
        items = list(newer)[::-1]
    else:
        page = queryset.order_by(*descending)
        if next_cursor:
            page = page.filter(_beyond(keys, _read_cursor(next_cursor, queryset.model, keys), "lt"))
        items = list(page[:PAGE_SIZE])
    if not items:
        return items, {}
    return items, {
        "next": _link(request, "next", _make_cursor(items[-1], keys)),
        "previous": _link(request, "previous", _make_cursor(items[0], keys)),
    }


def url_page(
    request: Request,
    queryset: QuerySet[M],
    url_of: Callable[[M], str],
    keys: Sequence[str] = ("created_at", "pk"),
) -> Response:
    """A list endpoint's answer: one page of `queryset` as resource URLs, and its `Pages`."""
    items, pages = paginate(request, queryset, keys)
    return Response({"Result": [url_of(item) for item in items], "Pages": pages})


def _beyond(keys: Sequence[str], values: list[Any], lookup: str) -> Q:
    """Rows strictly after `values` in lexicographic order of `keys` (lookup "lt" or "gt")."""
    condition = Q(**{f"{keys[-1]}__{lookup}": values[-1]})
    for key, value in zip(reversed(keys[:-1]), reversed(values[:-1]), strict=True):
        condition = Q(**{f"{key}__{lookup}": value}) | (Q(**{key: value}) & condition)
    return condition


def _make_cursor(item: Model, keys: Sequence[str]) -> str:
    values = [getattr(item, key) for key in keys]
    encoded = [value.isoformat() if hasattr(value, "isoformat") else str(value) for value in values]
    # A Signer, not signing.dumps: dumps stamps the time, so the same page would get a different
    # link every second, and a cursor needs no expiry (it only names a row).
    return _signer().sign_object(encoded, compress=True)


def _signer() -> signing.Signer:
    """Made per use: it reads SECRET_KEY then, so a key rotation applies at once."""
    return signing.Signer(salt=CURSOR_SALT)


def _read_cursor(cursor: str, model: type[Model], keys: Sequence[str]) -> list[Any]:
    try:
        raw = _signer().unsign_object(cursor)
        if not isinstance(raw, list) or len(raw) != len(keys):
            raise ValueError("cursor shape")
        return [_field(model, key).to_python(value) for key, value in zip(keys, raw, strict=True)]
    except (signing.BadSignature, ValueError, ValidationError):
        raise ApiError(status.HTTP_400_BAD_REQUEST, "Invalid pagination cursor.") from None


def _field(model: type[Model], key: str) -> Field[Any, Any]:
    field = model._meta.pk if key == "pk" else model._meta.get_field(key)
    if not isinstance(field, Field):
        raise ValueError(f"{key} is not a column")
    return field


def _link(request: Request, name: str, cursor: str) -> str:
    params = [
        (key, value)
        for key, values in request.query_params.lists()
        if key not in {"next", "previous"}
        for value in values
    ]
    return f"{request.path}?{urlencode([*params, (name, cursor)])}"
