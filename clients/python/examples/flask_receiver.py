"""A Flask receiver for the broker's push deliveries, signature checked first.

Run: WEBHOOK_SIGNING_SECRET=whsec_... flask --app flask_receiver run --port 8080
"""

from __future__ import annotations

import os

from flask import Flask, request

from webhook_broker_client import WebhookVerificationError, verify

SIGNING_SECRET = os.environ["WEBHOOK_SIGNING_SECRET"]
app = Flask(__name__)


@app.post("/hooks/orders")
def receive_webhook() -> tuple[str, int]:
    body = request.get_data()  # the raw bytes, before any parsing
    try:
        verify(request.headers, body, SIGNING_SECRET)
    except WebhookVerificationError as refused:
        return str(refused), 400
    handle(request.headers["webhook-id"], body)
    return "", 204


def handle(message_id: str, body: bytes) -> None:
    """Your work. A retried delivery has the same webhook-id: deduplicate by it."""
