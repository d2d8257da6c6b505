"""A request ID for every API request, answered in `X-Request-ID` (as webhook-broker does) and
named in the broker's log lines about that request.

A proxy's own `X-Request-ID` is kept when it is a plain token, so that its logs and ours can be
joined; anything else (too long, spaces, line breaks: a way to forge log lines) is replaced by a
fresh xid, the form webhook-broker's IDs take.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse

from broker.xids import new_xid

HEADER = "X-Request-ID"
_PLAIN = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")


def request_id_of(request: HttpRequest) -> str:
    return getattr(request, "request_id", "-")


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        given = request.headers.get(HEADER, "")
        request.request_id = given if _PLAIN.match(given) else new_xid()  # type: ignore[attr-defined]
        response = self.get_response(request)
        response[HEADER] = request.request_id  # type: ignore[attr-defined]
        return response
