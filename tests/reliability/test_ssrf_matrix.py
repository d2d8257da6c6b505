"""The SSRF matrix end to end (issue 9): every way in, and what actually leaves the dispatcher.

tests/reliability/test_callback_safety.py proves the address policy function by function. Here the
same hostile targets go through the doors a user has: the consumer API (create and update), the seed
loader, and finally the dispatcher's sender (libcurl's multi handle with its connect-time guard,
jobs/curl_delivery.py) against a real receiver on 127.0.0.1 — which stands for every internal
service an attacker would like to reach. Names "resolve" through a fake getaddrinfo (libcurl has
its own resolver: for it the same answers are pinned with CURLOPT_RESOLVE); the receiver counts
what arrives, so a guard that let anything through fails the test.
"""

from __future__ import annotations

import asyncio
import io
from urllib.parse import quote, urlsplit

import pytest
from django.core.management import CommandError, call_command

from broker import publish
from consumers.models import Consumer
from jobs.curl_delivery import curl_post
from jobs.delivery import AttemptResult, DeliveryRequest, deliver, open_sender
from jobs.dispatch import Dispatcher, DispatcherConfig
from jobs.models import DeliveryAttempt, Job
from jobs.states import DELIVERED, QUEUED
from tests.conftest import ADMIN_TOKEN, FORM
from tests.db_snapshot import snapshot
from tests.helpers import make_consumer
from tests.receiver import Reply
from tests.reliability.test_callback_safety import FakeDNS

pytestmark = pytest.mark.django_db

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture
def dns(monkeypatch):
    fake = FakeDNS()
    monkeypatch.setattr("socket.getaddrinfo", fake.getaddrinfo)
    return fake


@pytest.fixture
def guarded(settings):
    """Production settings: private callbacks refused (the test settings allow them)."""
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False
    settings.BROKER_ADMIN_TOKENS = [ADMIN_TOKEN]
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 0
    return settings


# Each target with the reason it must be refused. `{name}` targets resolve through `dns`.
MATRIX = [
    # IPv4 private, loopback, link-local, metadata, odd ranges
    ("http://10.0.0.1/hook", "private 10/8"),
    ("http://172.16.5.4/hook", "private 172.16/12"),
    ("http://192.168.0.10:8080/hook", "private 192.168/16"),
    ("http://127.0.0.1:5432/", "loopback (the database)"),
    ("http://127.42.0.1/", "loopback, not .1"),
    ("http://169.254.169.254/latest/meta-data/iam/", "AWS/GCP/Azure metadata"),
    ("http://169.254.170.2/v2/credentials", "ECS task credentials"),
    ("http://100.100.100.200/latest/meta-data/", "Alibaba metadata"),
    ("http://100.64.0.1/", "carrier-grade NAT"),
    ("http://0.0.0.0:8000/", "unspecified"),
    ("http://255.255.255.255/", "broadcast"),
    ("http://224.0.0.251/", "multicast"),
    # The same addresses in the forms libc accepts
    ("http://2130706433/", "decimal 127.0.0.1"),
    ("http://2852039166/", "decimal 169.254.169.254"),
    ("http://0177.0.0.1/", "octal 127.0.0.1"),
    ("http://0251.0376.0251.0376/", "octal 169.254.169.254"),
    ("http://0x7f000001/", "hex 127.0.0.1"),
    ("http://0xa9.0xfe.0xa9.0xfe/", "dotted hex metadata"),
    ("http://127.1/", "short form"),
    ("http://10.1/", "short form 10.0.0.1"),
    ("http://0/", "0 = 0.0.0.0"),
    ("http://127.0.0.1./", "trailing dot"),
    ("http://%31%32%37.0.0.1/", "percent-encoded digits"),
    # IPv6
    ("http://[::1]:8000/", "IPv6 loopback"),
    ("http://[::]/", "IPv6 unspecified"),
    ("http://[fe80::1%25eth0]/", "link-local with zone"),
    ("http://[fd00:ec2::254]/latest/meta-data/", "AWS metadata over IPv6"),
    ("http://[fc00::5]/", "unique local"),
    ("http://[::ffff:127.0.0.1]/", "IPv4-mapped loopback"),
    ("http://[::ffff:a9fe:a9fe]/", "IPv4-mapped metadata, hex"),
    ("http://[::127.0.0.1]/", "IPv4-compatible loopback"),
    ("http://[64:ff9b::a9fe:a9fe]/", "NAT64 of the metadata address"),
    ("http://[2002:7f00:1::]/", "6to4 of 127.0.0.1"),
    ("http://[2001:0:5db8:d822:0:ffff:f5ff:fffe]/", "Teredo to 10.0.0.1"),
    # Names
    ("http://localhost:8000/", "localhost"),
    ("http://LocalHost./", "localhost, case and dot"),
    ("http://db.localhost/", "*.localhost"),
    ("http://metadata.google.internal/computeMetadata/v1/", "GCP metadata name"),
    ("http://nas.local/", "mDNS"),
    ("http://router.home.arpa/", "home network"),
    ("http://{name}/", "a name resolving to 10.0.0.7"),
    ("http://{name}:8080/", "a name resolving to 10.0.0.7, with a port"),
    ("https://{name}/", "https to the same name"),
    # Parser confusion: the host is what an HTTP client would connect to
    ("http://hooks.example.com@127.0.0.1/", "userinfo before a loopback host"),
    ("http://user:pass@169.254.169.254/", "credentials to metadata"),
    ("http://①②⑦.0.0.1/", "full-width digits"),
]
PRIVATE_NAME = "internal.example.com"


