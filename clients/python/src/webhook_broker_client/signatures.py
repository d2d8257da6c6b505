"""`verify()`: check a webhook's Standard Webhooks signature before trusting its body.

The broker signs every push delivery (docs/api.md, "Signing secrets"): `webhook-id`,
`webhook-timestamp` (unix seconds) and `webhook-signature`, a space-separated list of
`<version>,<base64 signature>` entries over `{webhook-id}.{webhook-timestamp}.{body}`, the body
as raw bytes. One entry per key the consumer currently signs with: during a secret's rotation
both the new and the previous secret sign, and either one verifies.

Versions, chosen by the key given:
- `v1`, HMAC-SHA256, with the consumer's secret `whsec_<base64 key>` (or the raw key bytes);
- `v1a`, Ed25519, with a public key `whpk_<base64 of 32 bytes>` (the broker's issue 41). It
  needs the `cryptography` package (`pip install webhook-broker-client[ed25519]`), imported
  only when such a key is used. Another scheme is one more `_Scheme` in `_scheme_for`.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

__all__ = [
    "InvalidSignature",
    "TimestampOutOfTolerance",
    "WebhookVerificationError",
    "verify",
]

SECRET_PREFIX = "whsec_"  # noqa: S105 (a prefix, not a secret)
PUBLIC_KEY_PREFIX = "whpk_"
DEFAULT_TOLERANCE = timedelta(minutes=5)
# Unix seconds as the broker writes them: ASCII digits, at most 12 (until the year 33658). The
# TypeScript client's bound too; it keeps a forged huge value away from datetime's range limits.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


class WebhookVerificationError(Exception):
    """The webhook cannot be trusted: answer it with a 4xx and do not act on it."""


class InvalidSignature(WebhookVerificationError):
    """No signature matches (wrong key, changed body or headers), or the headers are missing."""


class TimestampOutOfTolerance(WebhookVerificationError):
    """`webhook-timestamp` is too far from now: an old delivery replayed, or a wrong clock."""


@dataclass(frozen=True)
class _Scheme:
    """One signature version: its name in the header and how to check one signature."""

    version: str
    check: Callable[[bytes, bytes], bool]  # (signed content, signature) -> matches


def verify(
    headers: Mapping[str, str] | Any,
    body: bytes | str,
    secret_or_public_key: str | bytes,
    *,
    tolerance: timedelta = DEFAULT_TOLERANCE,
    now: datetime | None = None,
) -> None:
    """Return when the webhook is signed by the key and recent; raise otherwise.

    `headers`: the request's headers, any mapping (or anything with `.items()`, such as
    Flask's or Starlette's), in any letter case. `body`: the raw body as received (str is
    taken as its UTF-8 bytes), never a parsed and re-serialised form of it. `now`: the time
    to judge the timestamp against (default: the clock).
    """
    scheme = _scheme_for(secret_or_public_key)  # a wrong key is the receiver's bug: first
    received = {str(name).lower(): str(value) for name, value in headers.items()}
    webhook_id = _required(received, "webhook-id")
    timestamp_text = _required(received, "webhook-timestamp")
    signatures = _required(received, "webhook-signature")
    _check_tolerance(_timestamp(timestamp_text), now or datetime.now(UTC), tolerance)
    payload = body.encode() if isinstance(body, str) else bytes(body)
    # The header's text as received is what was signed (as the TypeScript client reads it).
    signed = f"{webhook_id}.{timestamp_text}.".encode() + payload
    for entry in signatures.split():
        version, _, encoded = entry.partition(",")
        if version == scheme.version and scheme.check(signed, _decode_signature(encoded)):
            return
    raise InvalidSignature(
        f"no {scheme.version} signature in webhook-signature matches this key and body"
    )


def _required(received: Mapping[str, str], name: str) -> str:
    value = received.get(name, "").strip()
    if not value:
        raise InvalidSignature(f"the {name} header is missing: not a signed webhook")
    return value


def _timestamp(value: str) -> int:
    """The header's unix seconds; a value that is not 1 to 12 digits is refused, unsigned."""
    if not _TIMESTAMP.fullmatch(value):
        raise InvalidSignature(
            f"webhook-timestamp is not unix seconds (1 to 12 digits): {value[:40]!r}"
        )
    return int(value)


def _check_tolerance(timestamp: int, now: datetime, tolerance: timedelta) -> None:
    # Compared as numbers: a timestamp far outside datetime's years must be refused, not crash.
    off_by = timestamp - now.timestamp()
    if abs(off_by) > tolerance.total_seconds():
        direction = "in the future" if off_by > 0 else "in the past"
        raise TimestampOutOfTolerance(
            f"webhook-timestamp {timestamp} is {abs(off_by):.0f} s {direction} "
            f"(now {now.isoformat()}); the tolerance is {tolerance.total_seconds():.0f} s"
        )


def _decode_signature(encoded: str) -> bytes:
    try:
        return base64.b64decode(encoded, validate=True)
    except (binascii.Error, ValueError):
        return b""  # a malformed entry matches nothing


def _scheme_for(key: str | bytes) -> _Scheme:
    """The signature version the key verifies, with its check."""
    if isinstance(key, bytes):
        return _hmac_scheme(key)
    if key.startswith(SECRET_PREFIX):
        return _hmac_scheme(_decode_key(key, SECRET_PREFIX))
    if key.startswith(PUBLIC_KEY_PREFIX):
        return _ed25519_scheme(_decode_key(key, PUBLIC_KEY_PREFIX))
    raise ValueError(
        f"the key must be a signing secret ({SECRET_PREFIX}...) or a public key "
        f"({PUBLIC_KEY_PREFIX}...), as the broker's admin API gives it"
    )


def _decode_key(key: str, prefix: str) -> bytes:
    try:
        return base64.b64decode(key.removeprefix(prefix), validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"the key must be {prefix} followed by standard base64") from None


def _hmac_scheme(key: bytes) -> _Scheme:
    def check(signed: bytes, signature: bytes) -> bool:
        expected = hmac.new(key, signed, hashlib.sha256).digest()
        return hmac.compare_digest(expected, signature)

    return _Scheme("v1", check)


def _ed25519_scheme(raw_public_key: bytes) -> _Scheme:
    try:
        from cryptography.exceptions import InvalidSignature as BadEd25519
        from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
    except ImportError:  # pragma: no cover - depends on what is installed
        raise RuntimeError(
            "verifying v1a (Ed25519) signatures needs the cryptography package: "
            "pip install 'webhook-broker-client[ed25519]'"
        ) from None
    public_key = Ed25519PublicKey.from_public_bytes(raw_public_key)

    def check(signed: bytes, signature: bytes) -> bool:
        try:
            public_key.verify(signature, signed)
        except BadEd25519:
            return False
        return True

    return _Scheme("v1a", check)
