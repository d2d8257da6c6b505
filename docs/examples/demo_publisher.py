"""The compose demo's publisher (compose.yaml, profile `demo`; docs/deploy.md): registers a channel,
a producer and a push consumer that delivers to the demo's receiver, then publishes one message.
Standard library only, so that it runs in the broker's image as it is.

    BROKER_ADMIN_TOKENS=... BROKER_DEMO_SIGNING_SECRET=whsec_... python3 demo_publisher.py

The consumer signs with BROKER_DEMO_SIGNING_SECRET (imported with the consumer's `signingSecret`
field), the secret the receiver (docs/examples/receiver.py) verifies with, so the two need no
channel between them but the environment. Run again, it updates the three and publishes again.
"""

from __future__ import annotations

import json
import os
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request

BROKER_URL = os.environ.get("BROKER_URL", "http://web:8000")
CALLBACK_URL = os.environ.get("BROKER_DEMO_CALLBACK_URL", "http://receiver:9000/hook")
CHANNEL, PRODUCER, CONSUMER = "demo", "demo-publisher", "demo-receiver"


class BrokerError(Exception):
    """An answer the demo cannot go on from: its status and what the broker said."""


def request(
    method: str, path: str, headers: dict[str, str], body: bytes | None = None
) -> tuple[int, dict[str, str], bytes]:
    call = urllib.request.Request(BROKER_URL + path, body, headers, method=method)  # noqa: S310
    try:
        with urllib.request.urlopen(call, timeout=30) as answer:  # noqa: S310 (BROKER_URL)
            return answer.status, dict(answer.headers), answer.read()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, dict(error.headers), error.read()


def put(path: str, admin: dict[str, str], **form: str) -> None:
    """Create or update: an update must name the version it replaces (If-Unmodified-Since), so
    a second run of the demo reads it first."""
    headers = {**admin, "Content-Type": "application/x-www-form-urlencoded"}
    status, current, _ = request("GET", path, admin)
    if status == 200:
        headers["If-Unmodified-Since"] = current["Last-Modified"]
    status, _, body = request("PUT", path, headers, urllib.parse.urlencode(form).encode())
    if status != 200:
        raise BrokerError(f"PUT {path} answered {status}: {body.decode(errors='replace')}")


def main() -> None:
    admin_token = os.environ.get("BROKER_ADMIN_TOKENS", "").split(",")[0].strip()
    signing_secret = os.environ.get("BROKER_DEMO_SIGNING_SECRET", "")
    if not admin_token or not signing_secret:
        sys.exit("demo: set BROKER_ADMIN_TOKENS and BROKER_DEMO_SIGNING_SECRET (docs/deploy.md)")
    admin = {"Authorization": f"Bearer {admin_token}"}
    channel_token, producer_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    put(f"/channel/{CHANNEL}", admin, token=channel_token)
    put(f"/producer/{PRODUCER}", admin, token=producer_token)
    put(
        f"/channel/{CHANNEL}/consumer/{CONSUMER}",
        admin,
        callbackUrl=CALLBACK_URL,
        signingSecret=signing_secret,
        retryDelays="1,2,5",  # a receiver that starts late still gets it within seconds
    )
    print(f"demo: consumer {CHANNEL}/{CONSUMER} delivers to {CALLBACK_URL}", flush=True)
    status, headers, body = request(
        "POST",
        f"/channel/{CHANNEL}/broadcast",
        {
            "X-Broker-Channel-Token": channel_token,
            "X-Broker-Producer-ID": PRODUCER,
            "X-Broker-Producer-Token": producer_token,
            "Content-Type": "application/json",
        },
        json.dumps({"order": 1, "note": "published by the compose demo"}).encode(),
    )
    if status != 201:
        raise BrokerError(f"broadcast answered {status}: {body.decode(errors='replace')}")
    print(f"demo: published {headers['Location']}; the receiver prints it as verified", flush=True)


if __name__ == "__main__":
    try:
        main()
    except BrokerError as error:
        sys.exit(f"demo: {error}")
