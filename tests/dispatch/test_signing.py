"""Standard Webhooks signing, secret rotation and the secret endpoints (docs/api.md;
docs/delivery.md, "Signing")."""

from __future__ import annotations

import base64
import json
import logging
from datetime import UTC, datetime, timedelta
from urllib.parse import urlencode

import pytest
import time_machine
from django.utils import timezone
from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError, hmac_data

from consumers.models import Consumer, generate_signing_secret
from jobs.signing import InvalidSecret, decode_secret, sign, signature_headers
from tests.conftest import FORM
from tests.helpers import make_channel, make_consumer

pytestmark = pytest.mark.django_db

T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
SECRET_URL = "/channel/orders/consumer/billing/secret"


def secret_of(byte_count: int) -> str:
    return "whsec_" + base64.b64encode(bytes(range(byte_count))).decode()


def put_consumer(client, data, **headers):
    form = {"callbackUrl": "https://example.com/hook", **data}
    return client.put(
        "/channel/orders/consumer/billing", urlencode(form), content_type=FORM, headers=headers
    )


def verifies(secret: str, payload: bytes, headers: dict[str, str]) -> bool:
    """Whether the reference verifier accepts the delivery (it checks the timestamp against now)."""
    try:
        Webhook(secret).verify(payload, headers, json_parse=False)
    except WebhookVerificationError:
        return False
    return True


# Signing


