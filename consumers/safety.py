"""The outbound-address guard: callbacks may only reach public addresses (docs/reliability.md).

Unless `BROKER_ALLOW_PRIVATE_CALLBACKS` is true, a callback URL whose host is, or resolves to,
anything but a public unicast address is refused: private, loopback, link-local (and so the
cloud metadata endpoints), carrier-grade NAT, multicast, reserved, unspecified, benchmarking and
documentation ranges, and IPv6 forms that embed such an IPv4 address (mapped, compatible, NAT64,
6to4, Teredo). `is_public_address` holds the whole policy.

Two moments are guarded:

* **Creation** (`check_callback_url`): the host is parsed with yarl, IP literals are judged by
  the address they mean in any form libc accepts (`2130706433`, `0177.0.0.1`, `0x7f.1`, `127.1`,
  `[::ffff:127.0.0.1]`, zone IDs), `localhost` and the local-only suffixes are refused without
  resolving, and other names are resolved once and refused if *any* address is not public. A
  name that does not resolve is **allowed**: its DNS records may not exist yet, and every
  delivery checks again, so nothing is sent anywhere unchecked.
* **Delivery** (jobs/curl_delivery.py): `check_delivery_url` refuses local names and non-public
  IP literals before each request (no DNS involved); then every address libcurl is about to
  connect to, whatever resolved it, is judged by `is_public_address` before it connects
  (CURLOPT_OPENSOCKETFUNCTION), so the check and the connection use the same address and a
  rebinding name cannot slip a private address in between. Redirects must not be followed
  (docs/dispatcher.md), and no proxy may be used: a proxy resolves names itself, out of the
  guard's sight.

Refusals raise `UnsafeCallback`; a delivery refused is an attempt failed with the error class
`unsafe-callback`, retried like any other (DNS may change). Messages name the host, never the
URL: its userinfo or query may carry a token.
"""

from __future__ import annotations

import ipaddress
import re
import socket

from yarl import URL

from broker.conf import broker_settings

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# Named although the ranges below cover them, so that no edit of those ranges can let one through.
METADATA_ADDRESSES = frozenset(
    ipaddress.ip_address(address)
    for address in (
        "169.254.169.254",  # AWS, GCP, Azure, OpenStack, Oracle
        "169.254.170.2",  # AWS ECS task credentials
        "100.100.100.200",  # Alibaba Cloud
        "fd00:ec2::254",  # AWS over IPv6
    )
)

NON_PUBLIC_IPV4 = tuple(
    ipaddress.IPv4Network(network)
    for network in (
        "0.0.0.0/8",  # "this network", with the unspecified 0.0.0.0
        "10.0.0.0/8",  # private (RFC 1918)
        "100.64.0.0/10",  # carrier-grade NAT (RFC 6598)
        "127.0.0.0/8",  # loopback
        "169.254.0.0/16",  # link-local, where the cloud metadata endpoints live
        "172.16.0.0/12",  # private
        "192.0.0.0/24",  # IETF protocol assignments
        "192.0.2.0/24",  # documentation (TEST-NET-1)
        "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
        "192.168.0.0/16",  # private
        "198.18.0.0/15",  # benchmarking
        "198.51.100.0/24",  # documentation (TEST-NET-2)
        "203.0.113.0/24",  # documentation (TEST-NET-3)
        "224.0.0.0/4",  # multicast
        "240.0.0.0/4",  # reserved, with the broadcast 255.255.255.255
    )
)

# Public IPv6 unicast is allocated from 2000::/3 only; the forms that embed an IPv4 address are
# judged by that address before this applies. Outside it: unspecified, loopback, ULA fc00::/7
# (fd00:ec2::254), link-local fe80::/10, site-local fec0::/10, multicast ff00::/8, discard 100::/64,
# local-use NAT64 64:ff9b:1::/48.
GLOBAL_UNICAST_IPV6 = ipaddress.IPv6Network("2000::/3")
NON_PUBLIC_IPV6 = tuple(
    ipaddress.IPv6Network(network)
    for network in (
        "2001::/23",  # IETF protocol assignments (its Teredo 2001::/32 is judged by what it embeds)
        "2001:db8::/32",  # documentation
        "3fff::/20",  # documentation (RFC 9637)
    )
)
NAT64_IPV6 = ipaddress.IPv6Network("64:ff9b::/96")
TEREDO_IPV6 = ipaddress.IPv6Network("2001::/32")

# Names that only ever mean this machine or its local network, refused without resolving.
LOCAL_NAME_SUFFIXES = (".localhost", ".local", ".internal", ".localdomain", ".home.arpa")

# Hosts that may be a numeric IPv4 address in one of the legacy forms (decimal, octal, hex, short).
_NUMERIC_HOST = re.compile(r"[0-9a-fx.]+", re.IGNORECASE)


