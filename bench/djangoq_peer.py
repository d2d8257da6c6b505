"""A peer of bench/dispatch.py: django-q2 with its ORM broker on PostgreSQL, + requests.

django-q2 already runs the broker's housekeeping, so this is the queue a team that has the broker's
stack at hand would reach for. One task per webhook (bench/peer_task.py's POST); a failed delivery
(a connection error, a timeout or a non-2xx answer, and nothing else) is scheduled again with the
Celery peer's countdown as a one-off django-q2 schedule, since django-q2 has no countdown of its
own. Tasks are queued with `save=False`: no result is stored for a successful one (the Celery peer
has no result backend either), then the queue's table is analyzed.

The cluster is `manage.py qcluster` with the broker's own settings (broker/settings.py:
`Q_CLUSTER`, the ORM broker on the bench's database, its database pool) and
BROKER_HOUSEKEEPING_WORKERS set to as many worker processes as the run has dispatchers, logging
at WARNING (django-q2 logs a line per task at INFO; the Celery worker runs at WARNING too); its
sentinel, pusher and monitor processes count as the peer's CPU too, as Celery's pool parent
does. Each worker delivers one webhook at a time.

Needs the bench's Django set up (bench/dispatch.py does it).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from datetime import timedelta
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING

from peer_task import MAX_RETRIES, DeliveryFailed, post_webhook, retry_countdown

if TYPE_CHECKING:
    from dispatch_harness import Webhook

TASK = "djangoq_peer.send_webhook"


def send_webhook(url: str, body: str, headers: dict[str, str], retries: int = 0) -> None:
    try:
        post_webhook(url, body, headers)
    except DeliveryFailed:
        if retries >= MAX_RETRIES:
            raise
        from django.utils import timezone
        from django_q.models import Schedule  # type: ignore[import-untyped,unused-ignore]
        from django_q.tasks import schedule  # type: ignore[import-untyped,unused-ignore]

        next_run = timezone.now() + timedelta(seconds=retry_countdown(retries))
        schedule(
            TASK, url, body, headers, retries=retries + 1,
            schedule_type=Schedule.ONCE, next_run=next_run, q_options={"save": False},
        )  # fmt: skip


class DjangoQPeer:
    """The bench's side: the queued tasks in the ORM broker's table, the cluster."""

    name = "django-q2"
    broker = "database"
    database: str | None = None  # the bench's: the broker's own settings

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env  # the bench's: its database, the broker's settings

    def label(self, processes: int) -> str:
        return f"django-q2 {version('django-q2')} + requests, ORM broker, {processes} worker(s)"

    @staticmethod
    def unavailable() -> str | None:
        return None  # a dependency of the broker

    @staticmethod
    def open() -> None:
        from django_q.conf import Conf  # type: ignore[import-untyped,unused-ignore]
        from django_q.models import OrmQ, Schedule  # type: ignore[import-untyped,unused-ignore]

        OrmQ.objects.filter(key=Conf.CLUSTER_NAME).delete()
        Schedule.objects.filter(func=TASK).delete()

    @classmethod
    def close(cls) -> None:
        cls.open()  # what is left of the run's tasks and retries goes

    @staticmethod
    def enqueue(webhooks: list[Webhook]) -> None:
        from django.db import connection
        from django_q.tasks import async_task  # type: ignore[import-untyped,unused-ignore]

        logging.getLogger("django-q").setLevel(logging.WARNING)  # not a line per task queued
        for webhook in webhooks:
            headers = webhook.headers("bench-django-q2/1")
            async_task(TASK, webhook.url, webhook.body, headers, save=False)
        with connection.cursor() as cursor:  # as autovacuum would (this server runs without it)
            cursor.execute("ANALYZE django_q_ormq")

    def start(self, processes: int, log: Path) -> subprocess.Popen[bytes]:
        from dispatch_harness import BENCH, ROOT, start_process

        env = {
            **self.env,
            "BROKER_HOUSEKEEPING_WORKERS": str(processes),
            "DJANGO_LOG_LEVEL": "WARNING",  # no line per task, as the Celery worker's
            "PYTHONPATH": str(BENCH),
        }
        return start_process([sys.executable, str(ROOT / "manage.py"), "qcluster"], log, env)
