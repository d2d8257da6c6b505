"""A webhook receiver for the container stack test (tests/deploy/test_container_stack.py),
stdlib only.

It runs in a container of the broker's image on the compose network: every POST is answered 200
after DELAY seconds (so that deliveries are in flight when the stack stops) and appended as one
JSON line (path, headers, base64 body) to OUTPUT, a file the test reads from a bind mount.
`GET /health` answers 200 for the container's health check.

    python3 container_receiver.py OUTPUT [PORT] [DELAY]
"""

from __future__ import annotations

import base64
import json
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    output = ""
    delay = 0.0
    lock = threading.Lock()

    def do_GET(self) -> None:
        self._answer(200 if self.path == "/health" else 404)

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        time.sleep(self.delay)
        line = json.dumps(
            {
                "path": self.path,
                "headers": {name.lower(): value for name, value in self.headers.items()},
                "body": base64.b64encode(body).decode(),
            }
        )
        with self.lock, open(self.output, "a") as output:
            output.write(line + "\n")
        self._answer(200)

    def _answer(self, status: int) -> None:
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, format: str, *args: object) -> None:
        pass  # one line per delivery would drown the container's log


def main() -> None:
    Handler.output = sys.argv[1]
    port = int(sys.argv[2]) if len(sys.argv) > 2 else 9000
    Handler.delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    server = ThreadingHTTPServer(("0.0.0.0", port), Handler)  # noqa: S104 (a container's port)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
