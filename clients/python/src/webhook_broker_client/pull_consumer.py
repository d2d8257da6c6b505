"""`PullConsumer`: the one client of a pull consumer's endpoints (claim, report, extend).

    with PullConsumer(url, "orders", "erp", channel_token, consumer_token) as consumer:
        claimed = consumer.claim(10, lease_seconds=60, wait=5)
        consumer.report([{"ID": job["ID"], "NextState": "DELIVERED"} for job in claimed.jobs])

The Worker, its lease keeper and the command line's `pull` all go through it; a program with a
loop of its own may too. The broker authorizes these endpoints by the channel's and the
consumer's tokens (not an admin token). Each method is one request, retried by the client's
rule (`RetryPolicy`) even though it is a POST: a claim whose answer was lost only leases jobs
that come back when their leases end, and a report or an extension repeated changes nothing
more. Bodies and answers are the broker's JSON as it is: docs/api.md, "Pull consumers".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, Self

from webhook_broker_client._admin_base import path
from webhook_broker_client._http import DEFAULT_TIMEOUT, HttpClient, RetryPolicy, retry_after_of

__all__ = ["Claimed", "PullConsumer"]


class Claimed(NamedTuple):
    """A claim's answer: the jobs taken (the broker's `Result`) and, when the broker had no
    place free for a waiting claim, the seconds its Retry-After asks to wait (else None)."""

    jobs: list[dict[str, Any]]
    retry_after: float | None


class PullConsumer:
    """Claims, reports and extends one pull consumer's jobs with its two tokens.

    `timeout` bounds each request; it must exceed the longest `wait` of a claim (a long poll
    is not a timeout), as the default (30 s) does the broker's own limit (20 s).
    """

    def __init__(
        self,
        base_url: str,
        channel_id: str,
        consumer_id: str,
        channel_token: str,
        consumer_token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        tokens = {
            "X-Broker-Channel-Token": channel_token,
            "X-Broker-Consumer-Token": consumer_token,
        }
        self._http = HttpClient(base_url, headers=tokens, timeout=timeout, retry=retry)
        self._path = path("channel", channel_id, "consumer", consumer_id)

    def claim(self, limit: int, *, lease_seconds: int | None = None, wait: float = 0) -> Claimed:
        """Take up to `limit` (1..100) queued jobs, INFLIGHT for `lease_seconds` (the broker's
        default when None); with nothing queued, wait up to `wait` seconds for some."""
        body: dict[str, Any] = {"limit": limit, "wait": wait}
        if lease_seconds is not None:
            body["timeout"] = lease_seconds
        answer = self._http.request("POST", f"{self._path}/claim", json=body, retry=True)
        jobs: list[dict[str, Any]] = answer.json()["Result"]
        return Claimed(jobs, retry_after_of(answer))

    def report(self, items: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Report outcomes (1..500 items: `{"ID", "NextState", ...}`, with `"Attempts"` as
        claimed to fence the item to that claim); a result per item, in order (`Status` 202 when
        applied, 409 when the job was claimed again since)."""
        answer = self._http.request(
            "POST", f"{self._path}/report", json={"Jobs": list(items)}, retry=True
        )
        results: list[dict[str, Any]] = answer.json().get("Result", [])
        return results

    def extend(
        self, jobs: Iterable[str | tuple[str, int]], lease_seconds: int
    ) -> list[dict[str, Any]]:
        """Make the leases of INFLIGHT jobs (1..500) end `lease_seconds` from now. Each job is
        its ID, or (ID, Attempts as claimed) to fence the extension to that claim. A result per
        job, in order (`Status` 202; else 404, 400 with `State` and `Error`: not INFLIGHT any
        more, or 409: claimed again since, by another worker)."""
        items: list[dict[str, Any]] = []
        for job in jobs:
            job_id, attempts = (job, None) if isinstance(job, str) else job
            item: dict[str, Any] = {"ID": job_id, "Timeout": lease_seconds}
            if attempts is not None:
                item["Attempts"] = attempts
            items.append(item)
        answer = self._http.request(
            "POST", f"{self._path}/extend", json={"Jobs": items}, retry=True
        )
        results: list[dict[str, Any]] = answer.json().get("Result", [])
        return results

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
