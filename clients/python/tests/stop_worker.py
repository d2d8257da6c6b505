"""A worker process for test_worker_stop.py: its handler writes each job's message ID to a file
as it starts, then works for a second.

    python stop_worker.py URL CHANNEL CONSUMER TOKEN STARTED_FILE CONCURRENCY PREFETCH
"""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path

from webhook_broker_client import Job, Worker


def main() -> None:
    url, channel, consumer, token, started_file = sys.argv[1:6]
    concurrency, prefetch = int(sys.argv[6]), int(sys.argv[7])
    started = Path(started_file).open("a", buffering=1)  # noqa: SIM115 - open for the whole run

    def handler(job: Job) -> None:
        started.write(f"{job.message_id}\n")
        time.sleep(1)

    logging.basicConfig(level=logging.INFO, stream=sys.stderr)
    Worker(url, channel, consumer, token, token, concurrency=concurrency, prefetch=prefetch).run(
        handler
    )
    started.close()
    print("stopped", flush=True)


if __name__ == "__main__":
    main()
