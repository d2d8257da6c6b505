"""Health endpoint and the home page."""

from __future__ import annotations

import time
from typing import Any

from django.db import DatabaseError, connection
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import add_never_cache_headers
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

import broker
from broker.api.auth import IsAdminUnlessPublicStatus


class DatabaseHealthSerializer(serializers.Serializer[Any]):
    vendor = serializers.CharField()
    healthy = serializers.BooleanField()
    responseTimeMs = serializers.FloatField()  # noqa: N815 (wire name)


class StatusSerializer(serializers.Serializer[Any]):
    status = serializers.ChoiceField(choices=["ok", "unavailable"])
    version = serializers.CharField()
    database = DatabaseHealthSerializer()


class StatusView(APIView):
    """200 when the database answers, 503 when it does not; never a secret or a traceback."""

    permission_classes = [IsAdminUnlessPublicStatus]

    @extend_schema(responses={200: StatusSerializer, 503: StatusSerializer})
    def get(self, request: Request) -> Response:
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
        response = Response({**body, "database": database}, status=200 if healthy else 503)
        add_never_cache_headers(response)
        return response


# Where a person or a client that opens the broker's address should go next.
LINKS = {
    "ui": "/ui/",
    "apiDocs": "/api/docs/",
    "apiSchema": "/api/schema/",
    "status": "/_status",
    "admin": "/admin/",
}


def home(request: HttpRequest) -> HttpResponse:
    """`/`: a small page for browsers, JSON for everything else; the same links in both."""
    body = {"name": "webhook broker", "version": broker.__version__, "links": LINKS}
    if "text/html" not in request.headers.get("Accept", ""):
        return JsonResponse(body)
    items = "".join(f'<li><a href="{url}">{url}</a> ({name})</li>' for name, url in LINKS.items())
    return HttpResponse(
        f"<!doctype html><title>Webhook broker</title><h1>Webhook broker {broker.__version__}</h1>"
        f"<ul>{items}</ul>"
    )
