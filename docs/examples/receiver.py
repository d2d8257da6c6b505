"""A webhook receiver for trying the broker: verifies each delivery's Standard Webhooks signature
and prints the event.

    WEBHOOK_SECRET=whsec_... python docs/examples/receiver.py --port 9000

The secret is the consumer's signing secret (`GET /channel/{c}/consumer/{k}/secret`). A delivery
whose signature does not verify is answered 401 and printed as rejected; a verified one is
answered 204, which the broker records as delivered. Needs `pip install standardwebhooks`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from standardwebhooks import Webhook, WebhookVerificationError


def make_handler(webhook: Webhook) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                webhook.verify(body, dict(self.headers.items()))
            except WebhookVerificationError as error:
                print(f"rejected {self.path}: {error}", flush=True)
                self.send_response(401)
            else:
                event = {
                    "id": self.headers["webhook-id"],
                    "channel": self.headers.get("X-Broker-Channel-ID"),
                    "consumer": self.headers.get("X-Broker-Consumer-ID"),
                    "body": body.decode("utf-8", "replace"),
                }
                print(f"verified webhook {json.dumps(event)}", flush=True)
                self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            pass  # one line per webhook is printed above; no access log

    return Handler


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9000)
    parser.add_argument(
        "--secret",
        default=os.environ.get("WEBHOOK_SECRET"),
        help="the consumer's signing secret, whsec_... (default: $WEBHOOK_SECRET)",
    )
    options = parser.parse_args()
    if not options.secret:
        parser.error("give the consumer's signing secret with --secret or WEBHOOK_SECRET")
    handler = make_handler(Webhook(options.secret))
    server = ThreadingHTTPServer((options.host, options.port), handler)
    print(f"receiver listening on http://{options.host}:{options.port}/", flush=True)
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C ends it quietly
        server.serve_forever()


if __name__ == "__main__":
    main()
