"""Large payloads (docs/delivery.md, "Large payloads"): offloaded to storage, delivered and pulled
byte for byte, deleted with their message; a missing file makes the job DEAD without a request; 413
above the maximum."""

from __future__ import annotations

import base64
import json
import os
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from django.core.management import call_command
from django.db import transaction
from django.test import Client
from django.utils import timezone
from standardwebhooks import Webhook

from broker import payloads, publish
from broker.checks import check_payload_storage
from broker.models import Message
from broker.publishing import DuplicateMessage, PayloadTooLarge, UnknownChannel
from jobs.models import DeliveryAttempt, Job
from jobs.signing import chunked_signature_headers, sign, signature_headers
from jobs.states import DEAD, DELIVERED, INFLIGHT, QUEUED
from tests.delivery import push_consumer, run_once
from tests.helpers import (
    BROADCAST_HEADERS,
    PULL_HEADERS,
    make_channel,
    make_consumer,
    make_consumer_with_token,
    make_producer,
)

pytestmark = pytest.mark.django_db

MiB = 1024 * 1024
THRESHOLD = 262144  # BROKER_PAYLOAD_OFFLOAD_BYTES' default, deliberately not overridden here


@pytest.fixture(autouse=True)
def storage_dir(settings, tmp_path):
    """This test's payload storage: the configured one, in a directory of its own."""
    location = tmp_path / "payloads"
    configured = settings.STORAGES["broker_payloads"]
    settings.STORAGES = {
        **settings.STORAGES,
        "broker_payloads": {
            **configured,
            "OPTIONS": {**configured["OPTIONS"], "location": location},
        },
    }
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [60, 600]
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 5
    return location


def stored_files(location: Path) -> dict[str, bytes]:
    if not location.exists():
        return {}
    return {path.name: path.read_bytes() for path in location.iterdir()}


def broadcast(client: Client, body: bytes, **headers: str):
    return client.post(
        "/channel/orders/broadcast",
        body,
        content_type="application/octet-stream",
        headers={**BROADCAST_HEADERS, **headers},
    )


