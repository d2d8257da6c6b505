"""A broker served under a path prefix: its `Pages` links already hold the prefix.

The broker writes a `next` link as the request's whole path (broker/api/pagination.py: Django's
`request.path`, the prefix included), so the client resolves it against the origin of its base
URL. Served here by a small stand-in on 127.0.0.1 that answers only under `/broker`, as a
reverse proxy mounting the broker there would.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from webhook_broker_client import Admin
from webhook_broker_client._http import HttpClient

PAGES = {
    "/broker/channels": {
        "Result": ["/broker/channel/a"],
        "Pages": {"next": "/broker/channels?n=2"},
    },
    "/broker/channels?n=2": {
        "Result": ["/broker/channel/b"],
        "Pages": {"next": "/broker/channels?n=3"},
    },
    "/broker/channels?n=3": {"Result": [], "Pages": {}},
}


@contextmanager
def prefixed_lists() -> Iterator[tuple[str, list[str]]]:
    """The stand-in's base URL (with its prefix) and the paths it was asked for."""
    asked: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            asked.append(self.path)
            page = PAGES.get(self.path)
            body = json.dumps(page if page is not None else {"Error": "not found"}).encode()
            self.send_response(200 if page is not None else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet tests

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/broker", asked
    finally:
        server.shutdown()
        server.server_close()


def test_a_list_follows_next_links_under_a_path_prefix() -> None:
    with prefixed_lists() as (base_url, asked), Admin(base_url, "admin-token") as admin:
        assert list(admin.channels()) == ["a", "b"]
    assert asked == ["/broker/channels", "/broker/channels?n=2", "/broker/channels?n=3"]


def test_a_link_resolves_against_the_origin() -> None:
    for base_url in ("http://127.0.0.1:8000/broker", "http://127.0.0.1:8000/broker/"):
        with HttpClient(base_url) as http:
            resolved = http.resolve_link("/broker/channels?next=abc")
        assert resolved == "http://127.0.0.1:8000/broker/channels?next=abc"
    with HttpClient("http://127.0.0.1:8000") as http:
        assert http.resolve_link("/channels?next=abc") == "http://127.0.0.1:8000/channels?next=abc"
