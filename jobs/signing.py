"""Standard Webhooks signatures for push deliveries (docs/dispatcher.md; docs/delivery.md,
"Signing"): the one place signing lives.

A consumer's secret is "whsec_" + base64 of the HMAC key. Each delivery carries `webhook-id`,
`webhook-timestamp` (unix seconds) and `webhook-signature`: space-separated `v1,<base64 HMAC-SHA256
of "{id}.{timestamp}.{body}">` entries, one per secret the consumer currently accepts, so a
receiver that has not switched to a rotated secret yet keeps verifying during the overlap.
See https://www.standardwebhooks.com/.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from consumers.models import Consumer

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
# Below 24 bytes an HMAC key is guessable in principle; above 64 (the SHA-256 block size) HMAC
# hashes the key first, so longer keys add nothing. Generated secrets have 32.
MIN_KEY_BYTES = 24
MAX_KEY_BYTES = 64


class InvalidSecret(ValueError):
    """A signing secret that is not "whsec_" + base64 of 24..64 bytes. Never holds the secret."""


def decode_secret(secret: str) -> bytes:
    """The HMAC key inside a "whsec_…" secret; InvalidSecret when it is malformed."""
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidSecret(f"must start with {SECRET_PREFIX}.")
    try:
        # validate=True: b64decode would otherwise drop stray characters and sign with a key
        # other than the one the receiver decodes.
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except (binascii.Error, ValueError):
        # The message deliberately leaves out the value: it is a secret.
        raise InvalidSecret(f"must be {SECRET_PREFIX} followed by standard base64.") from None
    if not MIN_KEY_BYTES <= len(key) <= MAX_KEY_BYTES:
        raise InvalidSecret(f"the key must be {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes.")
    return key


def sign(secret: str, webhook_id: str, timestamp: int, payload: bytes) -> str:
    """One `v1,<base64 signature>` entry of the `webhook-signature` header."""
    # The body is signed as raw bytes, so binary payloads sign exactly as they are sent.
    signed = f"{webhook_id}.{timestamp}.".encode() + payload
    digest = hmac.new(decode_secret(secret), signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def signature_headers(
    consumer: Consumer, webhook_id: str, payload: bytes, now: datetime
) -> dict[str, str]:
    """The Standard Webhooks headers for delivering `payload` to `consumer` at `now`.

    `now` should be the moment of sending, not of claiming: receivers reject timestamps more than
    a few minutes (five, in the reference libraries) from their clock, as replay protection.
    """
    timestamp = int(now.timestamp())
    signatures = [
        sign(secret, webhook_id, timestamp, payload)
        for secret in consumer.active_signing_secrets(now)
    ]
    return _headers(webhook_id, timestamp, signatures)


def chunked_signature_headers(
    consumer: Consumer, webhook_id: str, chunks: Iterable[bytes], now: datetime
) -> dict[str, str]:
    """`signature_headers` for a payload read chunk by chunk (an offloaded one, docs/delivery.md,
    "Large payloads"): the same HMACs, fed as the chunks come, so the payload is never in memory
    whole."""
    timestamp = int(now.timestamp())
    signed_prefix = f"{webhook_id}.{timestamp}.".encode()
    macs = [
        hmac.new(decode_secret(secret), signed_prefix, hashlib.sha256)
        for secret in consumer.active_signing_secrets(now)
    ]
    for chunk in chunks:
        for mac in macs:
            mac.update(chunk)
    signatures = ["v1," + base64.b64encode(mac.digest()).decode() for mac in macs]
    return _headers(webhook_id, timestamp, signatures)


def _headers(webhook_id: str, timestamp: int, signatures: list[str]) -> dict[str, str]:
    return {
        "webhook-id": webhook_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": " ".join(signatures),
    }
