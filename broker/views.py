"""Health endpoint."""

from __future__ import annotations

import time
from typing import Any

from django.db import DatabaseError, connection
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
