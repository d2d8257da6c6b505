"""Reads that may be a moment old go to the read replica (BROKER_READ_DATABASE_URL), everything
else to the primary (docs/configuration.md#read-replica).

Installed by broker/settings.py only when the replica is configured. Two parts:

- `ReplicaReadMiddleware` marks a request as replica-read when it is a GET (or HEAD) of one of
  `REPLICA_VIEWS`: pages and endpoints that only read and that an operator reads, never a form
  that is about to change something, nor what producers, consumers or dispatchers act on;
- `ReadReplicaRouter` sends the reads of a marked request to the replica, and every other query
  to the primary: every write, every `select_for_update`, every read outside such a request
  (the dispatcher, housekeeping, management commands) and every read inside a transaction.

A replica that cannot be reached is not used: the request reads from the primary, and so do
this process's requests for the next `RETRY_REPLICA_AFTER_SECONDS`.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from django.db import DEFAULT_DB_ALIAS, DatabaseError, connections
from django.db.models import Model
from django.http import HttpRequest, HttpResponse

from broker.env import READ_REPLICA

logger = logging.getLogger(__name__)

PRIMARY = DEFAULT_DB_ALIAS
RETRY_REPLICA_AFTER_SECONDS = 30.0

# Views whose GET only reads what may lag a little: the operator UI's pages that show things, and
# the admin API's lists and summaries. Forms (create, edit, confirmations) stay on the primary, so
# that what an operator submits starts from the current state; so do single stakeholders (a
# client reads one to send its ChangedAt back with a change), the pull API (a worker acts on
# what it reads), signing secrets, `/_status` (the primary's health) and the admin site.
REPLICA_VIEWS = frozenset(
    {
        "broker.api.event_types.EventTypeListView",
        "broker.api.messages.MessageDetailView",
        "broker.api.messages.MessageListView",
        "broker.api.messages.MessagesStatusView",
        "broker.api.periodic.PeriodicMessageListView",
        "broker.api.scheduled.ScheduledMessageListView",
        "broker.api.stakeholders.ChannelListView",
        "broker.api.stakeholders.ProducerListView",
        "consumers.api.ConsumerListView",
        "jobs.api.dlq.DeadLetterQueueView",
        "jobs.api.metrics.MetricsView",
        "jobs.api.summaries.DlqStatusView",
        "jobs.api.summaries.JobStatusView",
        "broker.ui.consumer_pages.consumer_detail",
        "broker.ui.consumer_pages.consumer_list",
        "broker.ui.dashboard.dashboard",
        "broker.ui.message_pages.message_by_id",
        "broker.ui.message_pages.message_detail",
        "broker.ui.message_pages.message_search",
        "broker.ui.periodic_pages.periodic_list",
        "broker.ui.report_pages.reports",
        "broker.ui.schedule_pages.scheduled_detail",
        "broker.ui.schedule_pages.scheduled_list",
        "broker.ui.views.dead_jobs",
        "broker.ui.views.job_detail",
    }
)
READ_METHODS = frozenset({"GET", "HEAD"})

# Never read from the replica, even in a marked request: a user who has just logged in, or been
# given a permission, must be recognised on the next page, lag or not.
PRIMARY_APPS = frozenset({"admin", "auth", "contenttypes", "sessions", "django_q"})

# Whether the current request's reads may go to the replica. A context variable, so that each
# request (thread) has its own and code outside a request never sees one set.
_replica_reads: ContextVar[bool] = ContextVar("broker_replica_reads", default=False)
_replica_down_until = 0.0  # time.monotonic(): the replica failed; the primary until then


class ReadReplicaRouter:
    """Django's database router (settings.DATABASE_ROUTERS) of the replica."""

    def db_for_read(self, model: type[Model], **hints: Any) -> str:
        if (
            _replica_reads.get()
            and model._meta.app_label not in PRIMARY_APPS
            # A read in a transaction belongs with the transaction's writes.
            and not connections[PRIMARY].in_atomic_block
        ):
            return READ_REPLICA
        return PRIMARY

    def db_for_write(self, model: type[Model], **hints: Any) -> str:
        # A request that writes after all reads from the primary from then on, so that it sees
        # what it wrote. (select_for_update() is a write here too: Django asks for a write
        # database.)
        _replica_reads.set(False)
        return PRIMARY

    def allow_relation(self, obj1: Model, obj2: Model, **hints: Any) -> bool:
        return True  # the same data on both

    def allow_migrate(self, db: str, app_label: str, **hints: Any) -> bool:
        return db == PRIMARY  # the replica follows the primary's schema through replication


class ReplicaReadMiddleware:
    """Marks a GET of one of REPLICA_VIEWS as replica-read, while the replica answers."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        with replica_reads(allowed=False):  # until process_view says otherwise
            return self.get_response(request)

    def process_view(
        self,
        request: HttpRequest,
        view_func: Callable[..., HttpResponse],
        view_args: Any,
        view_kwargs: Any,
    ) -> None:
        if (
            request.method in READ_METHODS
            and view_name(view_func) in REPLICA_VIEWS
            and replica_is_reachable()
        ):
            _replica_reads.set(True)


@contextmanager
def replica_reads(*, allowed: bool) -> Iterator[None]:
    """Within: reads may go to the replica (or not); afterwards, what was before."""
    token = _replica_reads.set(allowed)
    try:
        yield
    finally:
        _replica_reads.reset(token)


def view_name(view_func: Callable[..., HttpResponse]) -> str:
    """`module.name` of a view function, or of the class behind a class-based view's function."""
    view = getattr(view_func, "view_class", view_func)
    return f"{view.__module__}.{view.__qualname__}"


def replica_is_reachable() -> bool:
    """Whether this request can read from the replica: a connection to it is open (or opens)
    and answers. After a failure, the replica is not tried again for a while, so that requests
    do not each wait for a connection that will not come."""
    global _replica_down_until  # this process remembers a failure
    if time.monotonic() < _replica_down_until:
        return False
    replica = connections[READ_REPLICA]
    try:
        replica.close_if_health_check_failed()
        replica.ensure_connection()
    except DatabaseError as error:
        _replica_down_until = time.monotonic() + RETRY_REPLICA_AFTER_SECONDS
        logger.warning(
            "read replica unavailable (%s): reads go to the primary for %d s",
            type(error).__name__,
            RETRY_REPLICA_AFTER_SECONDS,
        )
        return False
    return True
