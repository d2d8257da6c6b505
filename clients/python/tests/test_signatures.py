"""verify() on real deliveries from the live broker's dispatcher, and on forged ones."""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import Broker, unique
from tests.receiver import Delivery, receiver
from webhook_broker_client import Admin, Producer
from webhook_broker_client.signatures import (
    InvalidSignature,
    TimestampOutOfTolerance,
    WebhookVerificationError,
    verify,
)

OTHER_SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


@pytest.fixture(scope="module")
def delivered(broker: Broker) -> Iterator[tuple[Delivery, str]]:
    """One real signed delivery: what the receiver got, and the consumer's secret."""
    with Admin(broker.url, broker.admin_token) as admin, receiver() as hook:
        channel_id, producer_id, consumer_id = unique("ch"), unique("pr"), unique("push")
        channel = admin.put_channel(channel_id)
        producer = admin.put_producer(producer_id)
        admin.put_consumer(channel_id, consumer_id, callback_url=hook.url)
        secret = admin.signing_secret(channel_id, consumer_id)["SigningSecret"]
        with Producer(
            broker.url, channel_id, channel["Token"], producer_id, producer["Token"]
        ) as p:
            p.publish(b'{"order": 7}', content_type="application/json")
        yield hook.next_delivery(), secret


def sent_at(delivery: Delivery) -> datetime:
    return datetime.fromtimestamp(int(delivery.headers["webhook-timestamp"]), UTC)


def test_a_real_delivery_verifies(delivered: tuple[Delivery, str]) -> None:
    delivery, secret = delivered
    assert delivery.body == b'{"order": 7}'
    verify(delivery.headers, delivery.body, secret, now=sent_at(delivery))
    # Header names in any case, the body as text too.
    upper = {name.upper(): value for name, value in delivery.headers.items()}
    verify(upper, delivery.body.decode(), secret, now=sent_at(delivery))


def test_a_tampered_body_is_refused(delivered: tuple[Delivery, str]) -> None:
    delivery, secret = delivered
    with pytest.raises(InvalidSignature, match="no v1 signature"):
        verify(delivery.headers, b'{"order": 8}', secret, now=sent_at(delivery))


def test_a_tampered_id_is_refused(delivered: tuple[Delivery, str]) -> None:
    delivery, secret = delivered
    forged = {**delivery.headers, "webhook-id": "another"}
    with pytest.raises(InvalidSignature):
        verify(forged, delivery.body, secret, now=sent_at(delivery))


def test_the_wrong_secret_is_refused(delivered: tuple[Delivery, str]) -> None:
    delivery, _ = delivered
    with pytest.raises(InvalidSignature):
        verify(delivery.headers, delivery.body, OTHER_SECRET, now=sent_at(delivery))


def test_an_old_or_future_timestamp_is_refused(
    delivered: tuple[Delivery, str],
) -> None:
    delivery, secret = delivered
    with pytest.raises(TimestampOutOfTolerance, match="tolerance"):
        verify(delivery.headers, delivery.body, secret, now=sent_at(delivery) + timedelta(hours=1))
    with pytest.raises(TimestampOutOfTolerance):
        verify(delivery.headers, delivery.body, secret, now=sent_at(delivery) - timedelta(hours=1))
    later = sent_at(delivery) + timedelta(minutes=30)
    verify(delivery.headers, delivery.body, secret, now=later, tolerance=timedelta(hours=1))


@pytest.mark.parametrize(
    ("timestamp", "refusal"),
    [
        ("99999999999999999", InvalidSignature),  # beyond 12 digits: past datetime's years
        ("999999999999", TimestampOutOfTolerance),  # 12 digits, year 33658: far in the future
        ("-1", InvalidSignature),
        ("+1700000000", InvalidSignature),
        ("1_700_000_000", InvalidSignature),
        ("1e9", InvalidSignature),
    ],
)
def test_a_malformed_or_far_timestamp_is_a_verification_error(
    delivered: tuple[Delivery, str], timestamp: str, refusal: type[WebhookVerificationError]
) -> None:
    """Never an OverflowError or OSError: a receiver answers 4xx to any of these, not 500."""
    delivery, secret = delivered
    forged = {**delivery.headers, "webhook-timestamp": timestamp}
    with pytest.raises(refusal, match="webhook-timestamp"):
        verify(forged, delivery.body, secret, now=sent_at(delivery))


def test_missing_headers_are_refused(delivered: tuple[Delivery, str]) -> None:
    delivery, secret = delivered
    unsigned = {k: v for k, v in delivery.headers.items() if k.lower() != "webhook-signature"}
    with pytest.raises(InvalidSignature, match="webhook-signature header is missing"):
        verify(unsigned, delivery.body, secret)


def test_both_secrets_verify_during_a_rotation(broker: Broker) -> None:
    with Admin(broker.url, broker.admin_token) as admin, receiver() as hook:
        channel_id, producer_id, consumer_id = unique("ch"), unique("pr"), unique("push")
        channel = admin.put_channel(channel_id)
        producer = admin.put_producer(producer_id)
        admin.put_consumer(channel_id, consumer_id, callback_url=hook.url)
        old = admin.signing_secret(channel_id, consumer_id)["SigningSecret"]
        new = admin.rotate_signing_secret(channel_id, consumer_id)["SigningSecret"]
        with Producer(
            broker.url, channel_id, channel["Token"], producer_id, producer["Token"]
        ) as p:
            p.publish("after the rotation")
        delivery = hook.next_delivery()
    assert len(delivery.headers["webhook-signature"].split()) == 2
    for secret in (old, new):
        verify(delivery.headers, delivery.body, secret, now=sent_at(delivery))


def test_errors_share_one_base() -> None:
    assert issubclass(InvalidSignature, WebhookVerificationError)
    assert issubclass(TimestampOutOfTolerance, WebhookVerificationError)


def standard_headers(body: bytes, signature: str, at: datetime) -> dict[str, str]:
    return {
        "webhook-id": "msg_1",
        "webhook-timestamp": str(int(at.timestamp())),
        "webhook-signature": signature,
    }


def test_raw_key_bytes_verify_v1() -> None:
    key, at, body = b"r" * 32, datetime(2030, 1, 1, tzinfo=UTC), b"payload"
    signed = f"msg_1.{int(at.timestamp())}.".encode() + body
    signature = base64.b64encode(hmac.new(key, signed, hashlib.sha256).digest()).decode()
    headers = standard_headers(body, f"v1a,AAAA v1,{signature}", at)
    verify(headers, body, key, now=at)


def test_ed25519_v1a_with_a_public_key() -> None:
    ed25519 = pytest.importorskip("cryptography.hazmat.primitives.asymmetric.ed25519")
    serialization = pytest.importorskip("cryptography.hazmat.primitives.serialization")
    private = ed25519.Ed25519PrivateKey.generate()
    raw_public = private.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    public_key = "whpk_" + base64.b64encode(raw_public).decode()
    at, body = datetime(2030, 1, 1, tzinfo=UTC), b"payload"
    signed = f"msg_1.{int(at.timestamp())}.".encode() + body
    signature = base64.b64encode(private.sign(signed)).decode()
    verify(standard_headers(body, f"v1,AAAA v1a,{signature}", at), body, public_key, now=at)
    with pytest.raises(InvalidSignature, match="no v1a signature"):
        verify(standard_headers(body, f"v1a,{signature}", at), b"other", public_key, now=at)


def test_a_malformed_key_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="signing secret"):
        verify({}, b"", "not-a-key")
