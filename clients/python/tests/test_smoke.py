"""The HTTP layer against the live broker: a 2xx answer, and a refusal as its exception."""

from __future__ import annotations

import pytest

from tests.conftest import Broker
from webhook_broker_client import NotFound, Unauthorized
from webhook_broker_client._http import HttpClient


def test_status_answers(broker: Broker) -> None:
    with HttpClient(broker.url) as http:
        assert http.request("GET", "/_status").json()["status"] == "ok"


def test_a_refusal_carries_status_and_message(broker: Broker) -> None:
    admin = {"Authorization": f"Bearer {broker.admin_token}"}
    with HttpClient(broker.url, headers=admin) as http, pytest.raises(NotFound) as refused:
        http.request("GET", "/channel/no-such-channel")
    assert refused.value.status == 404
    assert str(refused.value) == f"HTTP 404: {refused.value.message}"
    assert refused.value.message


def test_a_wrong_token_is_unauthorized(broker: Broker) -> None:
    wrong = {"Authorization": "Bearer not-a-token"}
    with HttpClient(broker.url, headers=wrong) as http, pytest.raises(Unauthorized) as refused:
        http.request("GET", "/channels")
    assert refused.value.status in (401, 403)
