"""The sender of deliveries (jobs/delivery.py's `open_sender`, over libcurl) against real
receivers on loopback: its results and its guarantees (address guard at connect time, no
redirects, timeout, bounded read, keep-alive, no credentials carried from one request to the
next, HTTPS verified, streamed offloaded payloads, the "headers were sent" signal)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from datetime import UTC, datetime

import pytest
import trustme

from broker import payloads
from jobs.curl_multi import EXCERPT_BYTES
from jobs.delivery import (
    AttemptResult,
    DeliveryRequest,
    StoredBody,
    open_sender,
)
from tests.receiver import Receiver, Reply

HEADERS = {
    "Content-Type": "application/json",
    "webhook-id": "msg_1",
    "webhook-timestamp": "1764000000",
    "webhook-signature": "v1,c2lnbmF0dXJl",
    "X-Broker-Metadata-Headers": "",  # always sent, empty when the message has none
}
# The time partition the requests here name: they are of no job, their results never recorded.
NO_JOB = datetime(2026, 1, 1, tzinfo=UTC)


def send(
    *urls: str,
    timeout: float = 5,
    on_sent: Callable[[], None] | None = None,
    stored: StoredBody | None = None,
) -> list[AttemptResult]:
    """Deliver to each of `urls` one after the other through one sender."""

    async def run() -> list[AttemptResult]:
        async with open_sender(4) as sender:
            results = []
            for job_id, url in enumerate(urls, start=1):
                body = b"" if stored else b'{"order": 42}'
                request = DeliveryRequest(job_id, NO_JOB, 1, 7, url, HEADERS, body, stored)
                results.append(await sender(request, timeout, on_sent))
            return results

    return asyncio.run(run())


def test_a_webhook_arrives_with_its_headers_and_body(receiver):
    sent = []
    [result] = send(receiver.url(), on_sent=lambda: sent.append(True))
    assert result.succeeded
    assert result.status_code == 200
    assert result.response_excerpt == "ok"
    assert (result.job_id, result.attempt, result.consumer_id) == (1, 1, 7)
    [received] = receiver.received
    assert received.body == b'{"order": 42}'
    for name, value in HEADERS.items():
        assert received.headers[name] == value
    assert received.headers["Accept-Encoding"] == "identity"
    assert "Expect" not in received.headers
    assert "Authorization" not in received.headers
    assert sent == [True]


def test_an_answer_other_than_2xx_is_a_failure_with_its_retry_after(receiver):
    receiver.replies["/hook"] = Reply(503, {"Retry-After": "30"}, b"busy")
    [result] = send(receiver.url())
    assert (result.status_code, result.error_class) == (503, "http-status")
    assert result.error == "HTTP 503"
    assert result.retry_after == 30.0
    assert result.response_excerpt == "busy"


def test_redirects_are_answers_and_never_followed(receiver):
    receiver.replies["/hook"] = Reply(302, {"Location": receiver.url("/elsewhere")}, b"")
    [result] = send(receiver.url())
    assert (result.status_code, result.error_class) == (302, "http-status")
    assert receiver.paths() == ["/hook"]


def test_an_answer_slower_than_the_timeout_is_a_timeout(receiver):
    receiver.replies["/hook"] = Reply(delay=3)
    [result] = send(receiver.url(), timeout=0.5)
    assert (result.status_code, result.error_class) == (None, "timeout")
    assert result.error == "no answer within 0.5 s"


def test_only_an_excerpt_of_a_huge_answer_is_read(receiver):
    receiver.replies["/hook"] = Reply(body=b"x" * (8 * 1024 * 1024))
    [result] = send(receiver.url())
    assert result.succeeded
    assert len(result.response_excerpt) == EXCERPT_BYTES


def test_a_non_public_literal_is_refused_before_anything_is_sent(settings, receiver):
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False
    sent = []
    [result] = send(f"http://2130706433:{receiver.port}/hook", on_sent=lambda: sent.append(1))
    assert result.error_class == "unsafe-callback"
    assert "127.0.0.1" in result.error
    assert receiver.received == []
    assert sent == []


def test_a_name_is_judged_by_the_address_it_connects_to(settings, receiver):
    """This machine's own name is no local-only name, so only the connect-time guard (libcurl's
    open-socket callback, on the address libcurl resolved) can refuse it."""
    host = socket.gethostname()
    try:
        addresses = {str(info[4][0]) for info in socket.getaddrinfo(host, receiver.port)}
    except OSError:
        pytest.skip("this machine's name does not resolve")
    settings.BROKER_ALLOW_PRIVATE_CALLBACKS = False
    sent = []
    [result] = send(f"http://{host}:{receiver.port}/hook", on_sent=lambda: sent.append(1))
    assert result.error_class == "unsafe-callback", (addresses, result.error)
    assert any(address in result.error for address in addresses)
    assert receiver.received == []
    assert sent == []


class CountingServer:
    """A keep-alive HTTP/1.1 server on loopback that counts the connections it accepted."""

    def __init__(self) -> None:
        self.connections = 0
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._serve, args=(connection,), daemon=True).start()

    def _serve(self, connection: socket.socket) -> None:
        with connection, connection.makefile("rb") as stream:
            while head := _read_head(stream):
                length = int(head.get("content-length", "0"))
                stream.read(length)
                connection.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")

    def close(self) -> None:
        self.listener.close()


def _read_head(stream) -> dict[str, str]:
    headers: dict[str, str] = {}
    if not stream.readline():
        return headers
    while (line := stream.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return headers


def test_connections_are_kept_alive():
    server = CountingServer()
    try:
        results = send(*[f"http://127.0.0.1:{server.port}/hook"] * 5)
    finally:
        server.close()
    assert all(result.succeeded for result in results)
    assert server.connections == 1


def test_an_offloaded_payload_is_streamed_signed_and_with_its_length(settings, tmp_path, receiver):
    settings.STORAGES = {
        **settings.STORAGES,
        "broker_payloads": {
            **settings.STORAGES["broker_payloads"],
            "OPTIONS": {
                **settings.STORAGES["broker_payloads"]["OPTIONS"],
                "location": tmp_path / "payloads",
            },
        },
    }
    payload = bytes(range(256)) * 3600  # 900 KiB: four chunks, under the receiver's 1 MiB
    name = payloads.store(payload)

    def sign(chunks: Iterable[bytes], now: datetime) -> dict[str, str]:
        digest = hashlib.sha256()
        for chunk in chunks:
            digest.update(chunk)
        return {"webhook-signature": f"v1,{digest.hexdigest()}"}

    sent = []
    [result] = send(receiver.url(), stored=StoredBody(name, sign), on_sent=lambda: sent.append(1))
    assert result.succeeded, result.error
    [received] = receiver.received
    assert received.body == payload
    assert received.headers["Content-Length"] == str(len(payload))
    assert "Transfer-Encoding" not in received.headers
    assert received.headers["webhook-signature"] == f"v1,{hashlib.sha256(payload).hexdigest()}"
    assert sent == [1]


def test_the_sent_signal_tells_a_cut_off_request_from_one_never_sent(receiver):
    receiver.replies["/hook"] = Reply(delay=3)  # cut off long before it answers
    cut_off: list[int] = []
    refused: list[int] = []

    async def run() -> AttemptResult:
        async with open_sender(4) as sender:
            request = DeliveryRequest(1, NO_JOB, 1, 7, receiver.url(), HEADERS, b"{}")
            task = asyncio.create_task(sender(request, 30, lambda: cut_off.append(1)))
            while not receiver.received:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            closed = DeliveryRequest(
                2, NO_JOB, 1, 7, f"http://127.0.0.1:{_closed_port()}/", HEADERS, b""
            )
            return await sender(closed, 5, lambda: refused.append(1))

    result = asyncio.run(run())
    assert cut_off == [1]
    assert (result.error_class, refused) == ("connection", [])


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_credentials_of_a_callback_url_go_with_its_requests_alone(receiver):
    """Two consumers on one host, one connection: only the one whose URL holds credentials
    sends them."""

    def url(path: str, userinfo: str = "") -> str:
        return str(receiver.url(path)).replace("://", f"://{userinfo}")

    send(url("/a", "alice:s3cret@"), url("/b"), url("/c", "alice:s3cret@"))
    authorization = [request.headers.get("Authorization") for request in receiver.received]
    assert authorization[0] == authorization[2] is not None
    assert authorization[1] is None


@pytest.fixture(scope="module")
def authority() -> trustme.CA:
    return trustme.CA()


def tls_receiver(authority: trustme.CA, *names: str) -> Receiver:
    """An HTTPS receiver on loopback whose certificate `authority` issued for `names`."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert(*names).configure_cert(context)
    return Receiver(tls=context).start()


