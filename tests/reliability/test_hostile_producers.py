"""Metadata headers under a strict rule (issue 14 §2, §4): hop-by-hop and framing headers,
credentials and the broker's and the signature's own names are never kept, so never stored,
delivered or handed to pull consumers. A broadcast naming one gets a 400 naming it.

The property broadcasts generated metadata headers and delivers what was accepted to a real
receiver: never a 5xx, nothing refused is stored, and every job ends with a recorded attempt.
"""

from __future__ import annotations

import importlib
import itertools
from collections import Counter

import pytest
from django.apps import apps
from hypothesis import given
from hypothesis import strategies as st

from broker import publish
from broker.models import Message, PeriodicMessage
from broker.publishing import InvalidMessage, is_refused_metadata_header
from consumers.models import Consumer
from jobs.dispatch import Dispatcher
from jobs.models import DeliveryAttempt, Job
from jobs.states import DELIVERED, INFLIGHT
from tests.delivery import run_once
from tests.faults import report_counts
from tests.helpers import BROADCAST_HEADERS, make_consumer, make_consumer_with_token
from tests.reliability.hostile import PROPERTY

pytestmark = pytest.mark.django_db

URL = "/channel/orders/broadcast"
REFUSED = [
    "Connection",
    "keep-alive",
    "TE",
    "Trailer",
    "Transfer-Encoding",
    "Upgrade",
    "Expect",
    "Proxy-Authorization",
    "proxy-connection",
    "Host",
    "Content-Length",
    "Authorization",
    "COOKIE",
    "Forwarded",
    "X-Forwarded-For",
    "x-real-ip",
    "X-Broker-Producer-Token",
    "x-broker-channel-token",
    "webhook-signature",
    "Webhook-Id",
]
MESSAGE_IDS = itertools.count()
OUTCOMES: Counter[str] = Counter()


@pytest.fixture(scope="module", autouse=True)
def report_outcomes():
    yield
    report_counts("hostile producers: answers to generated metadata headers", OUTCOMES)


def broadcast(client, **headers):
    # The broker's own headers last: a generated header must not replace the tokens.
    headers = {**headers, **BROADCAST_HEADERS, "X-Broker-Message-ID": f"m{next(MESSAGE_IDS)}"}
    return client.post(URL, b"{}", content_type="application/json", headers=headers)


@pytest.mark.parametrize("name", REFUSED)
def test_a_broadcast_naming_a_refused_header_gets_a_400_naming_it(name, client, channel):
    make_consumer(channel)

    response = broadcast(client, **{"X-Broker-Metadata-Headers": f"X-Trace-Id, {name}"})

    assert response.status_code == 400
    assert repr(name) in response.json()["Error"]
    assert "never kept" in response.json()["Error"]
    assert not Message.objects.exists()


@pytest.mark.parametrize("name", REFUSED)
def test_publish_refuses_a_refused_header_and_stores_nothing(name, channel):
    with pytest.raises(InvalidMessage, match="never kept"):
        publish(channel, b"x", producer="shop", headers={name: "v"})

    assert not Message.objects.exists()


def test_a_pull_consumer_never_sees_the_producers_token(client, channel):
    """The report: `X-Broker-Metadata-Headers: X-Broker-Producer-Token` stored the token, and
    queued-jobs handed it to every pull consumer, who could then publish as the producer."""
    make_consumer_with_token(channel, "worker", token="consumer-token")

    refused = broadcast(client, **{"X-Broker-Metadata-Headers": "X-Broker-Producer-Token"})
    accepted = broadcast(client, **{"X-Broker-Metadata-Headers": "X-Tenant", "X-Tenant": "t1"})
    queued = client.get(
        "/channel/orders/consumer/worker/queued-jobs",
        headers={
            "X-Broker-Channel-Token": "channel-token",
            "X-Broker-Consumer-Token": "consumer-token",
        },
    )

    assert (refused.status_code, accepted.status_code) == (400, 201)
    assert queued.status_code == 200
    assert "producer-token" not in queued.content.decode()
    assert Message.objects.get().headers == {"X-Tenant": "t1"}


def test_credentials_in_the_callback_url_meet_no_producer_authorization(client, channel, receiver):
    """The report: `Authorization` kept from the producer, and a callback URL with credentials,
    made aiohttp raise and the dispatcher exit. The header is refused now; the URL's credentials
    go out as Basic authentication of that consumer's requests alone."""
    consumer = make_consumer(channel)
    consumer.callback_url = f"http://user:pw@127.0.0.1:{receiver.port}/hook"
    consumer.save()

    refused = broadcast(
        client, **{"X-Broker-Metadata-Headers": "Authorization", "Authorization": "x"}
    )
    accepted = broadcast(client, **{"X-Broker-Metadata-Headers": "X-Tenant", "X-Tenant": "t1"})
    run_once(Dispatcher())

    assert (refused.status_code, accepted.status_code) == (400, 201)
    [request] = receiver.received
    assert request.headers["Authorization"] == "Basic dXNlcjpwdw=="
    assert request.headers["X-Tenant"] == "t1"


