"""GET /metrics: the Prometheus exposition of jobs/metrics.py."""

from __future__ import annotations

from django.http import HttpResponse
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from prometheus_client import generate_latest
from rest_framework.request import Request
from rest_framework.views import APIView

from broker.api.auth import IsAdminUnlessPublicMetrics
from jobs.metrics import queue_registry


class MetricsView(APIView):
    """Prometheus text format; admin unless BROKER_PUBLIC_METRICS (Prometheus can send a bearer)."""

    permission_classes = [IsAdminUnlessPublicMetrics]

    @extend_schema(
        operation_id="get_metrics",
        responses={
            (200, "text/plain"): OpenApiResponse(
                OpenApiTypes.STR, description="Prometheus text exposition format"
            )
        },
    )
    def get(self, request: Request) -> HttpResponse:
        return HttpResponse(
            generate_latest(queue_registry()),
            content_type="text/plain; version=0.0.4; charset=utf-8",
        )
