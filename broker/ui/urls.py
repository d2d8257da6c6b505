"""Routes of the operator UI, included under /ui/ by broker/urls.py. Each page area keeps its
own `urlpatterns` next to its views."""

from __future__ import annotations

from django.http import Http404, HttpRequest, HttpResponsePermanentRedirect
from django.urls import Resolver404, path, re_path, resolve
from django.utils.encoding import escape_uri_path

from broker.ui import (
    consumer_pages,
    dashboard,
    job_actions,
    message_pages,
    report_pages,
    schedule_pages,
    views,
)

app_name = "ui"


def without_slash(request: HttpRequest) -> HttpResponsePermanentRedirect:
    """308, so that a form posted to `/ui/x/` is posted again to `/ui/x`; a 404 when there is
    no page `/ui/x` either (Django's APPEND_SLASH sends `/ui/x` here when nothing else answers
    it, and the two redirects would otherwise loop)."""
    path_info = request.path_info.rstrip("/")
    try:
        match = resolve(path_info)
    except Resolver404:
        raise Http404(request.path) from None
    if match.url_name == "without-slash":
        raise Http404(request.path)
    query = request.META.get("QUERY_STRING", "")
    target = escape_uri_path(request.path.rstrip("/")) + (f"?{query}" if query else "")
    return HttpResponsePermanentRedirect(target, status=308)


urlpatterns = [
    path("dead-jobs", views.dead_jobs, name="dead-jobs"),
    *job_actions.urlpatterns,
    path("jobs/<str:job_id>", views.job_detail, name="job"),
    path("jobs/<str:job_id>/requeue", views.requeue_job, name="requeue-job"),
    *dashboard.urlpatterns,
    *consumer_pages.urlpatterns,
    *message_pages.urlpatterns,
    *schedule_pages.urlpatterns,
    *report_pages.urlpatterns,
    # Last: any page asked for with a trailing slash is the page without it.
    re_path(r"^.+/$", without_slash, name="without-slash"),
]