def _url(template: str) -> str:
    return template.replace("{name}", PRIVATE_NAME)


def put_consumer(client, consumer_id: str, url: str, **headers: str):
    return client.put(
        f"/channel/orders/consumer/{consumer_id}",
        f"callbackUrl={quote(url, safe='')}",
        content_type=FORM,
        headers={**ADMIN, **headers},
    )


@pytest.mark.parametrize(("target", "why"), MATRIX, ids=[why for _, why in MATRIX])
def test_the_api_refuses_every_target_and_stores_nothing(
    client, guarded, dns, channel, target, why
):
    dns[PRIVATE_NAME] = ["10.0.0.7"]
    before = snapshot()

    response = put_consumer(client, "sneaky", _url(target))

    assert response.status_code == 400, (why, response.content)
    assert set(response.json()) == {"Error"}
    assert "pass" not in response.json()["Error"]  # never the URL's credentials
    assert snapshot() == before


def test_a_name_with_any_private_address_is_refused(client, guarded, dns, channel):
    dns["mixed.example.com"] = ["93.184.216.34", "2606:2800:220:1::1", "::ffff:10.0.0.1"]
    assert put_consumer(client, "mixed", "https://mixed.example.com/").status_code == 400
    dns["public.example.com"] = ["93.184.216.34", "2606:2800:220:1::1"]
    assert put_consumer(client, "public", "https://public.example.com/").status_code == 200


def test_an_update_to_a_private_target_is_refused_and_keeps_the_old_url(
    client, guarded, dns, channel
):
    from broker.api.conditional import last_modified

    dns["public.example.com"] = ["93.184.216.34"]
    assert put_consumer(client, "billing", "https://public.example.com/").status_code == 200
    consumer = Consumer.objects.get(public_id="billing")
    before = snapshot()

    response = put_consumer(
        client,
        "billing",
        "http://169.254.169.254/latest/meta-data/",
        **{"If-Unmodified-Since": last_modified(consumer.changed_at)},
    )

    assert response.status_code == 400
    assert snapshot() == before


def test_the_seed_loader_refuses_a_private_callback_and_loads_nothing(guarded, dns, tmp_path):
    seed = tmp_path / "seed.cfg"
    seed.write_text(
        "[initial-channels]\norders=Orders\n"
        "[initial-consumers]\nbad=http://0251.0376.0251.0376/latest/\n"
        "[bad]\nchannel=orders\n"
    )
    before = snapshot()
    with pytest.raises(CommandError, match="bad"):
        call_command("load_seed", str(seed), stdout=io.StringIO())
    assert snapshot() == before


# --- delivery: what leaves the dispatcher -------------------------------------------------------


def dispatch_step(dns: FakeDNS | None = None) -> list[AttemptResult]:
    """Claim, deliver as `Dispatcher.run` does, record. libcurl resolves names itself: `dns`'s
    answers are pinned for it."""
    dispatcher = Dispatcher(DispatcherConfig(dispatcher_id="ssrf-test"))
    requests = dispatcher.claim(50)

    async def send_all() -> list[AttemptResult]:
        if dns is not None:
            async with curl_post(50, pinned=pins(dns, requests)) as post:
                return list(await asyncio.gather(*(deliver(post, r, 2.0) for r in requests)))
        async with open_sender(50) as send:
            return list(await asyncio.gather(*(send(r, 2.0, None) for r in requests)))

    results = asyncio.run(send_all())
    dispatcher.complete(results)
    return results


def pins(dns: FakeDNS, requests: list[DeliveryRequest]) -> list[str]:
    """libcurl's "host:port:addresses" lines for the fake DNS's names the requests go to."""
    lines = []
    for request in requests:
        url = urlsplit(request.url)
        if url.hostname in dns.records:
            found = dns.records[url.hostname]
            addresses = ",".join(f"[{ip}]" if ":" in ip else ip for ip in found)
            lines.append(f"{url.hostname}:{url.port or 80}:{addresses}")
    return lines


