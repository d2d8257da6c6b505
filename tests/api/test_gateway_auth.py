"""Gateway authentication (webhook-broker's HMAC perimeter check), signed as its clients sign."""

from __future__ import annotations

import base64
import hashlib
import hmac
import logging
from datetime import UTC, datetime

import pytest
import time_machine

from broker.gateway_auth import check_mode, parse_signature
from broker.models import Message
from tests.api_server import running_api
from tests.helpers import make_channel, make_producer

SECRET_B64 = "dGVzdC1obWFjLXNlY3JldC1mb3ItaW50ZWdyYXRpb24="  # webhook-broker's test secret
NOW = datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
T = int(NOW.timestamp())
BODY = b'{"test":"hello world"}'
BROADCAST = "/channel/orders/broadcast"
TOKENS = {
    "HTTP_X_BROKER_CHANNEL_TOKEN": "channel-token",
    "HTTP_X_BROKER_PRODUCER_ID": "shop",
    "HTTP_X_BROKER_PRODUCER_TOKEN": "producer-token",
}


def signature(body: bytes, timestamp: int, secret_b64: str = SECRET_B64) -> str:
    """As webhook-broker's integration test signs: hex HMAC-SHA256 of "<t>.<body>"."""
    key = base64.b64decode(secret_b64)
    mac = hmac.new(key, str(timestamp).encode() + b"." + body, hashlib.sha256).hexdigest()
    return f"t={timestamp},v1={mac}"


@pytest.fixture
def gateway(settings):
    settings.BROKER_GATEWAY_AUTH_MODE = "hmac"
    settings.BROKER_GATEWAY_HMAC_SECRET = SECRET_B64
    settings.BROKER_GATEWAY_HMAC_TOLERANCE_SECONDS = 300
    settings.BROKER_GATEWAY_AUTH_EXEMPT_PATHS = ["/_status", "/metrics"]
    make_channel()
    make_producer()
    with time_machine.travel(NOW, tick=False):
        yield settings


def broadcast(client, body: bytes = BODY, signed: str | None = None, **headers: str):
    if signed is not None:
        headers["HTTP_X_BROKER_SIGNATURE"] = signed
    return client.post(BROADCAST, body, content_type="application/json", **{**TOKENS, **headers})


pytestmark = pytest.mark.django_db


def test_a_signed_broadcast_is_accepted(client, gateway):
    response = broadcast(client, signed=signature(BODY, T))

    assert response.status_code == 201, response.content
    assert Message.objects.get().payload == BODY


def test_the_window_is_inclusive_on_both_sides_in_whole_seconds(client, gateway):
    with time_machine.travel(T + 0.9, tick=False):  # the check reads whole seconds, as t is
        assert broadcast(client, signed=signature(BODY, T - 300)).status_code == 201
        assert broadcast(client, signed=signature(BODY, T + 300)).status_code == 201


def test_without_a_signature_it_is_401_and_nothing_is_stored(client, gateway, caplog):
    with caplog.at_level(logging.WARNING, logger="broker.gateway"):
        response = broadcast(client)

    assert response.status_code == 401
    assert response.json() == {"Error": "missing X-Broker-Signature header"}
    assert response["X-Request-ID"] in caplog.text
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    "header",
    [
        "garbage",
        f"v1={'0' * 64}",
        f"t={T}",
        f"t={T},v1=ab,extra=1",
        f"t=soon,v1={'0' * 64}",
        f"t=1e9,v1={'0' * 64}",
        f"t={T}.5,v1={'0' * 64}",
        f"t=١٢٣,v1={'0' * 64}",  # other digits: int() would take them
        f"t={'9' * 30},v1={'0' * 64}",
        ",",
    ],
)
def test_a_malformed_signature_header_is_401(client, gateway, header):
    response = broadcast(client, signed=header)

    assert response.status_code == 401
    assert response.json() == {"Error": "malformed X-Broker-Signature header"}
    assert not Message.objects.exists()


def test_the_parts_may_come_in_any_order_with_spaces():
    assert parse_signature(" v1=abc , t=42") == (42, "abc")


@pytest.mark.parametrize("offset", [-301, 301, -600])
def test_a_timestamp_outside_the_window_is_403(client, gateway, offset):
    response = broadcast(client, signed=signature(BODY, T + offset))

    assert response.status_code == 403
    assert response.json() == {"Error": "request timestamp outside tolerance window"}
    assert not Message.objects.exists()


def test_a_body_changed_after_signing_is_403(client, gateway):
    signed = signature(BODY, T)

    response = broadcast(client, body=b'{"test":"hello w0rld"}', signed=signed)

    assert response.status_code == 403
    assert response.json() == {"Error": "invalid signature"}
    assert not Message.objects.exists()


@pytest.mark.parametrize(
    "signed",
    [
        f"t={T},v1=deadbeefdeadbeefdeadbeefdeadbeef",
        signature(BODY, T, secret_b64=base64.b64encode(b"another secret").decode()),
        signature(BODY, T).upper().replace("T=", "t=").replace("V1=", "v1="),  # hex in capitals
        signature(BODY, T - 1).replace(f"t={T - 1}", f"t={T}"),  # another second's signature
        f"t={T},v1=é" + "0" * 63,
    ],
)
def test_a_wrong_signature_is_403(client, gateway, signed):
    response = broadcast(client, signed=signed)

    assert response.status_code == 403
    assert response.json() == {"Error": "invalid signature"}


