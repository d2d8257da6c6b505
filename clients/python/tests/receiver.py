"""A webhook receiver on 127.0.0.1 for the tests: records each delivery and answers 200."""

from __future__ import annotations

import queue
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


@dataclass(frozen=True)
class Delivery:
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass(frozen=True)
class Receiver:
    url: str
    deliveries: queue.Queue[Delivery]

    def next_delivery(self, timeout: float = 60.0) -> Delivery:
        """The next request the broker sent; generous: the dispatcher may be busy."""
        return self.deliveries.get(timeout=timeout)


@contextmanager
def receiver() -> Iterator[Receiver]:
    deliveries: queue.Queue[Delivery] = queue.Queue()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            deliveries.put(Delivery(self.path, dict(self.headers.items()), body))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook", deliveries)
    finally:
        server.shutdown()
        server.server_close()
