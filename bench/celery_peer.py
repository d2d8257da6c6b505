"""The peer of bench/dispatch.py: a "Celery + requests" webhook sender, as teams write it.

One task per webhook: POST the payload with a timeout and no redirects, sign it the Standard
Webhooks way (as the broker does, so both sides do the same work per request), and retry with
exponential backoff on a connection error, a timeout or a non-2xx answer. RabbitMQ on 127.0.0.1 is
the Celery broker; no result backend (nobody reads the results of fire-and-forget webhooks).
Celery's defaults otherwise: early acknowledgement, a prefetch multiplier of 4, JSON.

The requests session is made once per worker process, so connections are kept alive between
tasks: the generous version of the pattern (many senders call `requests.post`, which connects
anew each time).

    cd bench && ../.venv/bin/celery -A celery_peer worker --concurrency 1 -Q bench_dispatch

Needs `pip install -r bench/requirements.txt`.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
import time
from typing import Any

import requests  # type: ignore[import-untyped,import-not-found,unused-ignore]
from celery import Celery  # type: ignore[import-untyped,import-not-found,unused-ignore]

BROKER_URL = os.environ.get("BENCH_CELERY_BROKER_URL", "amqp://guest:guest@127.0.0.1:5672//")
QUEUE = "bench_dispatch"
TIMEOUT_SECONDS = 30
MAX_RETRIES = 8
# The same kind of secret the broker signs with: "whsec_" + base64 of 32 bytes (a throwaway one).
SIGNING_KEY = hashlib.sha256(b"bench signing key").digest()

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
session = requests.Session()


def signature_headers(message_id: str, body: bytes) -> dict[str, str]:
    timestamp = int(time.time())
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(SIGNING_KEY, signed, hashlib.sha256).digest()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


@app.task(bind=True, max_retries=MAX_RETRIES)  # type: ignore[untyped-decorator,unused-ignore]
def send_webhook(self: Any, url: str, body: str, headers: dict[str, str]) -> None:
    payload = body.encode()
    try:
        response = session.post(
            url,
            data=payload,
            headers={**headers, **signature_headers(headers["X-Broker-Message-ID"], payload)},
            timeout=TIMEOUT_SECONDS,
            allow_redirects=False,
        )
        if not 200 <= response.status_code < 300:
            raise requests.HTTPError(f"HTTP {response.status_code}", response=response)
    except requests.RequestException as exc:
        raise self.retry(exc=exc, countdown=min(30 * 2**self.request.retries, 3600)) from exc