def test_a_replay_inside_the_window_passes_the_gateway_and_after_it_is_403(client, gateway):
    signed = signature(BODY, T)
    assert broadcast(client, signed=signed).status_code == 201

    # The same request again: the gateway lets it through (the check has no memory, as
    # webhook-broker's); a message ID sent with it makes the broker refuse the duplicate.
    assert broadcast(client, signed=signed).status_code == 201
    with time_machine.travel(T + 301, tick=False):
        late = broadcast(client, signed=signed)

    assert late.status_code == 403
    assert late.json() == {"Error": "request timestamp outside tolerance window"}
    assert Message.objects.count() == 2


def test_tokens_still_apply_after_a_good_signature(client, gateway):
    response = broadcast(
        client, signed=signature(BODY, T), HTTP_X_BROKER_CHANNEL_TOKEN="wrong-token"
    )

    assert response.status_code in (401, 403)
    assert "signature" not in response.json()["Error"]
    assert not Message.objects.exists()


def test_a_get_is_signed_over_an_empty_body(admin_client, gateway):
    assert admin_client.get("/channel/orders").status_code == 401
    signed = signature(b"", T)

    response = admin_client.get("/channel/orders", HTTP_X_BROKER_SIGNATURE=signed)

    assert response.status_code == 200
    assert response.json()["ID"] == "orders"


def test_exempt_paths_need_no_signature(client, gateway):
    gateway.BROKER_PUBLIC_METRICS = True

    assert client.get("/_status").status_code == 200
    assert client.get("/metrics").status_code == 200
    gateway.BROKER_GATEWAY_AUTH_EXEMPT_PATHS = []
    assert client.get("/_status").status_code == 401


def test_the_refusal_is_logged_without_the_signature(client, gateway, caplog):
    signed = signature(BODY, T - 1000)

    with caplog.at_level(logging.WARNING, logger="broker.gateway"):
        response = broadcast(client, signed=signed, HTTP_X_REQUEST_ID="proxy-req-7")

    assert response.status_code == 403
    assert response["X-Request-ID"] == "proxy-req-7"
    assert "proxy-req-7" in caplog.text
    assert "outside tolerance window" in caplog.text
    assert signed.split("v1=")[1] not in caplog.text


def test_with_mode_none_nothing_is_checked(client, settings):
    make_channel()
    make_producer()

    assert broadcast(client).status_code == 201


@pytest.mark.parametrize(
    ("mode", "secret", "problem"),
    [
        ("hmac", "", "non-empty base64"),
        ("hmac", "not base64!", "non-empty base64"),
        ("sha", SECRET_B64, "must be none or hmac"),
    ],
)
def test_a_configuration_that_cannot_be_enforced_stops_start_up(mode, secret, problem):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match=problem) as error:
        check_mode(mode, secret)
    assert secret == "" or secret not in str(error.value)


@pytest.mark.django_db(transaction=True)
def test_a_server_started_with_the_gateway_variables_checks_signatures(tmp_path):
    """gunicorn configured only through the environment, the secret in a file (`_FILE`), and a
    client that signs with the real clock as webhook-broker's integration test does."""
    import time

    make_channel()
    make_producer()
    secret_file = tmp_path / "gateway-secret"
    secret_file.write_text(SECRET_B64 + "\n")
    headers = {
        "Content-Type": "application/json",
        "X-Broker-Channel-Token": "channel-token",
        "X-Broker-Producer-ID": "shop",
        "X-Broker-Producer-Token": "producer-token",
    }
    with running_api(
        BROKER_GATEWAY_AUTH_MODE="hmac", BROKER_GATEWAY_HMAC_SECRET_FILE=str(secret_file)
    ) as server:
        unsigned = server.request("POST", BROADCAST, BODY, headers)
        signed = signature(BODY, int(time.time()))
        good = server.request("POST", BROADCAST, BODY, {**headers, "X-Broker-Signature": signed})
        tampered = server.request(
            "POST", BROADCAST, BODY + b" ", {**headers, "X-Broker-Signature": signed}
        )
        status = server.request("GET", "/_status")
        output = server.output()

    assert (unsigned.status, good.status, tampered.status, status.status) == (401, 201, 403, 200)
    assert good.headers["X-Request-ID"]
    assert unsigned.headers["X-Request-ID"] in output
    assert signed.split("v1=")[1] not in output
    assert Message.objects.count() == 1


def test_a_body_over_the_upload_limit_is_413_before_it_is_hashed(client, gateway):
    gateway.DATA_UPLOAD_MAX_MEMORY_SIZE = len(BODY) - 1

    response = broadcast(client, signed=signature(BODY, T))

    assert response.status_code == 413
    assert response.json() == {"Error": "request body too large"}
    assert not Message.objects.exists()
