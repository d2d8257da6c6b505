"""Routes of the operator UI, included under /ui/ by broker/urls.py. Each page area keeps its
own `urlpatterns` next to its views."""

from __future__ import annotations

from django.urls import path

from ui import consumer_pages, dashboard, message_pages, report_pages, schedule_pages, views

app_name = "ui"

urlpatterns = [
    path("dead-jobs", views.dead_jobs, name="dead-jobs"),
    path("dead-jobs/bulk", views.bulk_action, name="bulk-action"),
    path("dead-jobs/requeue-since", views.requeue_since, name="requeue-since"),
    path("jobs/<str:job_id>", views.job_detail, name="job"),
    path("jobs/<str:job_id>/requeue", views.requeue_job, name="requeue-job"),
    *dashboard.urlpatterns,
    *consumer_pages.urlpatterns,
    *message_pages.urlpatterns,
    *schedule_pages.urlpatterns,
    *report_pages.urlpatterns,
]