def test_https_is_delivered_when_its_certificate_is_trusted(authority, monkeypatch):
    """The authorities trusted are Python's ssl module's, SSL_CERT_FILE included."""
    with authority.cert_pem.tempfile() as ca_file:
        monkeypatch.setenv("SSL_CERT_FILE", ca_file)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        receiver = tls_receiver(authority, "127.0.0.1")
        try:
            [result] = send(receiver.url())
        finally:
            receiver.stop()
    assert result.succeeded, result.error
    assert [request.body for request in receiver.received] == [b'{"order": 42}']


@pytest.mark.parametrize("names", [("127.0.0.1",), ("hooks.example.com",)], ids=["ca", "name"])
def test_https_with_an_untrusted_certificate_sends_nothing(authority, names):
    """An authority nobody trusts; or a trusted-looking certificate for another name (its
    authority is equally unknown here)."""
    receiver = tls_receiver(authority, *names)
    sent: list[int] = []
    try:
        [result] = send(receiver.url(), on_sent=lambda: sent.append(1))
    finally:
        receiver.stop()
    assert (result.status_code, result.error_class) == (None, "connection")
    assert "certificate" in result.error.lower() or "ssl" in result.error.lower(), result.error
    assert receiver.received == []
    assert sent == []


def test_a_header_value_beyond_ascii_goes_out_in_utf8(receiver):
    """A kept metadata header may hold any text: it is sent as UTF-8."""

    async def run() -> AttemptResult:
        async with open_sender(1) as sender:
            headers = {**HEADERS, "X-Note": "café ¿"}
            return await sender(
                DeliveryRequest(1, NO_JOB, 1, 7, receiver.url(), headers, b"{}"), 5, None
            )

    assert asyncio.run(run()).succeeded
    assert receiver.received[0].headers["X-Note"] == "café ¿"
