"""The libcurl prototype sender (jobs/curl_delivery.py, issue 18) against real receivers on
loopback: the same results as jobs/delivery.py's `deliver` for the same requests, and the same
guarantees (address guard at connect time, no redirects, timeout, bounded read, keep-alive,
streamed offloaded payloads, the "headers were sent" signal)."""

from __future__ import annotations

import asyncio
import hashlib
import socket
import threading
from collections.abc import Callable, Iterable
from datetime import datetime

import pytest

from broker import payloads
from jobs import curl_delivery
from jobs.delivery import RESPONSE_EXCERPT_BYTES, AttemptResult, DeliveryRequest, StoredBody
from tests.receiver import Reply

HEADERS = {
    "Content-Type": "application/json",
    "webhook-id": "msg_1",
    "webhook-timestamp": "1764000000",
    "webhook-signature": "v1,c2lnbmF0dXJl",
    "X-Broker-Metadata-Headers": "",  # always sent, empty when the message has none
}


def send(
    url: str,
    *,
    timeout: float = 5,
    on_sent: Callable[[], None] | None = None,
    stored: StoredBody | None = None,
    requests: int = 1,
) -> list[AttemptResult]:
    """Deliver `requests` requests one after the other through one session."""

    async def run() -> list[AttemptResult]:
        session = curl_delivery.curl_session(4, timeout)
        try:
            results = []
            for job_id in range(1, requests + 1):
                body = b"" if stored else b'{"order": 42}'
                request = DeliveryRequest(job_id, 1, 7, url, HEADERS, body, stored)
                results.append(await curl_delivery.deliver(session, request, timeout, on_sent))
            return results
        finally:
            session.close()

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
    assert len(result.response_excerpt) == RESPONSE_EXCERPT_BYTES


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
        results = send(f"http://127.0.0.1:{server.port}/hook", requests=5)
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
    receiver.replies["/hook"] = Reply(delay=10)
    cut_off: list[int] = []
    refused: list[int] = []

    async def run() -> AttemptResult:
        session = curl_delivery.curl_session(4, 30)
        try:
            request = DeliveryRequest(1, 1, 7, receiver.url(), HEADERS, b"{}")
            task = asyncio.create_task(
                curl_delivery.deliver(session, request, 30, lambda: cut_off.append(1))
            )
            while not receiver.received:
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            closed = DeliveryRequest(2, 1, 7, f"http://127.0.0.1:{_closed_port()}/", HEADERS, b"")
            return await curl_delivery.deliver(session, closed, 5, lambda: refused.append(1))
        finally:
            session.close()

    result = asyncio.run(run())
    assert cut_off == [1]
    assert (result.error_class, refused) == ("connection", [])


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
