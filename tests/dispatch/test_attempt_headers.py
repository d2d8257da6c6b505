"""What an attempt keeps of its headers (docs/delivery.md, "Attempts"): those its request was sent
with and those of the final answer, from libcurl against real receivers on loopback,
recorded by the queue; every secret masked before anything holds it, and
bounded."""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.utils import timezone

from broker import publish
from jobs.curl_delivery import header_fields
from jobs.delivery import (
    KEPT_HEADER_CHARS,
    KEPT_HEADERS_CHARS,
    MAX_KEPT_HEADERS,
    AttemptResult,
    DeliveryRequest,
    kept_headers,
    open_sender,
)
from jobs.header_masking import MASK, masked_headers
from jobs.models import DeliveryAttempt
from tests.delivery import push_consumer, run_once
from tests.receiver import Reply

MASKED = f"{MASK} (masked)"
URL_SECRET = "url-s3cret"  # in the callback URL: sent as Authorization, never stored
RECEIVER_COOKIE = "session=receiver-cookie-value"
PRODUCER_KEY = "producer-api-key-value"


@pytest.fixture(autouse=True)
def one_retry(settings):
    settings.BROKER_RETRY_JITTER = 0
    settings.BROKER_RETRY_DELAYS = [60]
    settings.BROKER_DELIVERY_TIMEOUT_SECONDS = 2


# --- recorded by the dispatcher, through the queue ---------------------------------------------


@pytest.mark.django_db
@pytest.mark.parametrize("status", [503, 404], ids=["unavailable", "refused"])
def test_a_failed_attempt_keeps_the_headers_sent_and_received_with_secrets_masked(
    channel, receiver, dispatcher, status
):
    consumer = push_consumer(channel, receiver)
    consumer.callback_url = receiver.url().replace("://", f"://alice:{URL_SECRET}@")
    consumer.save()
    consumer.rotate_signing_secret(timezone.now())  # two signatures while the old one overlaps
    receiver.replies["/hook"] = Reply(
        status,
        {"X-Receiver": "hook-7", "Set-Cookie": RECEIVER_COOKIE, "WWW-Authenticate": "Bearer x=1"},
        b"answer",
    )
    publish(channel, b"{}", producer="shop", message_id="m-1", headers={"X-Api-Key": PRODUCER_KEY})

    run_once(dispatcher)

    attempt = DeliveryAttempt.objects.get()
    [received] = receiver.received
    sent = dict(attempt.request_headers)
    assert sent["webhook-signature"] == f"v1,{MASK} v1,{MASK} (masked)"
    assert sent["X-Broker-Consumer-Token"] == MASKED
    assert sent["X-Api-Key"] == MASKED
    # Every other header is what the receiver got, in the order the broker set them.
    assert [name for name, _ in attempt.request_headers][:2] == [
        "Content-Type",
        "X-Broker-Message-ID",
    ]
    for name, value in attempt.request_headers:
        assert "(masked)" in value or received.headers[name] == value
    assert sent["X-Request-ID"] == received.headers["X-Request-ID"]
    answer = dict(attempt.response_headers)
    assert answer["X-Receiver"] == "hook-7"
    assert answer["Set-Cookie"] == MASKED
    assert answer["WWW-Authenticate"] == f"Bearer {MASKED}"
    assert answer["Content-Length"] == "6"
    assert_no_secret_in(stored_row_text(), secrets_of(consumer, received))


@pytest.mark.django_db
def test_a_delivered_attempt_keeps_no_headers(channel, receiver, dispatcher):
    """What an operator reads to find out why is a failure's; a 2xx's would cost every delivery."""
    push_consumer(channel, receiver)
    receiver.replies["/hook"] = Reply(200, {"X-Receiver": "hook-7"})
    publish(channel, b"{}", producer="shop", message_id="m-1")

    [result] = run_once(dispatcher)

    assert result.succeeded
    assert (result.request_headers, result.response_headers) == ((), ())
    attempt = DeliveryAttempt.objects.get()
    assert (attempt.request_headers, attempt.response_headers) == ([], [])


