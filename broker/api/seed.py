"""`POST /seed` (extension, docs/api.md "Seed files"): a webhook-broker seed file loaded over the
API, as `manage.py load_seed` loads it on the broker's machine: the same parser and the same
transaction (broker/seed.py), so the command line's `seed load` and the management command
cannot read a file two ways, and a refused file changes nothing. Admin only.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from broker.api.errors import ApiError
from broker.api.serializers import ErrorSerializer
from broker.seed import SeedError, apply_seed, parse_seed


class LoadedSeedSerializer(serializers.Serializer[Any]):
    Loaded = serializers.ListField(
        child=serializers.CharField(),
        help_text="a line per resource (`channel orders: created`, `… updated`, `… unchanged`), "
        "and one per token the load generated (`consumer orders/billing: token …`), shown once",
    )


class SeedView(APIView):
    @extend_schema(
        operation_id="load_seed",
        request={"text/plain": OpenApiTypes.STR},
        responses={
            200: LoadedSeedSerializer,
            400: OpenApiResponse(ErrorSerializer, description="the file's problem: nothing loaded"),
        },
    )
    def post(self, request: Request) -> Response:
        """Create or update the channels, producers and consumers of a seed file (the body)."""
        try:
            seed = parse_seed(request.body.decode("utf-8"))
        except UnicodeDecodeError:
            raise ApiError(status.HTTP_400_BAD_REQUEST, "The seed file is not UTF-8.") from None
        except SeedError as exc:
            raise ApiError(status.HTTP_400_BAD_REQUEST, f"{exc}; nothing was loaded.") from None
        return Response({"Loaded": apply_seed(seed)})