def consumer_at(channel, consumer_id: str, url: str) -> Consumer:
    """A consumer whose URL is stored as is (the admin or an older policy may have saved it)."""
    consumer = make_consumer(channel, consumer_id)
    consumer.callback_url = url
    consumer.save()
    return consumer


def test_a_name_rebound_to_loopback_after_creation_gets_nothing(
    client, guarded, dns, channel, receiver
):
    """DNS rebinding: public when checked at creation, the receiver's address at delivery."""
    dns["rebind.example.com"] = ["93.184.216.34"]
    url = f"http://rebind.example.com:{receiver.port}/hook"
    assert put_consumer(client, "billing", url).status_code == 200
    dns["rebind.example.com"] = ["127.0.0.1"]
    publish(channel, b"secret", producer="shop")

    [result] = dispatch_step(dns)

    assert receiver.received == []
    assert result.error_class == "unsafe-callback"
    assert "rebind.example.com" in result.error
    job = Job.objects.get()
    assert (job.status, job.attempts) == (QUEUED, 1)  # retried later: DNS may change back
    assert DeliveryAttempt.objects.get().error_class == "unsafe-callback"


def test_the_same_delivery_arrives_when_private_callbacks_are_allowed(
    settings, dns, channel, receiver
):
    """The control: the setup above does reach the receiver when the guard is off."""
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = True
    dns["rebind.example.com"] = ["127.0.0.1"]
    consumer_at(channel, "billing", f"http://rebind.example.com:{receiver.port}/hook")
    publish(channel, b"secret", producer="shop")

    [result] = dispatch_step(dns)

    assert result.succeeded
    assert [request.body for request in receiver.received] == [b"secret"]
    assert Job.objects.get().status == DELIVERED


STORED_TARGETS = [
    "http://127.0.0.1:{port}/hook",
    "http://2130706433:{port}/hook",
    "http://0x7f.1:{port}/hook",
    "http://[::ffff:127.0.0.1]:{port}/hook",
    "http://localhost:{port}/hook",
    "http://db.localhost:{port}/hook",
    "http://{name}:{port}/hook",
]


@pytest.mark.parametrize("template", STORED_TARGETS)
def test_a_private_url_already_stored_is_refused_at_delivery(
    guarded, dns, channel, receiver, template
):
    dns[PRIVATE_NAME] = ["127.0.0.1", "::1"]
    consumer_at(channel, "billing", template.format(port=receiver.port, name=PRIVATE_NAME))
    publish(channel, b"secret", producer="shop")

    [result] = dispatch_step(dns)

    assert receiver.received == []
    assert result.error_class == "unsafe-callback", result.error


def test_metadata_literals_are_refused_before_any_connection(guarded, channel):
    for number, url in enumerate(
        [
            "http://169.254.169.254/latest/meta-data/",
            "http://[fd00:ec2::254]/",
            "http://0xa9fea9fe/",
        ]
    ):
        consumer_at(channel, f"meta-{number}", url)
    publish(channel, b"x", producer="shop")

    results = dispatch_step()

    assert [result.error_class for result in results] == ["unsafe-callback"] * 3
    assert all(result.duration_ms < 100 for result in results)  # no connect attempt, no timeout


@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_redirects_are_not_followed(settings, channel, receiver, status):
    """A receiver cannot bounce the payload to an internal address: a 3xx is a failed attempt.

    The Location points back at the receiver itself, so a followed redirect would show up."""
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = True  # the receiver is on loopback
    receiver.replies["/hook"] = Reply(status, headers={"Location": receiver.url("/internal")})
    consumer_at(channel, "billing", receiver.url("/hook"))
    publish(channel, b"secret", producer="shop")

    [result] = dispatch_step()

    assert receiver.paths() == ["/hook"]
    assert (result.status_code, result.error_class) == (status, "http-status")
    assert Job.objects.get().status == QUEUED


def test_an_environment_proxy_is_not_used(guarded, dns, channel, receiver, monkeypatch):
    """A proxy resolves names itself, out of the guard's sight: the sender ignores HTTP_PROXY."""
    for variable in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy"):
        monkeypatch.setenv(variable, receiver.url("/"))
    dns[PRIVATE_NAME] = ["10.0.0.7"]
    consumer_at(channel, "billing", f"http://{PRIVATE_NAME}/hook")
    publish(channel, b"secret", producer="shop")

    [result] = dispatch_step(dns)

    assert receiver.received == []  # the "proxy" never saw the request
    assert result.error_class == "unsafe-callback"
