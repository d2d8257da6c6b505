"""A real HTTP proxy on 127.0.0.1 that misbehaves on purpose, for the retry tests.

It answers each request by the next step of its script, then forwards everything once the
script is used up:
- "fail": answer 503 without asking the broker (the broker never sees the request);
- "lose": forward to the broker, then answer 502 instead of the broker's answer (the request
  took effect, its answer was lost);
- "reset": close the connection without answering;
- "throttle": answer 429 with Retry-After: 0, without asking the broker;
- "unavailable:N": answer 503 with Retry-After: N, without asking the broker (as the broker
  does while its database is down);
- "garbage": answer 200 with an HTML page, as a misconfigured proxy might, without asking the
  broker.
Every request is recorded (method, path, headers) so a test can show what each try sent.
"""

from __future__ import annotations

import http.client
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit


@dataclass
class Script:
    steps: list[str]
    seen: list[tuple[str, str, dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_step(self, method: str, path: str, headers: dict[str, str]) -> str:
        with self.lock:
            self.seen.append((method, path, headers))
            return self.steps.pop(0) if self.steps else "forward"


def _handler(script: Script, upstream: str) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _handle(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            headers = dict(self.headers.items())
            step = script.next_step(self.command, self.path, headers)
            if step == "reset":
                self.close_connection = True
                return
            if step == "throttle":
                self._answer(429, {"Retry-After": "0"}, b'{"Error": "slow down"}')
                return
            if step.startswith("unavailable:"):
                seconds = step.partition(":")[2]
                self._answer(503, {"Retry-After": seconds}, b'{"Error": "database unavailable"}')
                return
            if step == "garbage":
                self._answer(200, {"Content-Type": "text/html"}, b"<html>a proxy</html>")
                return
            if step == "fail":
                self._answer(503, {"Content-Type": "application/json"}, b'{"Error": "try again"}')
                return
            status, answer_headers, answer = self._forward(body, headers)
            if step == "lose":
                status, answer_headers, answer = 502, {}, b"bad gateway"
            self._answer(status, answer_headers, answer)

        def _forward(
            self, body: bytes, headers: dict[str, str]
        ) -> tuple[int, dict[str, str], bytes]:
            connection = http.client.HTTPConnection(target.hostname or "", target.port, timeout=60)
            try:
                connection.request(self.command, self.path, body=body, headers=headers)
                response = connection.getresponse()
                return response.status, dict(response.getheaders()), response.read()
            finally:
                connection.close()

        def _answer(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for name, value in headers.items():
                if name.lower() not in ("content-length", "transfer-encoding", "connection"):
                    self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = do_PUT = do_DELETE = _handle  # noqa: N815 (http.server's names)

        def log_message(self, format: str, *args: object) -> None:
            pass  # quiet test output

    return Handler


@contextmanager
def flaky_proxy(upstream: str, steps: list[str], port: int = 0) -> Iterator[tuple[str, Script]]:
    """The proxy's URL and its script, served until the block ends."""
    script = Script(list(steps))
    server = ThreadingHTTPServer(("127.0.0.1", port), _handler(script, upstream))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", script
    finally:
        server.shutdown()
        server.server_close()
