"""What gunicorn, the production server, refuses by itself before Django sees a request (header
and request line limits, malformed HTTP): answered in the API's error shape, `{"Error": …}` as
JSON, like every other error (broker/gunicorn_conf.py, docs/api.md "Errors"). The test client
has no such limits, so these run against the web server as `manage.py runbroker` starts it."""

from __future__ import annotations

import json

import pytest

from tests.api_server import Answer, running_documented_api
from tests.conftest import ADMIN_TOKEN
from tests.db_snapshot import snapshot
from tests.helpers import BROADCAST_HEADERS, make_channel, make_producer

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
HEADERS_TOO_LARGE = (
    "The request's header fields are too large: at most 100 fields of at most 8,190 bytes each,"
    " name and value included."
)
LINE_TOO_LONG = (
    "The request line (method, path with query string, HTTP version) is too long:"
    " at most 4,094 bytes."
)


def error_of(answer: Answer) -> str:
    assert answer.headers["Content-Type"] == "application/json", answer.body[:200]
    assert answer.headers["Connection"] == "close"
    return str(json.loads(answer.body)["Error"])


@pytest.mark.django_db(transaction=True)
def test_gunicorn_refuses_oversized_headers_and_request_lines_in_json_and_keeps_serving():
    make_channel()
    make_producer()
    before = snapshot()
    with running_documented_api(1, BROKER_ADMIN_TOKENS=ADMIN_TOKEN) as server:
        oversized = [
            ("GET", "/producers", {**ADMIN, "X-Big": "x" * 16_384}, 431, HEADERS_TOO_LARGE),
            (
                "POST",
                "/channel/orders/broadcast",
                {**BROADCAST_HEADERS, "X-Broker-Channel-Token": "x" * 100_000},
                431,
                HEADERS_TOO_LARGE,
            ),
            (
                "GET",
                "/producers",
                {**ADMIN, **{f"X-H{n}": "v" for n in range(150)}},
                431,
                HEADERS_TOO_LARGE,
            ),
            ("GET", "/channel/" + "x" * 5000, ADMIN, 414, LINE_TOO_LONG),
        ]
        for method, path, headers, status, error in oversized:
            answer = server.request(method, path, b"x" if method == "POST" else None, headers)
            assert answer.status == status, (path[:40], answer.status, answer.body[:200])
            assert error_of(answer) == error
        assert server.request("GET", "/producers", headers=ADMIN).status == 200
        assert server.process.poll() is None
        output = server.output()
    assert "Traceback" not in output
    assert snapshot() == before


@pytest.mark.django_db(transaction=True)
def test_malformed_http_is_refused_in_json_quoting_what_was_wrong():
    with running_documented_api(1) as server:
        answer = server.send_raw(b"GET /_status HTTP/1.1\r\nHost: 127.0.0.1\r\nBad Name: x\r\n\r\n")
        assert answer.status == 400
        assert error_of(answer) == "Bad Request: Invalid HTTP header name: 'Bad Name'"
        assert server.send_raw(b"GET /_status HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").status == 200
