"""A pull consumer for bench/soak.py, run as a process of its own.

It claims jobs over the REST API (`POST …/claim` with a long poll), reports each one DELIVERED,
and when it stops (SIGTERM, or an error it cannot go on after) writes what it took to `--out` as
JSON: {"jobs": {"<message ID>": [claims, first claim time.time()]}, "errors": {"<what>": count}},
so the soak can count lost and repeated jobs, the publish → claim latency, and failed requests.

    .venv/bin/python bench/pull_worker.py --api http://127.0.0.1:8000 --channel bench \\
        --consumer p0 --channel-token T --consumer-token T --out p0.json
"""

from __future__ import annotations

import argparse
import json
import signal
import time
from collections import Counter
from pathlib import Path
from typing import Any

import requests

CLAIM_LIMIT = 50
LONG_POLL_SECONDS = 1
# The server holds a claim for LONG_POLL_SECONDS at most: an answer that takes this long means a
# stuck server, counted as an error, instead of a worker that hangs and ignores SIGTERM.
REQUEST_TIMEOUT_SECONDS = 60


class Worker:
    def __init__(self, args: argparse.Namespace) -> None:
        self.base = f"{args.api}/channel/{args.channel}/consumer/{args.consumer}"
        self.session = requests.Session()
        self.session.headers.update(
            {
                "X-Broker-Channel-Token": args.channel_token,
                "X-Broker-Consumer-Token": args.consumer_token,
            }
        )
        self.taken: dict[str, list[float]] = {}
        self.errors: Counter[str] = Counter()
        self.stopping = False

    def step(self) -> None:
        """One claim and the reports of what it took."""
        claimed = self.post("claim", {"limit": CLAIM_LIMIT, "wait": LONG_POLL_SECONDS})
        if claimed.status_code != 200:
            self.errors[f"claim: HTTP {claimed.status_code}"] += 1
            time.sleep(0.5)
            return
        now = time.time()
        for job in claimed.json()["Result"]:
            self.remember(job["Message"]["MessageID"], now)
            done = self.post(f"job/{job['ID']}", {"NextState": "DELIVERED"})
            if done.status_code != 202:
                self.errors[f"report: HTTP {done.status_code}"] += 1
        # The server could not hold the claim (its waiting places were taken): come back then.
        if "Retry-After" in claimed.headers:
            time.sleep(float(claimed.headers["Retry-After"]))

    def post(self, path: str, body: dict[str, Any]) -> requests.Response:
        return self.session.post(f"{self.base}/{path}", json=body, timeout=REQUEST_TIMEOUT_SECONDS)

    def remember(self, message_id: str, when: float) -> None:
        seen = self.taken.setdefault(message_id, [0, when])
        seen[0] += 1

    def run(self) -> None:
        while not self.stopping:
            try:
                self.step()
            except requests.RequestException as error:
                self.errors[type(error).__name__] += 1
                time.sleep(0.5)

    def record(self) -> dict[str, Any]:
        return {"errors": self.errors, "jobs": self.taken}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    for name in ("--api", "--channel", "--consumer", "--channel-token", "--consumer-token"):
        parser.add_argument(name, required=True)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    worker = Worker(args)

    def stop(*_: Any) -> None:
        worker.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    try:
        worker.run()
    finally:
        # Also after an unexpected error (which still ends the process with its traceback and a
        # non-zero status): the soak reports the death, and can still count what was taken.
        args.out.write_text(json.dumps(worker.record()))


if __name__ == "__main__":
    main()
