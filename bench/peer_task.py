"""The webhook task of bench/dispatch.py's peers, the same whatever queue runs it.

One call per webhook: POST the payload with requests, a timeout and no redirects, signed the
Standard Webhooks way (as the broker does, so both sides do the same work per request). A
connection error, a timeout or a non-2xx answer raises `requests.RequestException`; each peer
then retries the webhook its own queue's way with the same schedule: at most MAX_RETRIES times,
`retry_countdown(n)` seconds after the n-th failure (counted from 0), as Celery's `self.retry`
with a countdown is commonly written.

The requests session is made once per worker process, so connections are kept alive between
tasks: the generous version of the pattern (many senders call `requests.post`, which connects
anew each time).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import time

import requests  # type: ignore[import-untyped,import-not-found,unused-ignore]

TIMEOUT_SECONDS = 30
MAX_RETRIES = 8
# The same kind of secret the broker signs with: "whsec_" + base64 of 32 bytes (a throwaway one).
SIGNING_KEY = hashlib.sha256(b"bench signing key").digest()

session = requests.Session()
# What a failed delivery raises: each peer retries on this and on nothing else.
DeliveryFailed = requests.RequestException


def signature_headers(message_id: str, body: bytes) -> dict[str, str]:
    timestamp = int(time.time())
    signed = f"{message_id}.{timestamp}.".encode() + body
    digest = hmac.new(SIGNING_KEY, signed, hashlib.sha256).digest()
    return {
        "webhook-id": message_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": "v1," + base64.b64encode(digest).decode(),
    }


def post_webhook(url: str, body: str, headers: dict[str, str]) -> None:
    """Deliver one webhook; `requests.RequestException` unless it was answered 2xx."""
    payload = body.encode()
    response = session.post(
        url,
        data=payload,
        headers={**headers, **signature_headers(headers["X-Broker-Message-ID"], payload)},
        timeout=TIMEOUT_SECONDS,
        allow_redirects=False,
    )
    if not 200 <= response.status_code < 300:
        raise requests.HTTPError(f"HTTP {response.status_code}", response=response)


def retry_countdown(retries: int) -> int:
    """Seconds before the next try after failure number `retries` (0 for the first)."""
    return int(min(30 * 2**retries, 3600))