# Said with every refusal of an address, so that whoever meets one knows the way out.
ALLOW_PRIVATE_HINT = (
    "set BROKER_ALLOW_PRIVATE_CALLBACKS=true to allow private and loopback addresses "
    "(trusted networks only)"
)


class UnsafeCallback(ValueError):
    """A callback URL whose host is, or resolves to, an address the broker must not call."""

    def __init__(self, host: str | None, reason: str) -> None:
        self.host = host
        self.reason = reason
        self.message = (
            f"refusing callback host {host!r}: {reason}; {ALLOW_PRIVATE_HINT}" if host else reason
        )
        super().__init__(self.message)

    def __str__(self) -> str:
        return self.message


def is_public_address(ip: IPAddress) -> bool:
    """Whether a callback may connect to `ip`: a public unicast address, or one embedding it."""
    if isinstance(ip, ipaddress.IPv4Address):
        return ip not in METADATA_ADDRESSES and not any(ip in net for net in NON_PUBLIC_IPV4)
    ip = ipaddress.IPv6Address(int(ip))  # without a zone ID, which says nothing about reach
    embedded = _embedded_ipv4(ip)
    if embedded:
        return all(is_public_address(address) for address in embedded)
    return (
        ip not in METADATA_ADDRESSES
        and ip in GLOBAL_UNICAST_IPV6
        and not any(ip in net for net in NON_PUBLIC_IPV6)
    )


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    """The IPv4 addresses that traffic to `ip` ends up at, for the forms that embed them."""
    if ip.ipv4_mapped is not None:  # ::ffff:a.b.c.d
        return [ip.ipv4_mapped]
    if int(ip) >> 32 == 0:  # ::a.b.c.d (deprecated "compatible"), with :: and ::1
        return [ipaddress.IPv4Address(int(ip))]
    if ip in NAT64_IPV6:
        return [ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)]
    if ip.sixtofour is not None:  # 2002::/16
        return [ip.sixtofour]
    if ip in TEREDO_IPV6 and ip.teredo is not None:
        server, client = ip.teredo
        return [server, client]
    return []


def check_callback_url(url: str) -> None:
    """Refuse a callback URL that reaches a non-public address (see the module docstring).

    Raises UnsafeCallback. Resolves the host (blocking) unless it is an IP literal or a local name.
    """
    if broker_settings.BROKER_ALLOW_PRIVATE_CALLBACKS:
        return
    host = _checked_host(url)
    if _ip_literal(host) is not None:
        return
    try:
        addresses = _lookup(host)
    except (OSError, UnicodeError):
        return  # not resolvable (yet): every delivery resolves and checks again
    for address in addresses:
        if not is_public_address(_parse_address(address)):
            raise UnsafeCallback(host, f"it resolves to the non-public address {address}")


def check_delivery_url(url: str) -> None:
    """Refuse, before a delivery, a URL whose host is a non-public IP literal or a local name.

    Raises UnsafeCallback. No DNS: libcurl's connect-time guard judges the addresses it resolves
    (jobs/curl_delivery.py); this refuses local names before any lookup.
    """
    if not broker_settings.BROKER_ALLOW_PRIVATE_CALLBACKS:
        _checked_host(url)


def _checked_host(url: str) -> str:
    """The host of `url` (as yarl reads it), refused if a local name or non-public literal."""
    try:
        host = URL(url).raw_host
    except (ValueError, TypeError):
        raise UnsafeCallback(None, "the callback URL cannot be parsed") from None
    if not host or not host.strip("."):
        raise UnsafeCallback(None, "the callback URL has no host")
    _refuse_local_name(host)
    literal = _ip_literal(host)
    if literal is not None and not is_public_address(literal):
        raise UnsafeCallback(host, f"it is the non-public address {literal}")
    return host


def _refuse_local_name(host: str) -> None:
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(LOCAL_NAME_SUFFIXES):
        raise UnsafeCallback(host, "it names this machine or its local network")


def _ip_literal(host: str) -> IPAddress | None:
    """The address an IP-literal host means, in any form libc accepts; None for a name.

    `ipaddress` knows only canonical dotted quads; `inet_aton` (like getaddrinfo and browsers)
    also reads `2130706433`, `0177.0.0.1`, `0x7f.1` and `127.1` as 127.0.0.1.
    """
    host = host.strip("[]")
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.partition("%")[0])  # zone ID: judge the address
        except ValueError:
            return None
    name = host.removesuffix(".")  # browsers read "127.0.0.1." as an address, too
    if not _NUMERIC_HOST.fullmatch(name):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except OSError:
        return None


def _parse_address(address: str) -> IPAddress:
    return ipaddress.ip_address(address.partition("%")[0])


def _lookup(host: str) -> list[str]:
    infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    return [str(info[4][0]) for info in infos]