def test_headers_stored_before_the_rule_are_dropped_by_the_migration(channel):
    Message.objects.create(
        channel=channel,
        producer_id="shop",
        public_id="old",
        payload=b"x",
        content_type="text/plain",
        headers={
            "X-Broker-Producer-Token": "producer-token",
            "Cookie": "c",
            "X-Forwarded-For": "10.0.0.1",
            "X-Tenant": "t1",
        },
        received_at="2026-01-01T00:00:00Z",
    )
    PeriodicMessage.objects.create(
        channel=channel,
        producer_id="shop",
        public_id="tick",
        payload=b"x",
        content_type="text/plain",
        headers={"authorization": "Bearer x", "X-Tenant": "t1"},
        interval_seconds=60,
    )
    migration = importlib.import_module("broker.migrations.0008_drop_refused_metadata_headers")

    migration.drop_refused_headers(apps, None)

    assert Message.objects.get().headers == {"X-Tenant": "t1"}
    assert PeriodicMessage.objects.get().headers == {"X-Tenant": "t1"}


# Mostly names and values a producer would send (strategies listed more than once in one_of are
# drawn more often), then the refused names, arbitrary text and oversized values.
_token = st.from_regex(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,30}", fullmatch=True)
_printable = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=80)
header_names = st.one_of(
    _token, _token, _token, st.sampled_from(REFUSED), st.text(max_size=20)
).filter(lambda name: name.lower().replace("_", "-") != "content-length")  # the test client's own
header_values = st.one_of(
    _printable, _printable, _printable, st.text(max_size=40), st.just("x" * 9000)
)


@PROPERTY
@given(headers=st.dictionaries(header_names, header_values, max_size=4))
def test_generated_metadata_headers_are_refused_or_kept_and_delivered(
    headers, client, channel, receiver
):
    if not Consumer.objects.exists():  # the first case: the consumer all cases deliver to
        consumer = make_consumer(channel)
        consumer.callback_url = receiver.url()
        consumer.save()
    names = ",".join(headers)
    try:
        response = broadcast(client, **{"X-Broker-Metadata-Headers": names, **headers})
    except (ValueError, UnicodeError):
        OUTCOMES["not sendable"] += 1
        return  # a header the test client itself cannot send: no request was made

    assert response.status_code in (201, 400), response.content
    OUTCOMES[f"HTTP {response.status_code}"] += 1
    stored = Message.objects.order_by("-pk").first()
    if response.status_code == 201:
        assert stored is not None
        assert not any(is_refused_metadata_header(name) for name in stored.headers)
    run_once(Dispatcher())
    assert not Job.objects.filter(status=INFLIGHT).exists()
    assert DeliveryAttempt.objects.count() == Job.objects.count()
    assert set(Job.objects.values_list("status", flat=True)) <= {DELIVERED}


def test_the_dispatcher_drops_refused_headers_that_reached_the_table_another_way(channel, receiver):
    """A row written around publish() (a restored backup, a bulk load in SQL) with a header the
    rule refuses: the request goes out without it, rather than failing every attempt."""
    consumer = make_consumer(channel)
    consumer.callback_url = receiver.url()
    consumer.save()
    message = publish(channel, b"x", producer="shop", headers={"X-Tenant": "t1"})
    Message.objects.filter(pk=message.pk).update(
        headers={"X-Tenant": "t1", "Transfer-Encoding": "chunked", "X-Broker-Producer-Token": "p"}
    )

    run_once(Dispatcher())

    [request] = receiver.received
    assert request.headers["X-Broker-Metadata-Headers"] == "X-Tenant"
    sent = {name.lower() for name in request.headers}
    assert "x-broker-producer-token" not in sent
    assert "transfer-encoding" not in sent
    assert Job.objects.get().status == DELIVERED


def test_a_renamed_consumer_token_header_is_refused_too(channel, settings):
    settings.BROKER_CONSUMER_TOKEN_HEADER = "X-Consumer-Key"

    with pytest.raises(InvalidMessage, match="'x-consumer-key' is never kept"):
        publish(channel, b"x", producer="shop", headers={"x-consumer-key": "forged"})
