"""What a pull worker's handler receives (`Job`) and the outcomes it can raise besides returning.

A handler that returns has delivered the job. The three exceptions here say otherwise:

- `Retry(delay=None)`: a transient error; the job comes back, the attempt counts, and it is due
  after `delay` seconds or, without a delay, after the consumer's own retry schedule. Once the
  consumer's attempts are used up the broker makes it DEAD.
- `Reject(reason)`: a business error retrying cannot fix; DEAD at once, `reason` its LastError.
- `Defer(delay=None)`: not now; the job comes back without counting the attempt.

Any other exception is a `Retry()` (the worker logs its traceback). Each outcome becomes one item
of a `POST …/report` (`report_item`), docs/api.md "Pull consumers".
"""

from __future__ import annotations

import base64
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The broker refuses an Error longer than this in a report item (and the whole report with it).
MAX_ERROR_CHARS = 1000
# ... and an IncrementalTimeout above this.
MAX_DELAY_SECONDS = 86400


class Retry(Exception):
    """Give the job back as a failed attempt: due after `delay` s, or the consumer's schedule."""

    def __init__(self, delay: float | None = None, reason: str = "") -> None:
        if delay is not None and not 0 <= delay <= MAX_DELAY_SECONDS:
            raise ValueError(f"Retry delay must be from 0 to {MAX_DELAY_SECONDS} s, not {delay}")
        super().__init__(reason or "retry")
        self.delay = delay
        self.reason = reason


class Reject(Exception):
    """The job cannot succeed: DEAD at once, with `reason` as its LastError."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "rejected")
        self.reason = reason


class Defer(Exception):
    """Not now: give the job back unattempted (its Attempts unchanged), due after `delay` s."""

    def __init__(self, delay: float | None = None) -> None:
        if delay is not None and not 0 <= delay <= MAX_DELAY_SECONDS:
            raise ValueError(f"Defer delay must be from 0 to {MAX_DELAY_SECONDS} s, not {delay}")
        super().__init__("deferred")
        self.delay = delay


@dataclass(frozen=True)
class Job:
    """A claimed job and its message, as a handler receives it."""

    id: str
    message_id: str
    payload: bytes
    content_type: str
    event_type: str | None
    headers: Mapping[str, str] = field(default_factory=dict)
    attempts: int = 0  # this attempt included: 1 the first time a job is handled
    priority: int = 0

    @property
    def text(self) -> str:
        """The payload decoded as UTF-8."""
        return self.payload.decode("utf-8")

    def json(self) -> Any:
        """The payload parsed as JSON."""
        return json.loads(self.payload)


def job_from_claim(entry: Mapping[str, Any]) -> Job | None:
    """The Job of one entry of a claim's `Result`; None when its payload is gone from storage
    (the broker does not hand such jobs out, but a worker must not crash on one)."""
    message = entry["Message"]
    payload = message.get("Payload")
    if payload is None:
        return None
    raw = base64.b64decode(payload) if message.get("PayloadEncoding") == "base64" else payload
    return Job(
        id=entry["ID"],
        message_id=message["MessageID"],
        payload=raw.encode("utf-8") if isinstance(raw, str) else raw,
        content_type=message.get("ContentType") or "",
        event_type=message.get("EventType"),
        headers=message.get("Headers") or {},
        attempts=int(entry.get("Attempts") or 0),
        priority=int(entry.get("Priority") or 0),
    )


def delivered(job_id: str) -> dict[str, Any]:
    return {"ID": job_id, "NextState": "DELIVERED"}


def given_back_unstarted(job_id: str, delay: float | None = None) -> dict[str, Any]:
    """A job the worker never started (held at stop, or deferred): the claim's attempt undone."""
    item: dict[str, Any] = {"ID": job_id, "NextState": "QUEUED", "Attempted": False}
    if delay:
        item["IncrementalTimeout"] = whole_seconds(delay)
    return item


def dead(job_id: str, reason: str) -> dict[str, Any]:
    item: dict[str, Any] = {"ID": job_id, "NextState": "DEAD"}
    if reason:
        item["Error"] = storable_error(reason)
    return item


def retried(job_id: str, delay: float | None, reason: str) -> dict[str, Any]:
    """Back to the queue as a failed attempt: after `delay`, or the consumer's schedule."""
    item: dict[str, Any] = {"ID": job_id, "NextState": "QUEUED"}
    if delay is None:
        item["Backoff"] = True
    else:
        item["IncrementalTimeout"] = whole_seconds(delay)
    if reason:
        item["Error"] = storable_error(reason)
    return item


def storable_error(text: str) -> str:
    """`text` as the broker stores an `Error`: an exception's message may hold a NUL or a lone
    surrogate (no UTF-8 for it, so no JSON body at all) or run long, and one such item makes the
    broker refuse the whole report. Those characters are written as escapes, and a text too long
    is cut, with an ellipsis."""
    text = text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\x00")
    if len(text) > MAX_ERROR_CHARS:
        text = text[: MAX_ERROR_CHARS - 1] + "\u2026"
    return text


def report_item(job_id: str, outcome: BaseException | None) -> dict[str, Any]:
    """The report item for what the handler did: returned (None) or raised `outcome`."""
    if outcome is None:
        return delivered(job_id)
    if isinstance(outcome, Retry):
        return retried(job_id, outcome.delay, outcome.reason)
    if isinstance(outcome, Reject):
        return dead(job_id, outcome.reason)
    if isinstance(outcome, Defer):
        return given_back_unstarted(job_id, outcome.delay)
    try:
        text = str(outcome)
    except Exception:  # a broken __str__ must not cost the job its outcome
        text = "(its text could not be read)"
    return retried(job_id, None, f"{type(outcome).__name__}: {text}")


def whole_seconds(delay: float) -> int:
    """The broker takes whole seconds: a delay is rounded up, never shortened."""
    return min(MAX_DELAY_SECONDS, math.ceil(delay))
