"""Gateway authentication: webhook-broker's HMAC perimeter check (docs/api.md, "Gateway
authentication").

With BROKER_GATEWAY_AUTH_MODE=hmac every request outside BROKER_GATEWAY_AUTH_EXEMPT_PATHS must
carry `X-Broker-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256 of "<t>.<raw body>">` under the
shared secret. It is checked before any other work; the channel, producer, consumer and admin
checks still apply after it. Refusals are logged with the request's ID, never with the signature.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import logging
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from django.core.exceptions import ImproperlyConfigured, RequestDataTooBig
from django.http import HttpRequest, HttpResponse, JsonResponse

from broker.conf import broker_settings
from broker.request_ids import request_id_of
from broker.settings_catalog import GATEWAY_AUTH_MODES

logger = logging.getLogger("broker.gateway")

MODES = GATEWAY_AUTH_MODES  # declared with BROKER_GATEWAY_AUTH_MODE

SIGNATURE_HEADER = "X-Broker-Signature"
_TIMESTAMP = re.compile(r"[+-]?[0-9]{1,19}\Z")  # what Go's strconv.ParseInt takes


@dataclass(frozen=True)
class Refusal:
    status: int
    reason: str


MISSING = Refusal(401, f"missing {SIGNATURE_HEADER} header")
MALFORMED = Refusal(401, f"malformed {SIGNATURE_HEADER} header")
OUTSIDE_WINDOW = Refusal(403, "request timestamp outside tolerance window")
WRONG = Refusal(403, "invalid signature")


@functools.lru_cache(maxsize=4)  # read at each request, so that tests can override the setting
def decode_secret(secret: str) -> bytes:
    """The shared secret's bytes; ImproperlyConfigured (never echoing it) if it is no base64."""
    try:
        raw = base64.b64decode(secret, validate=True)
    except (binascii.Error, ValueError):
        raw = b""
    if not raw:
        raise ImproperlyConfigured(
            "BROKER_GATEWAY_HMAC_SECRET must be a non-empty base64 string with "
            "BROKER_GATEWAY_AUTH_MODE=hmac (generate one with `openssl rand -base64 32`)."
        )
    return raw


def check_mode(mode: str, secret: str) -> None:
    """Refuse a configuration the middleware could not enforce (at start-up, in settings)."""
    if mode not in MODES:
        raise ImproperlyConfigured(f"BROKER_GATEWAY_AUTH_MODE={mode!r} must be none or hmac.")
    if mode == "hmac":
        decode_secret(secret)


def parse_signature(header: str) -> tuple[int, str] | None:
    """(t, v1) of `t=<seconds>,v1=<hex>`, in either order; None if malformed."""
    parts = [part.strip() for part in header.split(",")]
    if len(parts) != 2:
        return None
    found = dict(part.split("=", 1) for part in parts if "=" in part)
    timestamp, signature = found.get("t"), found.get("v1")
    if timestamp is None or signature is None or not _TIMESTAMP.match(timestamp):
        return None
    return int(timestamp), signature


def sign(secret: bytes, timestamp: int, body: bytes) -> str:
    """The v1 value for a body sent at `timestamp`, as a client computes it."""
    return hmac.new(secret, f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()


def check_signature(
    header: str | None, read_body: Callable[[], bytes], secret: bytes, tolerance: int, now: int
) -> Refusal | None:
    """Why a request fails the check, or None if it passes. The body is read only once the
    header and its timestamp are acceptable."""
    if not header:
        return MISSING
    parsed = parse_signature(header)
    if parsed is None:
        return MALFORMED
    timestamp, signature = parsed
    if abs(now - timestamp) > tolerance:
        return OUTSIDE_WINDOW
    expected = sign(secret, timestamp, read_body())
    # Bytes, not str: compare_digest refuses non-ASCII text, and a header may hold any latin-1.
    if not hmac.compare_digest(expected.encode(), signature.encode("latin-1", "replace")):
        return WRONG
    return None


def is_exempt(path: str) -> bool:
    return any(
        path.startswith(prefix) for prefix in broker_settings.BROKER_GATEWAY_AUTH_EXEMPT_PATHS
    )


class GatewayAuthMiddleware:
    """First in MIDDLEWARE: a refused request reaches nothing else (no session, no database)."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if broker_settings.BROKER_GATEWAY_AUTH_MODE != "hmac" or is_exempt(request.path):
            return self.get_response(request)
        try:
            refusal = check_signature(
                request.headers.get(SIGNATURE_HEADER),
                lambda: request.body,
                decode_secret(broker_settings.BROKER_GATEWAY_HMAC_SECRET),
                broker_settings.BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS,
                int(time.time()),  # whole seconds, as the client's t and webhook-broker's check
            )
        except RequestDataTooBig:
            refusal = Refusal(413, "request body too large")
        if refusal is None:
            return self.get_response(request)
        logger.warning(
            "gateway auth refused %s %s: %s (request %s, from %s)",
            request.method,
            request.path[:200],
            refusal.reason,
            request_id_of(request),
            request.META.get("REMOTE_ADDR", "?"),
        )
        return JsonResponse({"Error": refusal.reason}, status=refusal.status)
