"""Content-Security-Policy of the operator UI and of the admin login page it sends users to.

Django 5.2 has no CSP support of its own. The policy allows the site's own scripts, styles and
images and nothing else: no inline script or style (the UI has none: confirmations are
static/ui/confirm.js, charts are SVG elements with presentation attributes, which CSP does
not
govern), no frames around the pages, no <base>, no plugins, and forms posting to this site only.

The rest of the admin keeps Django's own headers: its change forms use widgets (popups, inline
formsets) that were not written against a policy, and the UI does not depend on them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from django.http import HttpRequest, HttpResponse
from django.urls import get_script_prefix, get_urlconf, reverse

POLICY = "; ".join(
    [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "img-src 'self'",
        "connect-src 'self'",  # the opt-in auto-refresh fetches its own page (static/ui/refresh.js)
        "form-action 'self'",
        "frame-ancestors 'none'",
        "base-uri 'none'",
        "object-src 'none'",
    ]
)
HEADER = "Content-Security-Policy"


def applies_to(path: str) -> bool:
    """The UI's pages (all under the dashboard's path) and the admin's login page."""
    dashboard, login = _policed_paths(get_script_prefix(), get_urlconf())
    return path.startswith(dashboard) or path == login


@functools.lru_cache(maxsize=8)
def _policed_paths(script_prefix: str, urlconf: str | None) -> tuple[str, str]:
    """Reversed once per prefix and URLconf (the arguments are the cache's key), not on every
    request: two reverse() calls were 3 % of a broadcast's CPU (docs/performance-history.md)."""
    return reverse("ui:dashboard"), reverse("admin:login")


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER not in response and applies_to(request.path):
            response[HEADER] = POLICY
        return response
