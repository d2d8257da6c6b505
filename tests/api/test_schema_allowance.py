"""Each producer's allowance of schema checking in a web process (BROKER_SCHEMA_STEPS_PER_SECOND,
broker/schema_allowance.py; issue 36): a producer sending costly typed payloads back to back is
refused (429, Retry-After) once it is more than a quarter second's allowance in debt, before any
more of its work is done, while other producers keep publishing; the allowance comes back with time.
The clock is the test's: nothing here depends on how fast the machine is."""

from __future__ import annotations

import json
from urllib.parse import urlencode

import pytest

from broker import publish, schema_allowance
from broker.models import Message
from broker.schema_allowance import TOLERANCE_SECONDS
from broker.schema_budget import MAX_VALIDATION_STEPS
from tests.conftest import FORM
from tests.helpers import BROADCAST_HEADERS, make_producer

pytestmark = pytest.mark.django_db

RATE = 100_000  # steps a second
COSTLY = [{"n": n} for n in range(4000)]  # 8,002 steps against uniqueItems


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch, settings):
    settings.BROKER_SCHEMA_STEPS_PER_SECOND = RATE
    frozen = Clock()
    monkeypatch.setattr(schema_allowance, "clock", frozen)
    return frozen


@pytest.fixture
def unique_type(admin_client, channel):
    schema = urlencode({"schema": json.dumps({"type": "array", "uniqueItems": True})})
    response = admin_client.put("/channel/orders/event-type/list", schema, content_type=FORM)
    assert response.status_code == 200
    admin_client.defaults.pop("HTTP_AUTHORIZATION")


def broadcast(client, payload, producer="shop", token="producer-token", event_type="list"):
    headers = {**BROADCAST_HEADERS, "X-Broker-Producer-ID": producer}
    headers["X-Broker-Producer-Token"] = token
    if event_type:
        headers["X-Broker-Event-Type"] = event_type
    body = json.dumps(payload).encode()
    return client.post(
        "/channel/orders/broadcast", body, content_type="application/json", headers=headers
    )


def test_a_quiet_producer_may_always_make_its_costliest_publish(
    client, admin_client, channel, clock
):
    schema = {"type": "array", "items": {"type": "integer"}}
    admin_client.put(
        "/channel/orders/event-type/list",
        urlencode({"schema": json.dumps(schema)}),
        content_type=FORM,
    )
    most = list(range(MAX_VALIDATION_STEPS // 8))  # most of a publish's budget
    assert broadcast(client, most).status_code == 201
    refused = broadcast(client, [1])
    assert refused.status_code == 429
    clock.now += int(refused["Retry-After"])
    assert broadcast(client, [1]).status_code == 201


def test_a_producer_in_debt_is_refused_until_its_allowance_comes_back(client, unique_type, clock):
    # Publishes are let in while the debt is at most TOLERANCE_SECONDS' allowance.
    affordable = int(TOLERANCE_SECONDS * RATE // 8002) + 1
    answers = [broadcast(client, COSTLY).status_code for _ in range(affordable + 1)]
    assert answers == [201] * affordable + [429]

    refused = broadcast(client, COSTLY)
    assert refused.status_code == 429
    debt = affordable * 8002 / RATE - TOLERANCE_SECONDS  # seconds beyond the tolerance
    assert refused["Retry-After"] == str(max(1, -int(-debt // 1)))
    assert refused.json()["Error"] == (
        "Producer 'shop' has used its allowance of schema checking"
        " (BROKER_SCHEMA_STEPS_PER_SECOND steps a second in each web process);"
        f" retry after {refused['Retry-After']} s."
    )
    assert Message.objects.count() == affordable  # the refused ones stored nothing

    # Another producer is not refused, nor are this producer's untyped messages (nothing to check).
    make_producer("other", "other-token")
    assert broadcast(client, COSTLY, producer="other", token="other-token").status_code == 201
    assert broadcast(client, COSTLY, event_type=None).status_code == 201

    clock.now += debt + 0.01
    assert broadcast(client, COSTLY).status_code == 201


def test_refused_payloads_are_charged_too(client, admin_client, channel, clock):
    schema = urlencode({"schema": json.dumps({"type": "array", "uniqueItems": True})})
    admin_client.put("/channel/orders/event-type/list", schema, content_type=FORM)
    duplicated = [*COSTLY, {"n": 0}]
    answers = {broadcast(client, duplicated).status_code for _ in range(60)}
    assert answers == {400, 429}


def test_a_batch_is_charged_its_steps_and_refused_whole(client, unique_type, clock):
    text = json.dumps(COSTLY)
    items = [{"payload": text, "content_type": "application/json", "event_type": "list"}] * 10
    body = json.dumps({"messages": items}).encode()
    url = "/channel/orders/broadcast-batch"

    def send():
        headers = {**BROADCAST_HEADERS}
        return client.post(url, body, content_type="application/json", headers=headers)

    # 80,000 steps: the first is let in (no debt yet), the second finds 0.8 s of debt.
    assert [send().status_code for _ in range(2)] == [201, 429]
    assert Message.objects.count() == 10


def test_nobody_spends_a_producers_allowance_without_its_token(client, unique_type, clock):
    for _ in range(60):
        assert broadcast(client, COSTLY, token="wrong").status_code == 403
    assert broadcast(client, COSTLY).status_code == 201
    assert schema_allowance.ALLOWANCES._due["shop"] == clock.now + 8002 / RATE


def test_the_allowance_off_and_publish_in_process_are_not_metered(
    client, unique_type, clock, settings
):
    settings.BROKER_SCHEMA_STEPS_PER_SECOND = 0
    assert {broadcast(client, COSTLY).status_code for _ in range(60)} == {201}
    settings.BROKER_SCHEMA_STEPS_PER_SECOND = RATE
    for _ in range(60):
        publish("orders", COSTLY, producer="shop", event_type="list")
    assert schema_allowance.ALLOWANCES._due == {}


def test_a_producer_in_debt_is_refused_without_a_round_trip(
    client, unique_type, clock, django_assert_num_queries
):
    while broadcast(client, COSTLY).status_code == 201:
        pass
    with django_assert_num_queries(0):  # a flood of them costs the database nothing
        assert broadcast(client, COSTLY).status_code == 429
        assert broadcast(client, COSTLY, token="wrong").status_code == 429
