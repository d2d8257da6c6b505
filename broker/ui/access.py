"""Who may open which operator page or take which action, and the answer when a request is
refused (docs/ui.md, "Rights").

Staff status lets a user in; what they may see and do comes from Django permissions, given one
by one or through the group "broker admin" (broker/admin_group.py), which holds all of them.
Superusers have every permission.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar, cast

from django.contrib.admin.views.decorators import staff_member_required
from django.db import OperationalError
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_http_methods

from broker.admin_group import BROKER_ADMIN_GROUP
from broker.ui.inputs import BadInput, check_path
from broker.ui.statement_timeout import statement_timeout, timed_out, took_too_long

# The permission of each page and action (the table in docs/ui.md).
VIEW_JOBS = "jobs.view_job"
CHANGE_JOBS = "jobs.change_job"  # requeue
DELETE_JOBS = "jobs.delete_job"
VIEW_CONSUMERS = "consumers.view_consumer"
ADD_CONSUMERS = "consumers.add_consumer"
CHANGE_CONSUMERS = "consumers.change_consumer"  # edit, pause, resume, close circuit, test event
MANAGE_SIGNING_SECRETS = "broker.manage_signing_secrets"  # reveal, rotate
VIEW_MESSAGES = "broker.view_message"
ADD_MESSAGES = "broker.add_message"  # schedule a message
CHANGE_MESSAGES = "broker.change_message"  # replay
DELETE_MESSAGES = "broker.delete_message"  # cancel a scheduled message
VIEW_PERIODIC = "broker.view_periodicmessage"
ADD_PERIODIC = "broker.add_periodicmessage"
CHANGE_PERIODIC = "broker.change_periodicmessage"  # edit, enable, disable
DELETE_PERIODIC = "broker.delete_periodicmessage"
VIEW_REPORTS = "jobs.view_deliveryreport"

View = TypeVar("View", bound=Callable[..., HttpResponse])


class MissingPermission(Exception):
    def __init__(self, permission: str) -> None:
        super().__init__(permission)
        self.permission = permission


def require(request: HttpRequest, permission: str) -> None:
    """MissingPermission (a 403 page) unless the user has `permission`."""
    if not request.user.has_perm(permission):
        raise MissingPermission(permission)


def operator_view(*, get: str | None = None, post: str | None = None) -> Callable[[View], View]:
    """A UI view answering the methods given a permission, each for staff users who have it.

    Anyone else who is not staff goes to the admin's login page and back; a staff user without
    the permission gets a 403 page naming it (a redirect to the login page would loop). Path
    segments are checked before the view runs, and BadInput from the view becomes a 400 page
    naming the parameters. The view's statements run under the UI's statement timeout, and one
    stopped by it makes a 503 page saying what to narrow (ui/statement_timeout.py).
    """
    permissions = {method: name for method, name in (("GET", get), ("POST", post)) if name}

    def decorate(view: View) -> View:
        @wraps(view)
        def checked(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
            try:
                require(request, permissions[request.method or "GET"])
                check_path(kwargs)
                with statement_timeout():
                    return view(request, *args, **kwargs)
            except MissingPermission as missing:
                return permission_needed(request, missing.permission)
            except BadInput as bad:
                return bad_request(request, bad)
            except OperationalError as error:
                if not timed_out(error):
                    raise  # the database unreachable: broker/api/errors.py answers it
                return took_too_long(request)

        staff_only = staff_member_required(checked, login_url="admin:login")
        answered = require_http_methods(list(permissions))(staff_only)
        # Whether a link may lead here: an action's URL, which only a form posts to, is no
        # page to go back to (views.came_from).
        answered.shows_a_page = get is not None  # type: ignore[attr-defined]
        return cast(View, answered)

    return decorate


def permission_needed(request: HttpRequest, permission: str) -> HttpResponse:
    context = {"permission": permission, "group": BROKER_ADMIN_GROUP}
    return render(request, "ui/permission_needed.html", context, status=403)


def bad_request(request: HttpRequest, bad: BadInput) -> HttpResponse:
    return render(request, "ui/bad_request.html", {"problems": bad.problems}, status=400)
