"""A tiny HTTP proxy on 127.0.0.1 that forwards every request to the broker and counts them by
the last part of their path (`claim`, `report`, `extend`), so a test can see what the worker
sent on the wire. Claims that returned no job are also counted as `claim:empty`. Setting `down`
makes it answer 503 to everything meanwhile (counted as `claim:refused`, ...); `rewrite`, when set,
changes each request's body on its way to the broker (given what it is and the body)."""

from __future__ import annotations

import http.client
import json
import threading
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class RecordingProxy:
    def __init__(self, target: str) -> None:
        parts = urllib.parse.urlsplit(target)
        self.target_host, self.target_port = parts.hostname or "127.0.0.1", parts.port or 80
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()
        self.down = False  # while True: every request is answered 503, as by a broker restarting
        self.rewrite: Callable[[str, bytes], bytes] | None = None
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        proxy = self

        class Forward(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive, as the broker

            def do_POST(self) -> None:
                self._forward()

            def do_GET(self) -> None:
                self._forward()

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                what = self.path.rstrip("/").rsplit("/", 1)[-1]
                if proxy.down:
                    with proxy.lock:
                        proxy.counts[f"{what}:refused"] += 1
                    self.send_response(503)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                if proxy.rewrite is not None and body is not None:
                    body = proxy.rewrite(what, body)
                upstream = http.client.HTTPConnection(proxy.target_host, proxy.target_port, 60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP}
                upstream.request(self.command, self.path, body, headers)
                answer = upstream.getresponse()
                content = answer.read()
                upstream.close()
                with proxy.lock:
                    proxy.counts[what] += 1
                    if (
                        what == "claim"
                        and answer.status == 200
                        and not json.loads(content)["Result"]
                    ):
                        proxy.counts["claim:empty"] += 1
                self.send_response(answer.status)
                for name, value in answer.getheaders():
                    if name.lower() not in _HOP_BY_HOP:
                        self.send_header(name, value)
                self.send_header("Content-Length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, format: str, *args: object) -> None:
                pass

        return Forward

    def count(self, what: str) -> int:
        with self.lock:
            return self.counts[what]


@contextmanager
def recording_proxy(target: str) -> Iterator[RecordingProxy]:
    proxy = RecordingProxy(target)
    thread = threading.Thread(target=proxy.server.serve_forever, daemon=True)
    thread.start()
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
