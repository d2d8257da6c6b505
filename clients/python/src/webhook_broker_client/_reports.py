"""What a pull worker sends in a report, and what it logs of the broker's answer."""

from __future__ import annotations

from typing import Any

from webhook_broker_client._held_jobs import LOG, Outcome
from webhook_broker_client.errors import BrokerError


def report_items(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """The report's items, in the order of `outcomes`."""
    return [outcome.item for outcome in outcomes]


def log_refused(outcomes: list[Outcome], error: BrokerError) -> None:
    LOG.error(
        "the broker refused a report of %d outcomes (%s); their jobs come back when their"
        " leases end: %s",
        len(outcomes),
        error,
        ", ".join(outcome.item["ID"] for outcome in outcomes),
    )


def log_results(outcomes: list[Outcome], results: list[dict[str, Any]]) -> None:
    """Warn about the outcomes the broker could not apply; note jobs that went DEAD instead."""
    for (_, item), result in zip(outcomes, results, strict=False):
        status, state = result.get("Status"), result.get("State")
        if status == 202:
            if item["NextState"] == "QUEUED" and state == "DEAD":
                LOG.info("job %s is DEAD: it has no attempts left", item["ID"])
            continue
        LOG.warning(
            "job %s could not go %s: %s%s (its lease ran out? another worker may have it)",
            item["ID"],
            item["NextState"],
            f"{state}, " if state else "",
            result.get("Error") or f"HTTP {status}",
        )
