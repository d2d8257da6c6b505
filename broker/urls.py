"""Routes: webhook-broker's REST paths (docs/api.md), the schema and docs, health, the admin, the
UI."""

from __future__ import annotations

from django.contrib import admin
from django.urls import include, path, register_converter
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView, SpectacularSwaggerView

from broker import views
from broker.api.broadcast import BroadcastView
from broker.api.broadcast_batch import BroadcastBatchView
from broker.api.event_types import EventTypeDetailView, EventTypeListView
from broker.api.messages import (
    MessageDetailView,
    MessageListView,
    MessageReplayView,
    MessagesStatusView,
)
from broker.api.periodic import PeriodicMessageDetailView, PeriodicMessageListView
from broker.api.scheduled import ScheduledMessageDetailView, ScheduledMessageListView
from broker.api.seed import SeedView
from broker.api.stakeholders import (
    ChannelDetailView,
    ChannelListView,
    ProducerDetailView,
    ProducerListView,
)
from broker.ui import error_pages
from consumers.api import (
    CloseCircuitView,
    ConsumerDetailView,
    ConsumerListView,
    PauseConsumerView,
    ResumeConsumerView,
    SigningSecretView,
)
from jobs.api.dlq import DeadLetterActionView, DeadLetterQueueView
from jobs.api.metrics import MetricsView
from jobs.api.pull import ClaimView, JobView, QueuedJobsView, RequeueDeadJobView
from jobs.api.pull_extend import ExtendView
from jobs.api.pull_report import ReportView
from jobs.api.summaries import DlqStatusView, JobStatusView


class KeyConverter:
    """A path segment without NUL: PostgreSQL text cannot hold NUL, so such an ID is a 404."""

    regex = "[^/\x00]+"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(KeyConverter, "key")

CONSUMER = "channel/<key:channel_id>/consumer/<key:consumer_id>"

urlpatterns = [
    path("", views.home, name="home"),
    path("_status", views.StatusView.as_view(), name="status"),
    path("producers", ProducerListView.as_view()),
    path("producer/<key:resource_id>", ProducerDetailView.as_view()),
    path("channels", ChannelListView.as_view()),
    path("channel/<key:resource_id>", ChannelDetailView.as_view()),
    path("channel/<key:channel_id>/broadcast", BroadcastView.as_view()),
    path("channel/<key:channel_id>/broadcast-batch", BroadcastBatchView.as_view()),
    path("channel/<key:channel_id>/messages", MessageListView.as_view()),
    path("channel/<key:channel_id>/messages-status", MessagesStatusView.as_view()),
    path("channel/<key:channel_id>/message/<key:message_id>", MessageDetailView.as_view()),
    path("channel/<key:channel_id>/message/<key:message_id>/replay", MessageReplayView.as_view()),
    path("channel/<key:channel_id>/scheduled-messages", ScheduledMessageListView.as_view()),
    path(
        "channel/<key:channel_id>/scheduled-message/<key:message_id>",
        ScheduledMessageDetailView.as_view(),
    ),
    path("channel/<key:channel_id>/event-types", EventTypeListView.as_view()),
    path("channel/<key:channel_id>/event-type/<key:name>", EventTypeDetailView.as_view()),
    path("channel/<key:channel_id>/periodic-messages", PeriodicMessageListView.as_view()),
    path(
        "channel/<key:channel_id>/periodic-message/<key:periodic_id>",
        PeriodicMessageDetailView.as_view(),
    ),
    path("channel/<key:channel_id>/consumers", ConsumerListView.as_view()),
    path(CONSUMER, ConsumerDetailView.as_view()),
    path(f"{CONSUMER}/queued-jobs", QueuedJobsView.as_view()),
    path(f"{CONSUMER}/claim", ClaimView.as_view()),
    path(f"{CONSUMER}/report", ReportView.as_view()),
    path(f"{CONSUMER}/extend", ExtendView.as_view()),
    path(f"{CONSUMER}/job/<key:job_id>", JobView.as_view()),
    path(f"{CONSUMER}/job/<key:job_id>/requeue-dead-job", RequeueDeadJobView.as_view()),
    path(f"{CONSUMER}/dlq", DeadLetterQueueView.as_view()),
    path(f"{CONSUMER}/dlq/action/<key:action_id>", DeadLetterActionView.as_view()),
    path(f"{CONSUMER}/secret", SigningSecretView.as_view()),
    path(f"{CONSUMER}/pause", PauseConsumerView.as_view()),
    path(f"{CONSUMER}/resume", ResumeConsumerView.as_view()),
    path(f"{CONSUMER}/circuit/close", CloseCircuitView.as_view()),
    path("seed", SeedView.as_view()),
    path("dlq-status", DlqStatusView.as_view()),
    path("metrics", MetricsView.as_view()),
    path("job-status", JobStatusView.as_view()),
    path("api/schema/", SpectacularAPIView.as_view(), name="schema"),
    path("api/docs/", SpectacularSwaggerView.as_view(url_name="schema"), name="api-docs"),
    path(
        "api/redoc/",
        SpectacularRedocView.as_view(url_name="schema", template_name="api/redoc.html"),
        name="api-redoc",
    ),
    path("admin/", admin.site.urls),
    path("ui/", include("broker.ui.urls")),
]

handler400 = error_pages.bad_request
handler403 = error_pages.permission_denied
handler404 = error_pages.not_found
handler500 = error_pages.server_error
