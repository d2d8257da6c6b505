"""Optimistic concurrency for management writes: Last-Modified and If-Unmodified-Since
(docs/api.md).

Updating or deleting an existing resource requires `If-Unmodified-Since` equal to the resource's
`Last-Modified` (HTTP date, second precision): 400 when it is missing, 412 when it differs, so a
client cannot overwrite a change it has not seen. Creating a resource needs no header.
"""

from __future__ import annotations

from datetime import datetime

from django.utils.http import http_date, parse_http_date_safe
from rest_framework import status
from rest_framework.request import Request
from rest_framework.response import Response

from broker.api.errors import ApiError


def last_modified(changed_at: datetime) -> str:
    return http_date(changed_at.timestamp())


def with_last_modified(response: Response, changed_at: datetime) -> Response:
    response["Last-Modified"] = last_modified(changed_at)
    return response


def require_unmodified_since(request: Request, changed_at: datetime) -> None:
    header = request.headers.get("If-Unmodified-Since", "").strip()
    if not header:
        raise ApiError(
            status.HTTP_400_BAD_REQUEST,
            "Changing an existing resource needs If-Unmodified-Since (its Last-Modified).",
        )
    if parse_http_date_safe(header) != int(changed_at.timestamp()):
        raise ApiError(
            status.HTTP_412_PRECONDITION_FAILED,
            "The resource changed since If-Unmodified-Since; read it again and retry.",
        )