def test_an_attempt_without_an_answer_keeps_the_request_headers_alone(
    db, channel, receiver, dispatcher
):
    consumer = push_consumer(channel, receiver)
    consumer.callback_url = f"http://127.0.0.1:{closed_port()}/hook"
    consumer.save()
    publish(channel, b"{}", producer="shop", message_id="m-1")

    [result] = run_once(dispatcher)

    attempt = DeliveryAttempt.objects.get()
    assert (attempt.status_code, attempt.error_class) == (None, "connection")
    assert attempt.response_headers == []
    sent = dict(attempt.request_headers)
    assert (sent["webhook-id"], sent["webhook-signature"]) == ("m-1", f"v1,{MASK} (masked)")
    assert result.request_headers == tuple(map(tuple, attempt.request_headers))
    assert consumer.signing_secret not in stored_row_text()


def stored_row_text() -> str:
    """Every column of every attempt row, as the database holds it."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT * FROM jobs_deliveryattempt")
        return repr(cursor.fetchall())


def secrets_of(consumer, received) -> list[str]:
    """What must never be stored: the consumer's signing secrets and token, the signatures and
    credentials sent, the secrets of the producer's metadata and of the receiver's answer."""
    signatures = received.headers["webhook-signature"].split()
    secrets = [
        consumer.signing_secret,
        consumer.previous_signing_secret,
        consumer.signing_secret.removeprefix("whsec_"),
        consumer.token,
        *signatures,
        *(signature.removeprefix("v1,") for signature in signatures),
        URL_SECRET,
        base64.b64encode(f"alice:{URL_SECRET}".encode()).decode(),
        PRODUCER_KEY,
        RECEIVER_COOKIE,
    ]
    return [secret for secret in secrets if secret]  # no previous secret unless rotated


def assert_no_secret_in(text: str, secrets: list[str]) -> None:
    found = [secret for secret in secrets if secret in text]
    assert not found, found


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


# --- what libcurl reads of an answer ---------------------------------------------------------


HEADERS = {"Content-Type": "application/json", "webhook-signature": "v1,c2lnbmF0dXJl"}
NO_JOB = datetime(2026, 1, 1, tzinfo=UTC)  # the request's time partition: it is of no job


def send(url: str) -> AttemptResult:
    async def run() -> AttemptResult:
        async with open_sender(1) as sender:
            return await sender(DeliveryRequest(1, NO_JOB, 1, 7, url, HEADERS, b"{}"), 5, None)

    return asyncio.run(run())


def test_only_the_final_answer_headers_are_kept():
    """Interim answers (100 Continue, 103 Early Hints) before it and a chunked body's trailers
    after it have header lines too: libcurl hands them all to its header callback."""
    server = RawServer(
        b"HTTP/1.1 100 Continue\r\nX-Interim: 100\r\n\r\n"
        b"HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\n"
        b"HTTP/1.1 503 Service Unavailable\r\nX-Final: yes\r\nRetry-After: 30\r\n"
        b"Transfer-Encoding: chunked\r\nTrailer: X-Trailer\r\n\r\n"
        b"4\r\nbusy\r\n0\r\nX-Trailer: late\r\n\r\n"
    )
    try:
        result = send(server.url)
    finally:
        server.close()

    assert (result.status_code, result.response_excerpt, result.retry_after) == (503, "busy", 30)
    assert result.response_headers == (
        ("X-Final", "yes"),
        ("Retry-After", "30"),
        ("Transfer-Encoding", "chunked"),
        ("Trailer", "X-Trailer"),
    )


def test_a_flood_of_answer_headers_is_kept_within_its_bound(receiver):
    flood = {f"X-Flood-{n:03}": "f" * 60 for n in range(80)}
    receiver.replies["/hook"] = Reply(500, {"X-Huge": "h" * 5000, **flood})

    result = send(receiver.url())

    assert result.status_code == 500
    kept = dict(result.response_headers)
    assert kept["X-Huge"] == "h" * (KEPT_HEADER_CHARS - 1) + "…"
    assert len(result.response_headers) <= MAX_KEPT_HEADERS
    assert sum(len(name) + len(value) for name, value in result.response_headers) <= (
        KEPT_HEADERS_CHARS
    )
    assert "X-Flood-000" in kept


class RawServer:
    """One connection on loopback, answered with the given bytes after the request is read."""

    def __init__(self, answer: bytes) -> None:
        self.answer = answer
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/hook"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        connection, _ = self.listener.accept()
        with connection, connection.makefile("rb") as stream:
            length = 0
            while (line := stream.readline()) not in (b"\r\n", b""):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            stream.read(length)
            connection.sendall(self.answer)

    def close(self) -> None:
        self.listener.close()


def test_header_fields_reads_the_last_block_and_unfolds_lines():
    lines = [
        b"HTTP/1.1 103 Early Hints\r\n",
        b"Link: </a.css>\r\n",
        b"\r\n",
        b"HTTP/1.1 200 OK\r\n",
        b"X-Long: one\r\n",
        b"\ttwo\r\n",
        b"X-Empty:\r\n",
        b"\r\n",
        b"X-Trailer: late\r\n",
        b"\r\n",
    ]

    assert header_fields(lines) == [(b"X-Long", b"one two"), (b"X-Empty", b"")]


# --- the masking rule and the bound, on their own --------------------------------------------


@pytest.mark.parametrize(
    ("name", "value", "kept"),
    [
        ("webhook-signature", "v1,abc= v1,def=", f"v1,{MASK} v1,{MASK} (masked)"),
        ("webhook-signature", "v1a,abc=", f"v1a,{MASK} (masked)"),
        ("X-Hub-Signature-256", "sha256=abc", MASKED),
        ("Authorization", "Bearer abc.def", f"Bearer {MASK} (masked)"),
        ("authorization", "Basic YWxpY2U6cHc=", f"Basic {MASK} (masked)"),
        ("Authorization", "sk_live_abc def", MASKED),  # not a known scheme: all of it
        ("Authorization", "Bearer", MASKED),
        ("Proxy-Authorization", "Digest x", f"Digest {MASK} (masked)"),
        ("Cookie", "a=b", MASKED),
        ("Set-Cookie", "id=1; HttpOnly", MASKED),
        ("X-Broker-Consumer-Token", "t0ken", MASKED),
        ("X-API-KEY", "k", MASKED),
        ("X-Client-Secret", "s", MASKED),
        ("X-Session-Id", "s", MASKED),
        ("X-Credentials", "c", MASKED),
        ("X-Password", "p", MASKED),
        ("X-Auth", "a", MASKED),
        ("X-Api-Key", "", ""),  # an empty value tells nothing
        ("webhook-id", "msg_1", "msg_1"),
        ("webhook-timestamp", "1764000000", "1764000000"),
        ("Content-Type", "application/json", "application/json"),
        ("X-Broker-Consumer-ID", "billing", "billing"),
    ],
)
def test_secret_values_are_masked_by_their_header_name(name, value, kept):
    assert list(masked_headers([(name, value)])) == [(name, kept)]


def test_a_renamed_consumer_token_header_is_masked_too(settings):
    settings.BROKER_CONSUMER_TOKEN_HEADER = "X-Consumer-Pass"

    assert list(masked_headers([("x-consumer-pass", "t0ken")])) == [("x-consumer-pass", MASKED)]


def test_kept_headers_are_bounded_masked_and_storable():
    headers = [("X-Nul", "a\x00b"), ("Authorization", "Bearer " + "s" * 5000)]
    headers += [(f"X-{n:02}", "v" * 1500) for n in range(60)]

    kept = kept_headers(headers)

    assert kept[:2] == (("X-Nul", "a\ufffdb"), ("Authorization", f"Bearer {MASK} (masked)"))
    assert kept[2] == ("X-00", "v" * (KEPT_HEADER_CHARS - 1) + "…")
    assert sum(len(name) + len(value) for name, value in kept) == KEPT_HEADERS_CHARS
    assert kept[-1][1].endswith("…")
    assert len(kept_headers((f"X-{n}", "v") for n in range(60))) == MAX_KEPT_HEADERS


@pytest.mark.django_db
def test_a_nul_in_a_header_never_keeps_an_attempt_from_being_recorded(
    channel, receiver, dispatcher
):
    """PostgreSQL's jsonb refuses \\u0000: a receiver's or a restored message's NUL is replaced."""
    push_consumer(channel, receiver)
    publish(channel, b"{}", producer="shop")
    [request] = dispatcher.claim(10)
    result = AttemptResult(
        request.job_id,
        request.partition_at,
        request.attempt,
        request.consumer_id,
        timezone.now() - timedelta(seconds=1),
        1.0,
        status_code=500,
        error_class="http-status",
        error="HTTP 500",
        request_headers=kept_headers([("X-A", "a\x00")]),
        response_headers=kept_headers([("X-B\x00", "b")]),
    )

    dispatcher.complete([result])

    attempt = DeliveryAttempt.objects.get()
    assert (attempt.request_headers, attempt.response_headers) == (
        [["X-A", "a\ufffd"]],
        [["X-B\ufffd", "b"]],
    )
