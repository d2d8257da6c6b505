"""Disk full for offloaded payloads (issue 9): a broadcast whose payload cannot be stored is
refused with a clear error and leaves nothing behind; small payloads (kept in the row) still work.

The payload directory is a real 256 KiB tmpfs, mounted by the test (it needs root, as the CI and
this machine have; elsewhere the test is skipped).
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from broker.models import Message
from tests.faults import report
from tests.helpers import make_channel, make_consumer, make_producer

pytestmark = pytest.mark.django_db

OFFLOAD_BYTES = 1024


@pytest.fixture
def full_payload_dir() -> Iterator[Path]:
    """A tmpfs of 256 KiB, already filled up to its last byte."""
    mount_point = Path(tempfile.mkdtemp(prefix="broker-full-disk-"))
    mounted = subprocess.run(
        ["/usr/bin/mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount_point)],
        capture_output=True,
    )
    if mounted.returncode != 0:
        mount_point.rmdir()
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        with open(mount_point / "filler", "wb", buffering=0) as filler:
            try:
                while filler.write(b"\0" * 4096):
                    pass
            except OSError:
                pass  # ENOSPC: full
        yield mount_point
    finally:
        subprocess.run(["/usr/bin/umount", str(mount_point)], check=True)
        mount_point.rmdir()


@pytest.fixture
def broadcast(client, settings, full_payload_dir):
    settings.BROKER_PAYLOAD_OFFLOAD_BYTES = OFFLOAD_BYTES
    settings.STORAGES = {
        **settings.STORAGES,
        "broker_payloads": {
            "BACKEND": "django.core.files.storage.FileSystemStorage",
            "OPTIONS": {"location": str(full_payload_dir)},
        },
    }
    make_producer(token="producer-token")
    make_consumer(make_channel(token="channel-token"))

    def send(body: bytes, message_id: str):
        return client.post(
            "/channel/orders/broadcast",
            body,
            content_type="application/json",
            HTTP_X_BROKER_CHANNEL_TOKEN="channel-token",
            HTTP_X_BROKER_PRODUCER_ID="shop",
            HTTP_X_BROKER_PRODUCER_TOKEN="producer-token",
            HTTP_X_BROKER_MESSAGE_ID=message_id,
        )

    return send


def test_a_payload_that_cannot_be_stored_is_refused_and_leaves_nothing(broadcast, full_payload_dir):
    files_before = sorted(os.listdir(full_payload_dir))

    refused = broadcast(b'"' + b"x" * (OFFLOAD_BYTES * 8) + b'"', "too-big-for-the-disk")

    assert refused.status_code == 507
    assert refused["Content-Type"] == "application/json"
    assert "storage" in refused.json()["Error"]
    assert not Message.objects.exists()
    assert sorted(os.listdir(full_payload_dir)) == files_before  # no partial file left

    small = broadcast(b'{"fits": "in the row"}', "small")
    assert small.status_code == 201
    report(
        "disk full for offloaded payloads",
        large_broadcast=refused.status_code,
        small_broadcast=small.status_code,
        messages_stored=Message.objects.count(),
    )
