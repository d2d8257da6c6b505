"""OpenAPI descriptions of what drf-spectacular cannot infer by itself."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter

from broker.api.auth import AdminUnlessPublic

# Every operation may answer these, with the {"Error": ...} body (docs/api.md has which when).
ERROR_STATUSES = {
    "400": "bad input",
    "401": "missing or unknown credentials",
    "403": "wrong credentials",
    "404": "unknown resource",
    "409": "conflict (duplicate message ID, consumer paused)",
    "412": "precondition failed (If-Unmodified-Since, consumer type)",
    "413": "payload too large",
    "415": "unsupported media type",
    "503": "database unavailable",
}

IF_UNMODIFIED_SINCE = OpenApiParameter(
    "If-Unmodified-Since",
    str,
    OpenApiParameter.HEADER,
    description="the resource's Last-Modified; required to change an existing resource",
)


class AdminTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "broker.api.auth.AdminTokenAuthentication"
    name = "adminToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "BROKER_ADMIN_TOKENS or API key"}


class BrokerAutoSchema(AutoSchema):
    """The schema inspector (REST_FRAMEWORK's DEFAULT_SCHEMA_CLASS): drf-spectacular's, except that
    an endpoint a setting opens to anyone (AdminUnlessPublic: `/_status` by default, `/metrics`
    with BROKER_PUBLIC_METRICS=true) shows no security requirement while it is open, like the
    endpoints without authentication. drf-spectacular alone lists the admin token there, inferred
    from the authentication classes these views keep for when the setting closes them. The
    schema is made for each request, so it follows the setting."""

    def get_auth(self) -> list[dict[str, Any]]:
        permissions = self.view.get_permissions()  # all must allow a request, as in DRF
        if permissions and all(
            isinstance(p, AdminUnlessPublic) and p.is_public() for p in permissions
        ):
            return []
        return super().get_auth()


def add_error_responses(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: document the shared error shape on every operation."""
    schemas = result.setdefault("components", {}).setdefault("schemas", {})
    schemas.setdefault(
        "Error",
        {"type": "object", "properties": {"Error": {"type": "string"}}, "required": ["Error"]},
    )
    error = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}
    for operations in result.get("paths", {}).values():
        for operation in operations.values():
            responses = operation.setdefault("responses", {})
            for code, description in ERROR_STATUSES.items():
                responses.setdefault(code, {"description": description, "content": error})
    return result