def test_sign_matches_the_standard_webhooks_test_vector():
    secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"

    signature = sign(secret, "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, b'{"test": 2432232314}')

    assert signature == "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="


@pytest.mark.parametrize(
    "payload",
    [
        b'{"order": 42, "total": "9.99"}',
        "naïve café ✓ 注文".encode(),
        bytes(range(128)),  # binary, every control character and NUL, still valid UTF-8
    ],
    ids=["json", "unicode-text", "binary-ascii"],
)
def test_the_reference_library_verifies_deliveries(payload):
    consumer = make_consumer(make_channel())

    headers = signature_headers(consumer, "msg-1", payload, timezone.now())

    Webhook(consumer.signing_secret).verify(payload, headers, json_parse=False)
    assert headers["webhook-id"] == "msg-1"


def test_binary_payloads_that_are_not_utf8_are_signed_as_raw_bytes():
    # The Python reference verifier decodes the body as UTF-8 before signing it, so it cannot take
    # such a body at all; check against its HMAC over the raw bytes instead (as the Go and JS
    # verifiers sign them).
    consumer = make_consumer(make_channel())
    payload = bytes(range(256)) * 4
    now = timezone.now()

    headers = signature_headers(consumer, "msg-2", payload, now)

    signed = f"msg-2.{int(now.timestamp())}.".encode() + payload
    expected = hmac_data(Webhook(consumer.signing_secret)._whsecret, signed)
    assert headers["webhook-signature"] == "v1," + base64.b64encode(expected).decode()


def test_headers_carry_the_id_and_unix_seconds():
    consumer = make_consumer(make_channel())

    headers = signature_headers(consumer, "msg-3", b"{}", T0 + timedelta(milliseconds=900))

    assert headers["webhook-id"] == "msg-3"
    assert headers["webhook-timestamp"] == str(int(T0.timestamp()))
    assert headers["webhook-signature"].startswith("v1,")
    assert " " not in headers["webhook-signature"]


def test_a_changed_body_id_or_secret_does_not_verify():
    consumer = make_consumer(make_channel())
    headers = signature_headers(consumer, "msg-4", b'{"a": 1}', timezone.now())

    assert not verifies(consumer.signing_secret, b'{"a": 2}', headers)
    assert not verifies(consumer.signing_secret, b'{"a": 1}', {**headers, "webhook-id": "msg-5"})
    assert not verifies(generate_signing_secret(), b'{"a": 1}', headers)


def test_generated_secrets_differ_between_consumers():
    channel = make_channel()

    first, second = make_consumer(channel, "billing"), make_consumer(channel, "shipping")

    assert first.signing_secret != second.signing_secret
    assert len(decode_secret(first.signing_secret)) == 32


# Secret format


@pytest.mark.parametrize("byte_count", [24, 32, 64])
def test_well_formed_secrets_decode(byte_count):
    assert decode_secret(secret_of(byte_count)) == bytes(range(byte_count))


@pytest.mark.parametrize(
    "secret",
    [
        "",
        "whsec_",
        base64.b64encode(bytes(32)).decode(),  # no prefix
        "WHSEC_" + base64.b64encode(bytes(32)).decode(),
        "whsec_" + "!" * 44,
        "whsec_" + base64.b64encode(bytes(32)).decode().rstrip("="),  # bad padding
        "whsec_" + base64.b64encode(bytes(32)).decode() + " x",
        secret_of(23),
        secret_of(65),
    ],
)
def test_malformed_secrets_are_refused_without_echoing_them(secret):
    with pytest.raises(InvalidSecret) as raised:
        decode_secret(secret)

    assert secret in ("", "whsec_") or secret not in str(raised.value)


# Rotation


def test_rotation_signs_with_both_secrets_during_the_overlap():
    consumer = make_consumer(make_channel())
    old = consumer.signing_secret
    with time_machine.travel(T0, tick=False):
        new = consumer.rotate_signing_secret(timezone.now())

    with time_machine.travel(T0 + timedelta(hours=23, minutes=59), tick=False):
        consumer = Consumer.objects.get()
        headers = signature_headers(consumer, "msg-1", b"{}", timezone.now())

        assert new != old
        assert len(headers["webhook-signature"].split(" ")) == 2
        assert verifies(new, b"{}", headers)
        assert verifies(old, b"{}", headers)


def test_after_the_overlap_only_the_new_secret_signs():
    consumer = make_consumer(make_channel())
    old = consumer.signing_secret
    with time_machine.travel(T0, tick=False):
        new = consumer.rotate_signing_secret(timezone.now())

    with time_machine.travel(T0 + timedelta(hours=24), tick=False):
        headers = signature_headers(Consumer.objects.get(), "msg-1", b"{}", timezone.now())

        assert len(headers["webhook-signature"].split(" ")) == 1
        assert verifies(new, b"{}", headers)
        assert not verifies(old, b"{}", headers)


def test_rotation_keeps_one_previous_secret_for_the_given_overlap():
    consumer = make_consumer(make_channel())
    first = consumer.signing_secret
    second = consumer.rotate_signing_secret(T0, overlap=timedelta(hours=1))

    third = consumer.rotate_signing_secret(T0 + timedelta(minutes=30), overlap=timedelta(hours=1))

    consumer = Consumer.objects.get()
    assert consumer.active_signing_secrets(T0 + timedelta(minutes=89)) == [third, second]
    assert consumer.active_signing_secrets(T0 + timedelta(minutes=90)) == [third]
    assert first not in consumer.active_signing_secrets(T0 + timedelta(minutes=31))


def test_a_consumer_that_never_rotated_has_one_active_secret():
    consumer = make_consumer(make_channel())

    assert consumer.active_signing_secrets(T0) == [consumer.signing_secret]


# API: reading and rotating


def test_get_secret_returns_the_current_secret_uncached(admin_client):
    consumer = make_consumer(make_channel())

    response = admin_client.get(SECRET_URL)

    assert response.status_code == 200
    assert response.json() == {"SigningSecret": consumer.signing_secret}
    assert response["Cache-Control"] == "no-store"


def test_post_secret_rotates_with_a_24_hour_overlap(admin_client):
    old = make_consumer(make_channel()).signing_secret

    with time_machine.travel(T0, tick=False):
        response = admin_client.post(SECRET_URL)
        read_back = admin_client.get(SECRET_URL).json()

    assert response.status_code == 200
    body = response.json()
    assert body["SigningSecret"].startswith("whsec_")
    assert body["SigningSecret"] != old
    assert body["PreviousSigningSecretExpiresAt"] == "2026-03-02T12:00:00Z"
    assert read_back == body
    consumer = Consumer.objects.get()
    assert (consumer.signing_secret, consumer.previous_signing_secret) == (
        body["SigningSecret"],
        old,
    )
    with time_machine.travel(T0 + timedelta(hours=24), tick=False):
        assert "PreviousSigningSecretExpiresAt" not in admin_client.get(SECRET_URL).json()


@pytest.mark.parametrize("method", ["get", "post"])
def test_secret_endpoints_need_an_admin(client, method):
    consumer = make_consumer(make_channel())

    response = getattr(client, method)(SECRET_URL)

    assert response.status_code == 401
    assert consumer.signing_secret not in response.content.decode()
    assert Consumer.objects.get().signing_secret == consumer.signing_secret


@pytest.mark.parametrize("method", ["get", "post"])
@pytest.mark.parametrize(
    "url", ["/channel/nope/consumer/billing/secret", "/channel/orders/consumer/nope/secret"]
)
def test_secret_endpoints_are_404_for_unknown_resources(admin_client, method, url):
    make_consumer(make_channel())

    response = getattr(admin_client, method)(url)

    assert response.status_code == 404
    assert "Error" in response.json()


def test_secrets_never_appear_in_the_consumer_json(admin_client):
    make_consumer(make_channel())
    rotated = admin_client.post(SECRET_URL).json()["SigningSecret"]
    consumer = Consumer.objects.get()
    secrets = [rotated, consumer.previous_signing_secret]

    body = admin_client.get("/channel/orders/consumer/billing").content.decode()

    assert not any(secret in body for secret in secrets)
    assert "signing" not in body.lower()


# API: importing through the consumer PUT


def test_put_imports_a_secret_on_create(admin_client, caplog):
    make_channel()
    imported = secret_of(32)

    with caplog.at_level(logging.DEBUG):
        response = put_consumer(admin_client, {"signingSecret": imported})

    assert response.status_code == 200
    assert imported not in response.content.decode()
    assert imported not in caplog.text
    assert admin_client.get(SECRET_URL).json() == {"SigningSecret": imported}
    payload = json.dumps({"id": 1}).encode()
    headers = signature_headers(Consumer.objects.get(), "msg-1", payload, timezone.now())
    Webhook(imported).verify(payload, headers)


def test_put_import_replaces_the_secret_without_an_overlap(admin_client):
    make_consumer(make_channel())
    admin_client.post(SECRET_URL)  # leaves a previous secret signing for 24 h
    last_modified = admin_client.get("/channel/orders/consumer/billing")["Last-Modified"]
    imported = secret_of(40)

    response = put_consumer(
        admin_client, {"signingSecret": imported}, **{"If-Unmodified-Since": last_modified}
    )

    assert response.status_code == 200
    assert Consumer.objects.get().active_signing_secrets(timezone.now()) == [imported]
    assert admin_client.get(SECRET_URL).json() == {"SigningSecret": imported}


@pytest.mark.parametrize("form", [{"name": "Renamed"}, {"signingSecret": ""}])
def test_put_without_a_signing_secret_keeps_the_secret(admin_client, form):
    consumer = make_consumer(make_channel())
    last_modified = admin_client.get("/channel/orders/consumer/billing")["Last-Modified"]

    response = put_consumer(admin_client, form, **{"If-Unmodified-Since": last_modified})

    assert response.status_code == 200
    assert Consumer.objects.get().signing_secret == consumer.signing_secret


@pytest.mark.parametrize(
    "bad",
    [
        "not-a-secret",
        "whsec_" + "%" * 44,
        secret_of(16),
        secret_of(100),
        base64.b64encode(bytes(range(32))).decode(),
    ],
)
def test_put_refuses_a_malformed_secret_without_echoing_it(admin_client, caplog, bad):
    consumer = make_consumer(make_channel())
    last_modified = admin_client.get("/channel/orders/consumer/billing")["Last-Modified"]

    with caplog.at_level(logging.DEBUG):
        response = put_consumer(
            admin_client, {"signingSecret": bad}, **{"If-Unmodified-Since": last_modified}
        )

    assert response.status_code == 400
    assert "signingSecret" in response.json()["Error"]
    assert bad not in response.content.decode()
    assert bad not in caplog.text
    assert Consumer.objects.get().signing_secret == consumer.signing_secret


def test_the_schema_documents_the_secret_endpoints(client):
    schema = json.loads(client.get("/api/schema/", headers={"Accept": "application/json"}).content)

    operations = schema["paths"]["/channel/{channel_id}/consumer/{consumer_id}/secret"]
    assert set(operations) == {"get", "post"}
    form = schema["components"]["schemas"]["ConsumerFormRequest"]["properties"]
    assert "signingSecret" in form
