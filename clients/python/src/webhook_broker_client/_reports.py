"""What a pull worker sends in a report, and what it logs of the broker's answer."""

from __future__ import annotations

from typing import Any

from webhook_broker_client._held_jobs import LOG, Claim, Outcome
from webhook_broker_client.errors import BrokerError


def report_items(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """The report's items, in the order of `outcomes`, each fenced by its claim's `Attempts`:
    should the job have been claimed again since (this worker's lease ran out while it could not
    reach the broker), the broker answers that item 409 and leaves the new claim alone."""
    return [_fenced(outcome.item, outcome.claim) for outcome in outcomes]


def _fenced(item: dict[str, Any], claim: Claim | None) -> dict[str, Any]:
    if claim is None or claim.job.attempts < 1:
        return item
    return {**item, "Attempts": claim.job.attempts}


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
