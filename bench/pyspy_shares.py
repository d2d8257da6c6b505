"""Shares of a dispatcher's CPU by step, from a py-spy raw profile of `manage.py dispatch`, as
docs/performance-history.md, "Where the dispatcher's CPU goes now, and the lever left", reports
them.

Each stack counts for the first step whose rule matches it; stacks of start-up (imports, before
the loop runs) are left out.

    .venv/bin/python bench/pyspy_shares.py dispatch_gil.txt
"""

from __future__ import annotations

import argparse
from collections import Counter
from collections.abc import Callable
from pathlib import Path


def _claim(part: str) -> Callable[[str], bool]:
    return lambda stack: "Dispatcher.claim (" in stack and part in stack


def _recording(stack: str) -> bool:
    return "Dispatcher.complete (" in stack or "_complete_batch" in stack


STEPS: list[tuple[str, Callable[[str], bool]]] = [
    ("claim: building requests (headers, signing)", _claim("jobs/outgoing.py")),
    ("claim: consumers (cache, decryption)", _claim("jobs/consumer_cache.py")),
    ("claim: the claim statement (psycopg, rows)", _claim("claim_for_push")),
    ("claim: other", _claim("")),
    ("record: record_outcomes (psycopg)", lambda stack: "record_outcomes" in stack),
    ("record: log lines (log_attempt)", lambda stack: "log_attempt" in stack),
    ("record: metrics", lambda stack: _recording(stack) and "prometheus_client" in stack),
    ("record: other", _recording),
    ("maintenance", lambda stack: "jobs/maintenance.py" in stack),
    ("HTTP: libcurl's multi handle on the loop", lambda stack: "jobs/curl_multi.py" in stack),
    ("HTTP: the client's POST", lambda stack: "_delivery.py" in stack),
    ("HTTP: jobs/delivery.py around the client", lambda stack: "jobs/delivery.py" in stack),
    ("HTTP: the address guard", lambda stack: "consumers/safety.py" in stack),
    ("loop: the dispatcher's loop and tasks", lambda stack: "jobs/dispatch.py" in stack),
    ("database thread hand-offs", lambda stack: "concurrent/futures" in stack),
    ("loop: asyncio itself", lambda stack: "asyncio/" in stack or "selectors.py" in stack),
]


def is_start_up(stack: str) -> bool:
    running = "BaseEventLoop.run_forever" in stack or "Thread._bootstrap" in stack
    return not running or "_find_and_load" in stack or "exec_module" in stack


def shares(
    lines: list[str],
    steps: list[tuple[str, Callable[[str], bool]]] = STEPS,
    start_up: Callable[[str], bool] = is_start_up,
) -> tuple[Counter[str], int, int]:
    """Samples per step, steady samples, start-up samples (the dispatcher's steps unless others
    are given: bench/ingest_profile.py gives the broadcast path's)."""
    counts: Counter[str] = Counter()
    steady = left_out = 0
    for line in lines:
        stack, _, samples = line.rstrip().rpartition(" ")
        if start_up(stack):
            left_out += int(samples)
            continue
        steady += int(samples)
        step = next((name for name, matches in steps if matches(stack)), "other")
        counts[step] += int(samples)
    return counts, steady, left_out


def print_shares(counts: Counter[str], steady: int, start_up: int) -> None:
    for step, samples in counts.most_common():
        print(f"{100 * samples / steady:5.1f} %  {step}")
    print(f"{steady} samples while running, {start_up} of start-up left out")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("profile", type=Path, help="py-spy record -f raw output")
    args = parser.parse_args()
    print_shares(*shares(args.profile.read_text().splitlines()))


if __name__ == "__main__":
    main()
