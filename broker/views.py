"""Health endpoint."""

from __future__ import annotations

import time

from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

import broker


@require_GET
@never_cache
def status(request: HttpRequest) -> JsonResponse:
    """200 when the database answers, 503 when it does not; never a secret or a traceback."""
    started = time.perf_counter()
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        healthy = True
    except DatabaseError:
        healthy = False
    database = {
        "vendor": connection.vendor,
        "healthy": healthy,
        "responseTimeMs": round((time.perf_counter() - started) * 1000, 2),
    }
    body = {"status": "ok" if healthy else "unavailable", "version": broker.__version__}
    return JsonResponse({**body, "database": database}, status=200 if healthy else 503)
