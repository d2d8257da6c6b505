"""Health endpoint and the home page."""

from __future__ import annotations

import time
from typing import Any

from django.db import DatabaseError, connection, transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.utils.cache import add_never_cache_headers
from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

import broker
from broker.api.auth import IsAdminUnlessPublicStatus
from jobs.partitions import default_partition_rows


class DatabaseHealthSerializer(serializers.Serializer[Any]):
    vendor = serializers.CharField()
    healthy = serializers.BooleanField()
    responseTimeMs = serializers.FloatField()  # noqa: N815 (wire name)


class DefaultPartitionsSerializer(serializers.Serializer[Any]):
    jobs = serializers.IntegerField()
    attempts = serializers.IntegerField()
    countedUpTo = serializers.IntegerField()  # noqa: N815 (wire name)


class StatusSerializer(serializers.Serializer[Any]):
    status = serializers.ChoiceField(choices=["ok", "unavailable"])
    version = serializers.CharField()
    database = DatabaseHealthSerializer()
    defaultPartitions = DefaultPartitionsSerializer(  # noqa: N815 (wire name)
        required=False,
        help_text="Rows no time partition covers (docs/scaling.md); absent when the database"
        " does not answer.",
    )
    warnings = serializers.ListField(
        child=serializers.CharField(),
        help_text="Things an operator should look at; the status stays ok (200).",
    )


class StatusView(APIView):
    """200 when the database answers, 503 when it does not; never a secret or a traceback."""

    permission_classes = [IsAdminUnlessPublicStatus]

    @extend_schema(
        operation_id="get_status", responses={200: StatusSerializer, 503: StatusSerializer}
    )
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
        body: dict[str, Any] = {
            "status": "ok" if healthy else "unavailable",
            "version": broker.__version__,
            "database": database,
            "warnings": [],
        }
        if healthy:
            body.update(retention_warnings())
        response = Response(body, status=200 if healthy else 503)
        add_never_cache_headers(response)
        return response


def retention_warnings() -> dict[str, Any]:
    """Rows in the DEFAULT partitions, as a warning: the broker works, but retention was behind
    (jobs/partitions/default_rows.py). A schema without them (not migrated yet) says nothing."""
    try:
        with transaction.atomic():
            rows = default_partition_rows()
    except DatabaseError:
        return {}
    counted = {"jobs": rows.jobs, "attempts": rows.attempts, "countedUpTo": rows.limit}
    return {"defaultPartitions": counted, "warnings": [rows.warning] if rows else []}


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
