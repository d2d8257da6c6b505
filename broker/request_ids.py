"""A request ID for every request, answered in `X-Request-ID` (as webhook-broker does) and named
in the broker's log lines about that request; and the access log, a line per request (logger
`broker.access`, docs/observability.md), written here because this is the outermost middleware:
it sees every answer, a gateway refusal or a 500 included, and times all of them.

A proxy's own `X-Request-ID` is kept when it is a plain token, so that its logs and ours can be
joined; anything else (too long, spaces, line breaks: a way to forge log lines) is replaced by a
fresh xid, the form webhook-broker's IDs take.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.utils.encoding import escape_uri_path

from broker.logs import one_line
from broker.xids import new_xid

HEADER = "X-Request-ID"
_PLAIN = re.compile(r"[A-Za-z0-9._:-]{1,128}\Z")

access_logger = logging.getLogger("broker.access")


def request_id_of(request: HttpRequest) -> str:
    return getattr(request, "request_id", "-")


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        given = request.headers.get(HEADER, "")
        request.request_id = given if _PLAIN.match(given) else new_xid()  # type: ignore[attr-defined]
        response = self.get_response(request)
        response[HEADER] = request.request_id  # type: ignore[attr-defined]
        log_access(request, response.status_code, (time.perf_counter() - started) * 1000)
        return response


def log_access(request: HttpRequest, status: int, duration_ms: float) -> None:
    """The request's access line: never its query string, headers or body, where tokens travel
    (the path is percent-encoded as it came, so it cannot break the line either)."""
    if not access_logger.isEnabledFor(logging.INFO):
        return
    fields = {
        "method": one_line(request.method or ""),
        "path": escape_uri_path(request.path),
        "status": status,
        "duration_ms": round(duration_ms, 1),
        "request_id": request_id_of(request),
        "remote_addr": request.META.get("REMOTE_ADDR", ""),
    }
    said = " ".join(f"{key}={value}" for key, value in fields.items())
    access_logger.info("access %s", said, extra=fields)
