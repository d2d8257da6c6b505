"""A peer of bench/dispatch.py: a "Celery + requests" webhook sender, as teams write it.

One task per webhook (bench/peer_task.py's POST), retried with `self.retry` and an exponential
countdown on a connection error, a timeout or a non-2xx answer. RabbitMQ on 127.0.0.1 is the
Celery broker; no result backend (nobody reads the results of fire-and-forget webhooks). Celery's
defaults otherwise: early acknowledgement, a prefetch multiplier of 4, JSON.

    cd bench && ../.venv/bin/celery -A celery_peer worker --concurrency 1 -Q bench_dispatch

The bench's side (`CeleryPeer`) queues the tasks with the worker stopped and starts one prefork
worker with as many processes as the run has dispatchers. Needs `pip install -r
bench/requirements.txt` and RabbitMQ (`rabbitmq-server -detached`).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery import Celery  # type: ignore[import-untyped,import-not-found,unused-ignore]
from peer_task import MAX_RETRIES, DeliveryFailed, post_webhook, retry_countdown

if TYPE_CHECKING:
    from dispatch_harness import Webhook

BROKER_URL = os.environ.get("BENCH_CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
RABBITMQ = ("127.0.0.1", 5672)
QUEUE = "bench_dispatch"

app = Celery("bench_dispatch", broker=BROKER_URL)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    task_serializer="json",
    accept_content=["json"],
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    # No remote-control mailbox: nothing to leave behind in RabbitMQ (the celery.pidbox exchange).
    worker_enable_remote_control=False,
)


@app.task(bind=True, max_retries=MAX_RETRIES)  # type: ignore[untyped-decorator,unused-ignore]
def send_webhook(self: Any, url: str, body: str, headers: dict[str, str]) -> None:
    try:
        post_webhook(url, body, headers)
    except DeliveryFailed as exc:
        countdown = retry_countdown(self.request.retries)
        raise self.retry(exc=exc, countdown=countdown) from exc


class CeleryPeer:
    """The bench's side: queue, start the worker, clean RabbitMQ up."""

    name = "celery"
    broker = "rabbitmq"
    database: str | None = None

    def __init__(self, pool: str = "prefork", concurrency: int = 0) -> None:
        self.pool = pool
        self.concurrency = concurrency  # 0: as many as the run's dispatchers

    def label(self, processes: int) -> str:
        return f"Celery {version('celery')} + requests, {self.pool} x {self.workers(processes)}"

    @staticmethod
    def unavailable() -> str | None:
        try:
            socket.create_connection(RABBITMQ, timeout=2).close()
        except OSError:
            return "RabbitMQ does not answer on 127.0.0.1:5672 (rabbitmq-server -detached)"
        return None

    def workers(self, processes: int) -> int:
        return self.concurrency or processes

    @staticmethod
    def open() -> None:
        app.control.purge()  # what an interrupted run may have left

    def enqueue(self, webhooks: list[Webhook]) -> None:
        with app.producer_or_acquire() as producer:
            for webhook in webhooks:
                arguments = (webhook.url, webhook.body, webhook.headers("bench-celery/1"))
                send_webhook.apply_async(arguments, producer=producer)

    def start(self, processes: int, log: Path) -> subprocess.Popen[bytes]:
        from dispatch_harness import BENCH, start_process

        command = [
            sys.executable, "-m", "celery", "-A", "celery_peer", "worker",
            "--pool", self.pool, "--concurrency", str(self.workers(processes)),
            "--loglevel", "WARNING", "-Q", QUEUE, "-n", f"bench-{os.getpid()}@%h",
            "--without-gossip", "--without-mingle", "--without-heartbeat",
        ]  # fmt: skip
        # Not the bench's Django settings: Celery would load its Django fix-up for them.
        env = {k: v for k, v in os.environ.items() if k != "DJANGO_SETTINGS_MODULE"}
        env["PYTHONPATH"] = str(BENCH)
        return start_process(command, log, env, cwd=BENCH)

    @staticmethod
    def close() -> None:
        """Leave RabbitMQ as it was: no bench queue, no bench exchange."""
        with app.connection_for_write() as connection:
            connection.default_channel.queue_delete(QUEUE)
            connection.default_channel.exchange_delete(QUEUE)
