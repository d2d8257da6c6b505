"""OpenAPI descriptions of what drf-spectacular cannot infer by itself."""

from __future__ import annotations

from typing import Any

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class AdminTokenScheme(OpenApiAuthenticationExtension):  # type: ignore[no-untyped-call]
    target_class = "broker.api.auth.AdminTokenAuthentication"
    name = "adminToken"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {"type": "http", "scheme": "bearer", "description": "BROKER_ADMIN_TOKENS or API key"}