def large_json_document(size: int) -> bytes:
    """A JSON document of about `size` bytes (the reference verifier parses the body as JSON)."""
    items = [base64.b64encode(os.urandom(48)).decode() for _ in range(size // 68)]
    return json.dumps({"items": items}).encode()


# --- storing --------------------------------------------------------------------------------


def test_a_large_payload_is_stored_in_storage_not_in_the_row(channel, storage_dir):
    payload = os.urandom(MiB)

    message = publish(channel, payload, producer="shop", message_id="big")

    stored = Message.objects.get(public_id="big")
    assert bytes(stored.payload) == b""
    assert stored.payload_size == MiB
    assert stored.payload_file == message.payload_file
    assert stored_files(storage_dir) == {stored.payload_file: payload}
    # A random UUID: unique, and nothing in it says which message it belongs to.
    assert len(stored.payload_file) == 32
    assert int(stored.payload_file, 16)
    assert "big" not in stored.payload_file


def test_a_payload_at_the_threshold_stays_in_the_row(channel, storage_dir):
    at = publish(channel, b"a" * THRESHOLD, producer="shop", message_id="at")
    above = publish(channel, b"a" * (THRESHOLD + 1), producer="shop", message_id="above")

    assert (at.payload_file, bytes(Message.objects.get(pk=at.pk).payload)) == ("", b"a" * THRESHOLD)
    assert at.payload_size == THRESHOLD
    assert above.payload_file
    assert list(stored_files(storage_dir)) == [above.payload_file]


def test_a_broadcast_large_payload_is_stored_in_storage(client, channel, storage_dir):
    payload = os.urandom(MiB)

    response = broadcast(client, payload, **{"X-Broker-Message-ID": "big"})

    assert response.status_code == 201
    message = Message.objects.get()
    assert (bytes(message.payload), message.payload_size) == (b"", MiB)
    assert stored_files(storage_dir) == {message.payload_file: payload}


def test_offloaded_payloads_are_readable_by_the_brokers_user_alone(channel, storage_dir):
    message = publish(channel, b"a" * (THRESHOLD + 1), producer="shop")

    assert stat.S_IMODE((storage_dir / message.payload_file).stat().st_mode) == 0o600
    assert stat.S_IMODE(storage_dir.stat().st_mode) == 0o700


def test_above_the_maximum_broadcast_is_413_and_nothing_is_stored(
    client, channel, storage_dir, settings
):
    settings.BROKER_MAX_PAYLOAD_BYTES = MiB

    response = broadcast(client, os.urandom(MiB + 1))

    assert response.status_code == 413
    assert not Message.objects.exists()
    assert stored_files(storage_dir) == {}
    with pytest.raises(PayloadTooLarge):
        publish(channel, os.urandom(MiB + 1), producer="shop")
    assert stored_files(storage_dir) == {}


def test_a_refused_publish_leaves_no_file(channel, storage_dir):
    first = publish(channel, os.urandom(MiB), producer="shop", message_id="m")

    with pytest.raises(DuplicateMessage):
        publish(channel, os.urandom(MiB), producer="shop", message_id="m")
    with pytest.raises(UnknownChannel):
        publish("nope", os.urandom(MiB), producer="shop")

    assert list(stored_files(storage_dir)) == [first.payload_file]


def test_a_rolled_back_publish_leaves_an_orphan_that_the_purge_removes(channel, storage_dir):
    kept = publish(channel, os.urandom(MiB), producer="shop", message_id="kept")
    with transaction.atomic():  # the caller's transaction, which then fails
        publish(channel, os.urandom(MiB), producer="shop", message_id="rolled-back")
        transaction.set_rollback(True)
    assert not Message.objects.filter(public_id="rolled-back").exists()
    assert len(stored_files(storage_dir)) == 2
    written = timezone.now().timestamp()  # on the test's clock; the filesystem uses the real one
    for path in storage_dir.iterdir():
        os.utime(path, (written, written))

    call_command("purge_orphan_payloads")  # both files are younger than a day: both stay
    assert len(stored_files(storage_dir)) == 2
    call_command("purge_orphan_payloads", "--older-than-hours", "0")

    assert list(stored_files(storage_dir)) == [kept.payload_file]


# --- deleting -------------------------------------------------------------------------------


def test_deleting_a_message_deletes_its_file_once_committed(
    channel, storage_dir, django_capture_on_commit_callbacks
):
    message = publish(channel, os.urandom(MiB), producer="shop")
    with transaction.atomic():
        Message.objects.get().delete()
        transaction.set_rollback(True)
    assert list(stored_files(storage_dir)) == [message.payload_file]

    with django_capture_on_commit_callbacks(execute=True):
        Message.objects.get().delete()

    assert stored_files(storage_dir) == {}


def test_bulk_deletes_delete_the_files(channel, storage_dir, django_capture_on_commit_callbacks):
    for number in range(3):
        publish(channel, os.urandom(THRESHOLD + 1), producer="shop", message_id=f"m-{number}")
    publish(channel, b"small", producer="shop", message_id="small")

    with django_capture_on_commit_callbacks(execute=True):
        Message.objects.filter(public_id__in=["m-0", "m-1"]).delete()  # the admin's bulk action
    assert list(stored_files(storage_dir)) == [Message.objects.get(public_id="m-2").payload_file]

    with django_capture_on_commit_callbacks(execute=True):
        channel.delete()  # cascades to its messages

    assert stored_files(storage_dir) == {}


@pytest.mark.django_db(transaction=True)
def test_a_committed_channel_deletion_deletes_the_files(storage_dir):
    make_producer()
    channel = make_channel()
    publish(channel, os.urandom(MiB), producer="shop")

    channel.delete()

    assert stored_files(storage_dir) == {}


# --- push delivery --------------------------------------------------------------------------


def test_an_offloaded_payload_is_delivered_byte_for_byte_and_signed(channel, receiver, dispatcher):
    consumer = push_consumer(channel, receiver)
    payload = os.urandom(MiB)
    publish(channel, payload, producer="shop", message_id="big", headers={"X-Trace": "t"})
    sent = []

    run_once(dispatcher, timeout=5.0, on_sent=lambda: sent.append(True))

    [request] = receiver.received
    assert request.body == payload
    assert request.headers["Content-Length"] == str(MiB)  # streamed, yet not chunked
    assert "Transfer-Encoding" not in request.headers
    assert request.headers["X-Trace"] == "t"
    timestamp = int(request.headers["webhook-timestamp"])
    expected = sign(consumer.signing_secret, "big", timestamp, payload)
    assert request.headers["webhook-signature"] == expected
    assert sent == [True]  # the dispatcher learns that the request went on the wire
    assert Job.objects.get().status == DELIVERED


def test_an_offloaded_json_payload_verifies_with_the_reference_library(
    channel, receiver, dispatcher
):
    consumer = push_consumer(channel, receiver)
    payload = large_json_document(MiB)
    publish(channel, payload, producer="shop", content_type="application/json")
    assert Message.objects.get().payload_file

    run_once(dispatcher, timeout=5.0)

    [request] = receiver.received
    assert request.body == payload
    Webhook(consumer.signing_secret).verify(request.body, request.headers)


def test_chunked_signatures_equal_whole_payload_signatures_for_every_active_secret(channel):
    consumer = make_consumer(channel)
    now = datetime.now(UTC)
    consumer.rotate_signing_secret(now)  # two secrets sign during the overlap
    payload = os.urandom(200_000)
    chunks = [payload[i : i + 65536] for i in range(0, len(payload), 65536)]

    chunked = chunked_signature_headers(consumer, "m-1", chunks, now)

    assert chunked == signature_headers(consumer, "m-1", payload, now)
    assert len(chunked["webhook-signature"].split()) == 2


def test_a_missing_file_makes_the_job_dead_without_a_request(
    channel, receiver, dispatcher, storage_dir, settings
):
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 1
    consumer = push_consumer(channel, receiver)
    message = publish(channel, os.urandom(MiB), producer="shop")
    (storage_dir / message.payload_file).unlink()
    sent = []

    run_once(dispatcher, timeout=5.0, on_sent=lambda: sent.append(True))

    assert receiver.received == []
    assert sent == []  # never on the wire: a shutdown would have released it
    job = Job.objects.get()
    assert job.status == DEAD
    assert job.last_error.startswith("payload-missing")
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.error_class, attempt.status_code) == ("payload-missing", None)
    consumer.refresh_from_db()  # the consumer did nothing wrong: its circuit stays closed
    assert (consumer.circuit_failures, consumer.circuit_open_until) == (0, None)


def test_a_storage_error_is_retried_and_not_held_against_the_consumer(
    channel, receiver, dispatcher, settings, monkeypatch
):
    settings.BROKER_CIRCUIT_FAILURE_THRESHOLD = 1
    consumer = push_consumer(channel, receiver)
    publish(channel, os.urandom(MiB), producer="shop")

    def broken_storage(name):
        raise OSError("storage unreachable")

    monkeypatch.setattr(payloads, "open_payload", broken_storage)
    run_once(dispatcher, timeout=5.0)

    assert receiver.received == []
    job = Job.objects.get()
    assert (job.status, job.attempts) == (QUEUED, 1)
    assert "storage unreachable" in job.last_error
    assert DeliveryAttempt.objects.get().error_class == "storage-error"
    consumer.refresh_from_db()
    assert (consumer.circuit_failures, consumer.circuit_open_until) == (0, None)


def test_inline_and_offloaded_payloads_in_one_claim(channel, receiver, dispatcher):
    push_consumer(channel, receiver)
    small, large = b"small", os.urandom(THRESHOLD + 1)
    publish(channel, small, producer="shop", message_id="small")
    publish(channel, large, producer="shop", message_id="large")

    run_once(dispatcher, timeout=5.0)

    bodies = {r.headers["X-Broker-Message-ID"]: r.body for r in receiver.received}
    assert bodies == {"small": small, "large": large}
    assert set(Job.objects.values_list("status", flat=True)) == {DELIVERED}


# --- pull consumers and reads ---------------------------------------------------------------


def claim(client: Client):
    return client.post(
        "/channel/orders/consumer/worker/claim",
        {"limit": 5},
        content_type="application/json",
        headers=PULL_HEADERS,
    )


def pulled_payload(entry):
    message = entry["Message"]
    assert message["PayloadEncoding"] == "base64"
    return base64.b64decode(message["Payload"])


def test_a_pull_consumer_gets_an_offloaded_payload_byte_for_byte(client, channel):
    make_consumer_with_token(channel)
    payload = os.urandom(MiB)
    publish(channel, payload, producer="shop")

    listed = client.get("/channel/orders/consumer/worker/queued-jobs", headers=PULL_HEADERS)
    claimed = claim(client)

    assert pulled_payload(listed.json()["Result"][0]) == payload
    [entry] = claimed.json()["Result"]
    assert pulled_payload(entry) == payload
    assert Job.objects.get().status == INFLIGHT


def test_a_pull_claim_makes_jobs_with_a_missing_file_dead(client, channel, storage_dir):
    make_consumer_with_token(channel)
    lost = publish(channel, os.urandom(MiB), producer="shop", message_id="lost")
    publish(channel, b"fine", producer="shop", message_id="fine")
    (storage_dir / lost.payload_file).unlink()

    listed = client.get("/channel/orders/consumer/worker/queued-jobs", headers=PULL_HEADERS)
    claimed = claim(client)

    assert listed.status_code == 200
    entries = {e["Message"]["MessageID"]: e["Message"] for e in listed.json()["Result"]}
    assert entries["lost"]["Payload"] is None
    assert entries["lost"]["PayloadEncoding"] is None
    assert entries["lost"]["PayloadError"] == "payload-missing"
    assert "PayloadError" not in entries["fine"]
    assert [e["Message"]["MessageID"] for e in claimed.json()["Result"]] == ["fine"]
    job = Job.objects.get(message=lost)
    assert job.status == DEAD
    assert job.last_error.startswith("payload-missing")


def test_message_get_reads_an_offloaded_payload_and_reports_a_missing_one(
    admin_client, channel, storage_dir
):
    payload = large_json_document(THRESHOLD * 2)
    message = publish(channel, payload, producer="shop", message_id="big")

    found = admin_client.get("/channel/orders/message/big").json()
    (storage_dir / message.payload_file).unlink()
    missing = admin_client.get("/channel/orders/message/big")

    assert (found["Payload"].encode(), found["PayloadEncoding"]) == (payload, "utf-8")
    assert "PayloadError" not in found
    assert missing.status_code == 200
    body = missing.json()
    assert (body["Payload"], body["PayloadEncoding"], body["PayloadError"]) == (
        None,
        None,
        "payload-missing",
    )
    assert body["ID"] == "big"


# --- configuration --------------------------------------------------------------------------


def test_a_payload_storage_missing_from_storages_is_a_system_error(settings):
    assert check_payload_storage(None) == []

    settings.BROKER_PAYLOAD_STORAGE = "nowhere"

    [error] = check_payload_storage(None)
    assert error.id == "broker.E002"


def test_another_storage_can_hold_the_payloads(channel, settings, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    settings.STORAGES = {
        **settings.STORAGES,
        "s3_like": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": elsewhere},
        },
    }
    settings.BROKER_PAYLOAD_STORAGE = "s3_like"

    message = publish(channel, os.urandom(MiB), producer="shop")

    assert list(stored_files(elsewhere)) == [message.payload_file]
    assert Message.objects.get().read_payload() == (elsewhere / message.payload_file).read_bytes()


def test_the_purge_keeps_files_that_messages_name(channel, storage_dir):
    message = publish(channel, os.urandom(MiB), producer="shop")

    assert Message.purge_orphan_payloads(timedelta(0)) == 0
    assert list(stored_files(storage_dir)) == [message.payload_file]
