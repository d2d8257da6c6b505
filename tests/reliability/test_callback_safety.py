"""The outbound-address guard (consumers.safety): which callbacks may be called, and how.

Names are "resolved" by a fake getaddrinfo (there is no DNS here), and nothing is sent: deliveries
through the guard are tests/reliability/test_ssrf_matrix.py's and tests/dispatch/test_senders.py's.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from urllib.parse import urlencode

import pytest

from consumers import safety
from consumers.safety import (
    UnsafeCallback,
    check_callback_url,
    check_delivery_url,
    is_public_address,
)
from tests.conftest import FORM
from tests.helpers import make_channel

REAL_GETADDRINFO = socket.getaddrinfo


@pytest.fixture
def guarded(settings):
    """The production setting: private callbacks refused."""
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False
    return settings


class FakeDNS:
    """Answers from `records`; passes localhost and numeric hosts to the real getaddrinfo."""

    def __init__(self) -> None:
        self.records: dict[str, list[str]] = {}
        self.lookups: list[str] = []

    def __setitem__(self, name: str, addresses: list[str]) -> None:
        self.records[name] = addresses

    def getaddrinfo(self, host, port, family=0, type=0, proto=0, flags=0):
        name = host.decode() if isinstance(host, bytes) else str(host)
        self.lookups.append(name)
        if name not in self.records:
            if name == "localhost" or re.fullmatch(r"[0-9a-fx.:]+", name, re.IGNORECASE):
                return REAL_GETADDRINFO(host, port, family, type, proto, flags)
            raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")
        infos: list[tuple[object, ...]] = []
        for address in self.records[name]:
            if ":" in address:
                infos.append((socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0)))
            else:
                infos.append((socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port)))
        return infos


@pytest.fixture
def dns(monkeypatch):
    """A fake DNS: `dns["name"] = [addresses]`; `dns.lookups` lists the names looked up."""
    fake = FakeDNS()
    monkeypatch.setattr(socket, "getaddrinfo", fake.getaddrinfo)
    return fake


# --- the address policy -----------------------------------------------------------------------

NON_PUBLIC_ADDRESSES = [
    # IPv4
    "0.0.0.0",  # noqa: S104 - unspecified
    "0.1.2.3",  # "this network"
    "10.0.0.1",  # RFC 1918
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "127.0.0.1",  # loopback
    "127.255.255.254",
    "169.254.0.1",  # link-local
    "169.254.169.254",  # cloud metadata
    "169.254.170.2",  # ECS task metadata
    "100.64.0.1",  # carrier-grade NAT
    "100.100.100.200",  # Alibaba metadata, inside CGNAT
    "100.127.255.254",
    "192.0.0.8",  # IETF protocol assignments
    "192.0.2.10",  # documentation
    "198.51.100.7",
    "203.0.113.9",
    "198.18.0.1",  # benchmarking
    "198.19.255.254",
    "192.88.99.1",  # 6to4 relay anycast
    "224.0.0.1",  # multicast
    "239.255.255.250",
    "240.0.0.1",  # reserved
    "255.255.255.255",  # broadcast
    # IPv6
    "::",  # unspecified
    "::1",  # loopback
    "fe80::1",  # link-local
    "fe80::1%eth0",  # with a zone ID
    "fc00::1",  # unique local
    "fd12:3456:789a::1",
    "fd00:ec2::254",  # AWS metadata
    "fec0::1",  # site-local (deprecated)
    "ff02::1",  # multicast
    "ff0e::1",
    "100::1",  # discard-only
    "2001:db8::1",  # documentation
    "3fff::1",
    "2001:2::1",  # benchmarking (IETF protocol assignments)
    "64:ff9b:1::a00:1",  # local-use NAT64
    "5f00::1",  # SRv6 SIDs, outside global unicast
    "4000::1",  # unallocated, outside global unicast
    # IPv6 forms that embed a non-public IPv4 address
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::127.0.0.1",  # IPv4-compatible (deprecated)
    "::10.1.2.3",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "2002:c0a8:0101::1",  # 6to4 of 192.168.1.1
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2001:0:5db8:d822:0:ffff:f5ff:fffe",  # Teredo, client 10.0.0.1
    "2001:0:0a00:0001:0:ffff:a247:27dd",  # Teredo, server 10.0.0.1
]

PUBLIC_ADDRESSES = [
    "93.184.216.34",
    "8.8.8.8",
    "1.1.1.1",
    "100.63.255.255",  # just below CGNAT
    "100.128.0.0",  # just above
    "172.15.255.255",  # just outside 172.16/12
    "172.32.0.0",
    "198.17.255.255",  # just outside benchmarking
    "198.20.0.0",
    "223.255.255.255",  # just below multicast
    "2606:2800:220:1::1",
    "2a00:1450:4001:80b::200e",
    "2600::",
    "::ffff:93.184.216.34",  # IPv4-mapped public
    "64:ff9b::5db8:d822",  # NAT64 of 93.184.216.34
    "2002:5db8:d822::1",  # 6to4 of 93.184.216.34
    "2001:0:5db8:d822:0:ffff:a247:27dd",  # Teredo, server and client public
]


@pytest.mark.parametrize("address", NON_PUBLIC_ADDRESSES)
def test_non_public_addresses(address):
    assert not is_public_address(ipaddress.ip_address(address))


@pytest.mark.parametrize("address", PUBLIC_ADDRESSES)
def test_public_addresses(address):
    assert is_public_address(ipaddress.ip_address(address))


def test_metadata_addresses_are_named_and_refused():
    assert ipaddress.ip_address("169.254.169.254") in safety.METADATA_ADDRESSES
    assert ipaddress.ip_address("fd00:ec2::254") in safety.METADATA_ADDRESSES
    assert not any(is_public_address(address) for address in safety.METADATA_ADDRESSES)


# --- callback URLs at creation ----------------------------------------------------------------

REFUSED_URLS = [
    "http://127.0.0.1/",
    "http://127.0.0.1:8080/hook",
    "https://10.0.0.5/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://100.100.100.200/",
    "http://0.0.0.0:8000/",
    "http://0/",  # 0.0.0.0
    "http://2130706433/",  # decimal 127.0.0.1
    "http://2852039166/",  # decimal 169.254.169.254
    "http://0177.0.0.1/",  # octal
    "http://0x7f.1/",  # hex, short
    "http://0x7f000001/",  # hex
    "http://0xA9.0xFE.0xA9.0xFE/",  # hex 169.254.169.254
    "http://012.0.0.1/",  # octal 10.0.0.1
    "http://127.1/",  # short
    "http://10.1/",
    "http://192.168.257/",  # short: 192.168.1.1
    "http://127.0.0.1./",  # trailing dot
    "http://[::1]/",
    "http://[::1]:8443/hook",
    "http://[::]/",
    "http://[::ffff:127.0.0.1]/",
    "http://[::ffff:7f00:1]/",
    "http://[::ffff:a9fe:a9fe]/",  # mapped metadata
    "http://[fe80::1%25eth0]:8080/",  # zone ID
    "http://[fd00:ec2::254]/latest/meta-data/",
    "http://[64:ff9b::a00:1]/",  # NAT64 of 10.0.0.1
    "http://[2002:c0a8:101::1]/",  # 6to4 of 192.168.1.1
    "http://example.com@127.0.0.1/",  # userinfo: the host is 127.0.0.1
    "http://user:pass@10.0.0.1:80/",
    "http://①②⑦.0.0.1/",  # full-width digits normalise to 127.0.0.1
    "http://localhost/",
    "http://localhost:8000/hook",
    "http://LOCALHOST/",
    "http://localhost./",  # trailing dot
    "http://localhost../",
    "http://api.localhost/",
    "http://printer.local/",
    "http://metadata.google.internal/computeMetadata/v1/",
    "http://localhost.localdomain/",
    "http://router.home.arpa/",
]


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_refused_without_resolving(guarded, dns, url):
    with pytest.raises(UnsafeCallback):
        check_callback_url(url)
    assert dns.lookups == []


def test_parser_confusion_uses_yarls_host(guarded, dns):
    """The host is read the way yarl reads it, whatever else the string contains."""
    check_callback_url("http://1.1.1.1 &@2.2.2.2# @192.168.0.1/")  # yarl: host 2.2.2.2
    with pytest.raises(UnsafeCallback, match=r"10\.2\.2\.2"):
        check_callback_url("http://1.1.1.1 &@10.2.2.2# @8.8.8.8/")
    check_callback_url("http://127.0.0.1:80@hooks.example.com/")  # host: hooks.example.com
    assert dns.lookups == ["hooks.example.com"]


ALLOWED_LITERAL_URLS = [
    "http://93.184.216.34/",
    "https://93.184.216.34:8443/hook?x=1",
    "http://1572395042/",  # decimal 93.184.216.34
    "http://0x5db8d822/",  # hex
    "http://[2606:2800:220:1::1]/",
    "http://[2606:2800:220:1::1]:8443/hook",
    "http://[::ffff:93.184.216.34]/",
    "http://user@8.8.8.8/",
]


@pytest.mark.parametrize("url", ALLOWED_LITERAL_URLS)
def test_public_literals_allowed_without_resolving(guarded, dns, url):
    check_callback_url(url)
    assert dns.lookups == []


def test_a_name_is_resolved_and_allowed_when_all_addresses_are_public(guarded, dns):
    dns["hooks.example.com"] = ["93.184.216.34", "2606:2800:220:1::1"]
    check_callback_url("https://hooks.example.com/webhook")
    assert dns.lookups == ["hooks.example.com"]


@pytest.mark.parametrize(
    "addresses",
    [
        ["10.0.0.5"],
        ["127.0.0.1"],
        ["169.254.169.254"],
        ["93.184.216.34", "127.0.0.1"],  # any non-public address refuses the name
        ["2606:2800:220:1::1", "fe80::1%eth0"],
        ["::ffff:192.168.0.1"],
        ["fd00:ec2::254"],
    ],
)
def test_a_name_resolving_to_any_non_public_address_is_refused(guarded, dns, addresses):
    dns["hooks.example.com"] = addresses
    with pytest.raises(UnsafeCallback, match=r"'hooks\.example\.com'"):
        check_callback_url("https://hooks.example.com/webhook")


def test_a_name_that_does_not_resolve_is_allowed_at_creation(guarded, dns):
    check_callback_url("https://not-yet.example.com/webhook")  # checked again at delivery
    assert dns.lookups == ["not-yet.example.com"]


def test_idn_names_are_resolved_in_their_ascii_form(guarded, dns):
    dns["xn--bcher-kva.example"] = ["10.0.0.1"]
    with pytest.raises(UnsafeCallback):
        check_callback_url("https://bücher.example/hook")


def test_localhost_is_refused_for_real_too(guarded):
    with pytest.raises(UnsafeCallback):
        check_callback_url("http://localhost:8000/")


def test_the_message_names_the_host_and_never_the_url(guarded, dns):
    dns["hooks.example.com"] = ["10.0.0.5"]
    url = "https://alice:s3cret-pass@hooks.example.com/cb?token=tok_live_123"
    with pytest.raises(UnsafeCallback) as caught:
        check_callback_url(url)
    message = str(caught.value)
    assert "hooks.example.com" in message
    assert "10.0.0.5" in message
    assert "s3cret" not in message
    assert "tok_live_123" not in message
    assert "alice" not in message
    assert caught.value.host == "hooks.example.com"


@pytest.mark.parametrize("url", ["not a url", "http://", "http://[::1/", "mailto:a@b"])
def test_urls_without_a_usable_host_are_refused(guarded, url):
    with pytest.raises(UnsafeCallback):
        check_callback_url(url)


def test_unsafe_callback_is_a_value_error():
    assert issubclass(UnsafeCallback, ValueError)


@pytest.mark.parametrize("url", [*REFUSED_URLS, "https://hooks.example.com/"])
def test_everything_is_allowed_when_private_callbacks_are(settings, dns, url):
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = True
    dns["hooks.example.com"] = ["10.0.0.5"]
    check_callback_url(url)
    check_delivery_url(url)
    assert dns.lookups == []


def test_the_test_settings_allow_private_callbacks():
    check_callback_url("http://127.0.0.1:8000/")  # receivers in the other tests run on loopback


# --- delivery ---------------------------------------------------------------------------------


@pytest.mark.parametrize("url", REFUSED_URLS)
def test_delivery_refuses_literals_and_local_names(guarded, dns, url):
    with pytest.raises(UnsafeCallback):
        check_delivery_url(url)
    assert dns.lookups == []


def test_delivery_url_check_leaves_names_to_the_connect_time_guard(guarded, dns):
    dns["hooks.example.com"] = ["10.0.0.5"]
    check_delivery_url("https://hooks.example.com/webhook")
    check_delivery_url("http://93.184.216.34/")
    assert dns.lookups == []


# --- the callback URL's form, through the consumer API (issue 14 §6) ----------------------------

CONSUMER_URL = "/channel/orders/consumer/billing"


def put_consumer(admin_client, callback_url: str):
    make_channel()
    return admin_client.put(
        CONSUMER_URL, urlencode({"callbackUrl": callback_url}), content_type=FORM
    )


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    ["http://receiver:8080/hook", "http://receiver/", "https://my_service.internal-net:443/h"],
)
def test_single_label_and_service_names_are_callbacks(admin_client, url):
    """What docker-compose and Kubernetes give (BROKER_ALLOW_PRIVATE_CALLBACKS is true here)."""
    response = put_consumer(admin_client, url)

    assert response.status_code == 200, response.content
    assert response.json()["CallbackURL"] == url


@pytest.mark.django_db
def test_a_single_label_name_still_meets_the_address_guard(admin_client, guarded, dns):
    dns["receiver"] = ["172.18.0.5"]

    response = put_consumer(admin_client, "http://receiver:8080/hook")

    assert response.status_code == 400
    error = response.json()["Error"]
    assert "172.18.0.5" in error
    assert "BROKER_ALLOW_PRIVATE_CALLBACKS" in error


@pytest.mark.django_db
def test_a_loopback_refusal_names_the_setting_that_allows_it(admin_client, guarded):
    response = put_consumer(admin_client, "http://127.0.0.1:8000/hook")

    assert response.status_code == 400
    assert "BROKER_ALLOW_PRIVATE_CALLBACKS=true" in response.json()["Error"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "http://example.com:65536/",
        "http://example.com:99999/",
        "http://example.com:0/",
        "http://example.com:+80/",  # int() takes a sign, a URL does not
        "http://example.com:\u0668\u0660/",  # Arabic-Indic digits: int() reads 80
        "http://[2001:db8::1]:70000/",
    ],
)
def test_a_port_outside_1_to_65535_is_refused(admin_client, url):
    response = put_consumer(admin_client, url)

    assert response.status_code == 400
    assert "port from 1 to 65535" in response.json()["Error"]


@pytest.mark.django_db
@pytest.mark.parametrize(
    "url",
    [
        "ftp://example.com/",
        "http://exa mple.com/",
        "http://-bad-/",
        "http://a..b/",
        "/hook",
        "http://[v1.x]/",  # an IPvFuture literal, which yarl reads as the name "v1.x"
        "http://[fe80::1%eth0]/",  # a zone ID must be written %25eth0 in a URL
        "http://[::1/",
    ],
)
def test_a_malformed_callback_url_is_refused(admin_client, url):
    response = put_consumer(admin_client, url)

    assert response.status_code == 400
    assert "callbackUrl" in response.content.decode()
