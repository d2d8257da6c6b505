"""The one rule for which header values an attempt's record may not keep (docs/delivery.md, "What
an attempt keeps of its headers"): every request and response header goes through
`masked_headers` (in jobs/delivery.py's `kept_headers`) before it reaches an AttemptResult, so no
secret is ever stored, logged or shown.

A header is secret by its name: Authorization, Cookie, the Standard Webhooks `webhook-signature`,
the consumer token's header (`BROKER_CONSUMER_TOKEN_HEADER`, whatever it is called) and any
header whose name holds one of SECRET_NAME_PARTS in any case (so Proxy-Authorization, Set-Cookie,
X-Api-Key and a producer's X-Hub-Signature too). A secret value is replaced by MASK, keeping only
what tells the operator something and the receiver nothing: the scheme of a credential
("Bearer", "Basic") and the version of each Standard Webhooks signature ("v1,"), so the number of
signatures sent (two while a rotated secret overlaps) stays visible. An empty value stays empty.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable, Iterator

from broker.conf import broker_settings

MASK = "••••"
MASKED = " (masked)"  # ends every masked value, so that it is not read as what was sent
SECRET_NAME_PARTS = (
    "auth",
    "cookie",
    "credential",
    "key",
    "passw",
    "secret",
    "session",
    "signature",
    "token",
)
_SECRET_NAME = re.compile("|".join(SECRET_NAME_PARTS), re.IGNORECASE)
# Headers whose value is "<scheme> <credentials>" (RFC 9110, section 11): the scheme is kept.
_SCHEMED_HEADERS = frozenset(
    ["authorization", "proxy-authorization", "www-authenticate", "proxy-authenticate"]
)
# Only a known scheme is kept: a first word of another kind may be part of the secret.
_SCHEMES = frozenset(
    {"aws4-hmac-sha256", "basic", "bearer", "digest", "dpop", "hoba", "negotiate", "ntlm", "token"}
)
# A Standard Webhooks signature entry's version: "v1," (symmetric) or "v1a," (asymmetric).
_SIGNATURE_VERSION = re.compile(r"v[0-9]{1,3}a?,")


def masked_headers(headers: Iterable[tuple[str, str]]) -> Iterator[tuple[str, str]]:
    """`headers` in their order, each secret one's value masked."""
    # Names are compared, never values: these comparisons leak nothing through their timing.
    consumer_header = str(broker_settings.BROKER_CONSUMER_TOKEN_HEADER).lower()
    for name, value in headers:
        lower = name.lower()
        if value and (lower == consumer_header or is_secret_name(lower)):
            value = masked_value(lower, value)
        yield name, value


@functools.lru_cache(maxsize=512)
def is_secret_name(name: str) -> bool:
    """Whether a header of this (lower-case) name may carry a secret. Cached: the dispatcher
    meets the same few names on every delivery, and a receiver's new names only ever fill the
    bounded cache."""
    return _SECRET_NAME.search(name) is not None


def masked_value(name: str, value: str) -> str:
    """The value of the secret header `name` (lower-case), with only its harmless parts kept."""
    if name in _SCHEMED_HEADERS:
        scheme, _, credentials = value.partition(" ")
        if scheme.lower() in _SCHEMES and credentials.strip():
            return f"{scheme} {MASK}{MASKED}"
    if "signature" in name:
        return " ".join(_masked_signature(entry) for entry in value.split()) + MASKED
    return MASK + MASKED


def _masked_signature(entry: str) -> str:
    version = _SIGNATURE_VERSION.match(entry)
    return (version.group() if version else "") + MASK
