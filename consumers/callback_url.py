"""The form of a callback URL: an absolute http(s) URL with a host and a port (as yarl reads it,
like the address guard); and how one is shown.

Checked when a consumer is created, edited or seeded. Where the host may lead is the address
guard's business (consumers/safety.py), not this module's: single-label names such as
`http://receiver:8080/hook` (what docker-compose and Kubernetes give) are well-formed here.

A callback URL may carry secrets: credentials in its userinfo (sent as Basic authentication) and
tokens in its query. Wherever one is shown to a person or written to a log (the admin, the
operator UI, the seed command's errors) it goes through `masked_callback_url`; the REST API,
whose callers hold the admin token that sets it, gives it whole (docs/api.md).
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlsplit, urlunsplit

from django.core.exceptions import ValidationError
from yarl import URL

# A host name label: letters, digits, hyphens and underscores (service names in docker-compose
# and Kubernetes have them), not starting or ending with a hyphen.
_HOST_LABEL = re.compile(r"[A-Za-z0-9_]([A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_SPACE_OR_CONTROL = re.compile(r"[\x00-\x20\x7f]")
_PORT = re.compile(r"[0-9]{1,5}")  # as written: no sign, no digits of other scripts
MASK = "***"
BAD_FORM = "must be an absolute http(s) URL."
BAD_PORT = "must be an absolute http(s) URL with a port from 1 to 65535."


def validate_callback_url(value: str) -> None:
    """ValidationError, with a message fit to show next to the field, unless `value` is a
    well-formed callback URL."""
    if _SPACE_OR_CONTROL.search(value):
        raise ValidationError(f"{BAD_FORM.removesuffix('.')} without spaces or control characters.")
    try:
        host, port = _host_and_port(urlsplit(value).netloc)  # as written
    except ValueError:
        raise ValidationError(BAD_FORM) from None
    if port is not None and not (_PORT.fullmatch(port) and 1 <= int(port) <= 65535):
        raise ValidationError(BAD_PORT)
    try:
        url = URL(value)  # as the address guard reads it (consumers/safety.py)
    except ValueError:
        raise ValidationError(BAD_FORM) from None
    if url.scheme not in ("http", "https") or not url.raw_host or not host:
        raise ValidationError(BAD_FORM)
    if host.startswith("[") and not _ipv6_literal(host[1:-1]):
        raise ValidationError(f"has an invalid IPv6 address {host[:100]!r}.")
    if not host.startswith("[") and not _name_or_ipv4(url.raw_host):
        raise ValidationError(f"has an invalid host name {url.raw_host[:100]!r}.")


def masked_callback_url(url: str) -> str:
    """`url` with what may be a secret replaced by MASK: the password of its userinfo (a user
    alone, which may be a token, too), every query parameter's value (a parameter without `=` as
    a whole) and the fragment. Scheme, host, port and path stay, so the operator can tell where
    deliveries go. `https://user:***@host/hook?token=***`."""
    try:
        parts = urlsplit(url)
    except ValueError:  # not even split into parts: nothing of it can be told safe
        return MASK
    userinfo, at, host_port = parts.netloc.rpartition("@")  # a password may hold "@"
    netloc = parts.netloc
    if at:
        user, colon, _ = userinfo.partition(":")
        netloc = f"{user}:{MASK}@{host_port}" if colon else f"{MASK}@{host_port}"
    query = "&".join(_masked_parameter(parameter) for parameter in parts.query.split("&"))
    fragment = MASK if parts.fragment else ""
    return urlunsplit((parts.scheme, netloc, parts.path, query if parts.query else "", fragment))


def _masked_parameter(parameter: str) -> str:
    name, equals, value = parameter.partition("=")
    if not equals:
        return MASK if parameter else parameter
    return f"{name}={MASK}" if value else parameter


def _host_and_port(netloc: str) -> tuple[str, str | None]:
    """The host (an IPv6 literal with its brackets) and the port, as written; ValueError when
    a bracket is left open or followed by anything but a port."""
    host_port = netloc.rpartition("@")[2]
    if host_port.startswith("["):
        inside, closed, rest = host_port.partition("]")
        if not closed or (rest and not rest.startswith(":")):
            raise ValueError(netloc)
        return inside + closed, rest[1:] or None
    host, _, port = host_port.partition(":")
    return host, port or None  # "host:" is the default port, as "host" is


def _ipv6_literal(text: str) -> bool:
    """An IPv6 address, with a zone ID written as RFC 6874 asks ("%25" and the zone) or none."""
    address, percent, zone = text.partition("%")
    if percent and not (zone.startswith("25") and len(zone) > 2):
        return False
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


def _name_or_ipv4(host: str) -> bool:
    """A DNS name (an IDN already in ASCII) or an IPv4 address, which is made of labels too."""
    labels = host.removesuffix(".").split(".")
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)
