"""The error pages of the whole site: under the UI's path an HTML page in the UI's layout, saying
what was asked for and where to go; anywhere else the API's JSON error (broker/api/errors.py), as
webhook-broker's clients expect."""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.template.loader import render_to_string
from django.views import csrf

from broker.api import errors
from broker.ui import inputs


def not_found(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if in_ui(request):
        return render(request, "ui/not_found.html", status=404)
    return errors.not_found(request, exception)


def permission_denied(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if in_ui(request):
        return render(request, "ui/refused.html", status=403)
    return errors.permission_denied(request, exception)


def csrf_failure(request: HttpRequest, reason: str = "") -> HttpResponse:
    """Django's CSRF_FAILURE_VIEW: the UI's 403 page there, Django's own page elsewhere (the
    admin's forms)."""
    if in_ui(request):
        return render(request, "ui/refused.html", status=403)
    return csrf.csrf_failure(request, reason)


def bad_request(request: HttpRequest, exception: Exception | None = None) -> HttpResponse:
    if in_ui(request):
        problems = {"request": "the browser sent a request this site cannot read"}
        return render(request, "ui/bad_request.html", {"problems": problems}, status=400)
    return errors.bad_request(request, exception)


def server_error(request: HttpRequest) -> HttpResponse:
    if in_ui(request):
        # No layout, no context processors: they may need the database that just failed.
        return HttpResponse(render_to_string("ui/server_error.html"), status=500)
    return errors.server_error(request)


def in_ui(request: HttpRequest) -> bool:
    return inputs.is_ui_path(request.path)
