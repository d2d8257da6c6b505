"""Who may call what (docs/api.md).

Management endpoints need an admin: a bearer token from BROKER_ADMIN_TOKENS, an API key created
with `manage.py create_api_key`, or a logged-in staff user with the permission
`broker.administer_broker` (superusers have it; so does the group "broker admin");
BROKER_OPEN_ADMIN_API=true opens them as webhook-broker does. Broadcast and pull endpoints are
guarded by the resources' own tokens. Every comparison is constant-time.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from typing import Any

from rest_framework.authentication import BaseAuthentication
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import BasePermission
from rest_framework.request import Request

from broker.conf import broker_settings
from broker.models import ApiKey
from broker.tokens import hash_token

# What a login session needs to use the admin API (docs/api.md); admin tokens need nothing more.
ADMINISTER_BROKER = "broker.administer_broker"


@dataclass(frozen=True)
class AdminPrincipal:
    """The caller behind an admin bearer token (stands in for a Django user)."""

    name: str
    is_authenticated: bool = True
    is_staff: bool = True


def admin_token_name(token: str) -> str | None:
    """The name of the admin credential `token` is, or None."""
    digest = hash_token(token)
    matched = False
    for configured in broker_settings.BROKER_ADMIN_TOKENS:
        # No early exit: the time taken does not depend on which configured token matched.
        matched |= hmac.compare_digest(digest, hash_token(configured))
    if matched:
        return "BROKER_ADMIN_TOKENS"
    # Looking up the hash reveals nothing about stored keys through timing.
    key = ApiKey.objects.filter(key_hash=digest).only("name").first()
    return f"api-key:{key.name}" if key else None


class AdminTokenAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[AdminPrincipal, str] | None:
        scheme, _, token = request.META.get("HTTP_AUTHORIZATION", "").partition(" ")
        if scheme.lower() != "bearer":
            return None
        name = admin_token_name(token.strip()) if token.strip() else None
        if name is None:
            raise AuthenticationFailed("Unknown admin token.")
        return AdminPrincipal(name), token

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="webhook-broker"'


class AdminUnlessPublic(BasePermission):
    """Open to anyone when the setting named by `public_setting` is true, else admins only."""

    public_setting: str

    def is_public(self) -> bool:
        """Whether the setting opens the endpoint now (the OpenAPI schema asks too)."""
        return bool(getattr(broker_settings, self.public_setting))

    def has_permission(self, request: Request, view: Any) -> bool:
        return self.is_public() or IsBrokerAdmin().has_permission(request, view)


class IsAdminUnlessPublicStatus(AdminUnlessPublic):
    public_setting = "BROKER_PUBLIC_STATUS"  # open by default: load balancer probes


class IsAdminUnlessPublicMetrics(AdminUnlessPublic):
    public_setting = "BROKER_PUBLIC_METRICS"  # admins by default: it names every consumer


def is_broker_admin(user: Any) -> bool:
    """Whether the request's caller is an admin: an admin token's principal, or a staff user
    with the broker.administer_broker permission."""
    if isinstance(user, AdminPrincipal):
        return True
    return bool(
        user and user.is_authenticated and user.is_staff and user.has_perm(ADMINISTER_BROKER)
    )


class IsBrokerAdmin(BasePermission):
    message = (
        "Admin authentication required (Authorization: Bearer <admin token>, or a staff login "
        f"with the permission {ADMINISTER_BROKER})."
    )

    def has_permission(self, request: Request, view: Any) -> bool:
        return broker_settings.BROKER_OPEN_ADMIN_API or is_broker_admin(request.user)
