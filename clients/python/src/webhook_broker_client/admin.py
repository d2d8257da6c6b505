"""`Admin`: the broker's management API, for operators' scripts and the command line.

Every method is one documented endpoint (docs/api.md) and returns the broker's JSON as it is,
typed by models.py (the broker's own field names). Lists are iterators that follow the pages'
`next` links and yield IDs (or, for dead jobs, the jobs). Refusals raise errors.py's exceptions.
"""

from __future__ import annotations

from typing import Self

from webhook_broker_client._admin_messages import MessageCalls
from webhook_broker_client._admin_setup import SetupCalls
from webhook_broker_client._http import DEFAULT_TIMEOUT, HttpClient, RetryPolicy
from webhook_broker_client.models import BrokerStatus, DlqStatus, JobStatus

__all__ = ["Admin"]


class Admin(SetupCalls, MessageCalls):
    """The management API with an admin token (BROKER_ADMIN_TOKENS, or an API key).

    GET, PUT and DELETE are retried on no answer, 5xx and 429 (RetryPolicy); commands (POST:
    pause, rotate, replay, requeue) are not, since repeating one may do it twice. A pull
    consumer's claims and reports are not admin calls: PullConsumer (pull_consumer.py) makes
    them, with the consumer's tokens.
    """

    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        retry: RetryPolicy | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {token}"}
        self._http = HttpClient(base_url, headers=headers, timeout=timeout, retry=retry)

    def status(self) -> BrokerStatus:
        """`/_status`: health, version, database. A 503 (database down) raises ServerError."""
        result: BrokerStatus = self._get("/_status")
        return result

    def job_status(self) -> JobStatus:
        """Job counts per channel, consumer and status."""
        result: JobStatus = self._get("/job-status")
        return result

    def dlq_status(self) -> DlqStatus:
        """Dead job counts of the consumers that have any."""
        result: DlqStatus = self._get("/dlq-status")
        return result

    def metrics(self) -> str:
        """`/metrics` as Prometheus text (the command line reads the dispatchers' heartbeats)."""
        return self._http.request("GET", "/metrics").text

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
