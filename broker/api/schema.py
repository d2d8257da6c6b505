"""OpenAPI descriptions of what drf-spectacular cannot infer by itself.

Conventions of the schema (docs/api.md, "OpenAPI schema"; docs/openapi.json is the generated copy):
- Every operation names its `operationId` in its view (`extend_schema(operation_id=...)`), in
  snake_case, verb first: `list_channels`, `get_consumer`, `put_consumer`, `claim_jobs`. Client
  generators make method names of them, so they must not follow a URL or a class rename; an
  operation without one is a generation warning, which `manage.py openapi_file` and the tests
  refuse.
- Error responses all have the `{"Error": "..."}` body. Those that follow from an operation's
  shape are added here (`implied_errors`): 503 everywhere, 401/403 where credentials are asked
  for, 404 with path parameters, 400 with a body or query parameters, 413 with a body, 415 with a
  form or JSON body, 412 with If-Unmodified-Since. The others (409, 429, the pull endpoints' 412,
  a more precise description) are declared by the views themselves, and win.
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.drainage import warn
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.openapi import AutoSchema
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse

from broker.api.auth import AdminUnlessPublic
from broker.api.serializers import ErrorSerializer


def error_response(description: str) -> OpenApiResponse:
    """An error answer with the API's one error body, for a view to declare with its meaning."""
    return OpenApiResponse(ErrorSerializer, description=description)


# The pull endpoints (jobs/api/access.py, authorized_consumer with pull_only=True).
PULL_ONLY_ERRORS = {412: error_response("the consumer is a push consumer: only pull ones may call")}

# The cursors of paginated lists (broker/api/pagination.py): give one of the two, as in `Pages`.
PAGE_PARAMETERS = [
    OpenApiParameter("next", str, description="the `Pages.next` cursor: the page of older items"),
    OpenApiParameter(
        "previous", str, description="the `Pages.previous` cursor: the page of newer items"
    ),
]

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

    def get_operation_id(self) -> str:
        """Reached only when the view names no operationId (extend_schema's wins over this)."""
        generated = super().get_operation_id()
        warn(f"{self.method} {self.path}: no explicit operation_id (it would be {generated!r})")
        return generated

    def get_operation(self, *args: Any, **kwargs: Any) -> dict[str, Any] | None:
        operation: dict[str, Any] | None = super().get_operation(*args, **kwargs)
        if operation is None:
            return None
        error = {
            "application/json": {"schema": self.resolve_serializer(ErrorSerializer, "response").ref}
        }
        responses = operation.setdefault("responses", {})
        for code, description in implied_errors(operation, bool(self.view.parser_classes)).items():
            responses.setdefault(code, {"description": description, "content": error})
        return operation


def implied_errors(operation: dict[str, Any], parses_body: bool) -> dict[str, str]:
    """The error statuses an operation can answer by its shape alone, with what they mean."""
    parameters = operation.get("parameters", [])
    located = {(parameter["in"], parameter["name"]) for parameter in parameters}
    has_body = "requestBody" in operation
    errors = {"503": "the database is unavailable; Retry-After gives the seconds to wait"}
    if "security" in operation:
        errors["401"] = "no admin credentials, or an unknown admin token"
        errors["403"] = "credentials that are not an admin's"
    if any(name.endswith("-Token") for place, name in located if place == "header"):
        errors["401"] = "a token header missing, or an unknown consumer or producer"
        errors["403"] = "a token that does not match"
    if any(place == "path" for place, _ in located):
        errors["404"] = "no such resource (the first unknown ID in the path)"
    if has_body or any(place == "query" for place, _ in located):
        errors["400"] = "invalid input: the message names the field"
    if has_body:
        errors["413"] = "the request body is over the size the broker accepts"
    if has_body and parses_body:
        errors["415"] = "a body in another media type than those listed"
    if ("header", "If-Unmodified-Since") in located:
        errors.setdefault("400", "If-Unmodified-Since missing where the resource exists")
        errors["412"] = "the resource changed since If-Unmodified-Since: read it again"
    return errors
