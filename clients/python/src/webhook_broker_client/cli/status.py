"""`status`: the broker's health, job counts per channel and consumer, and its dispatchers.

Read from `/_status`, `/job-status` and the dispatchers' heartbeat gauges of `/metrics` (the
only place the API shows dispatchers).
"""

from __future__ import annotations

import time
from typing import Any

import click
from rich.console import Console

from webhook_broker_client.admin import Admin
from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.output import emit, record, table
from webhook_broker_client.cli.prometheus import samples
from webhook_broker_client.cli.settings import admin_client
from webhook_broker_client.models import JobStatus

STATUSES = ["QUEUED", "INFLIGHT", "DELIVERED", "DEAD"]


def job_rows(job_status: JobStatus) -> list[dict[str, Any]]:
    """One row per consumer: its count per status and when its oldest queued job was queued."""
    rows = []
    for channel_id, consumers in sorted(job_status.items()):
        for consumer_id, counts in sorted(consumers.items()):
            row: dict[str, Any] = {"channel": channel_id, "consumer": consumer_id}
            row.update(dict.fromkeys(STATUSES, 0))
            row["oldestQueued"] = None
            for count in counts:
                row[count["statusName"]] = count["count"]
                if count["statusName"] == "QUEUED":
                    row["oldestQueued"] = count["oldestItemTimestamp"]
            rows.append(row)
    return rows


def dispatchers(metrics_text: str, now: float) -> list[dict[str, Any]]:
    """Each dispatcher's heartbeat: deliveries in flight, seconds since its last beat, attempts."""
    found: dict[str, dict[str, Any]] = {}

    def entry(name: str) -> dict[str, Any]:
        empty = {"id": name, "inFlight": 0, "lastBeatSecondsAgo": None, "delivered": 0, "failed": 0}
        return found.setdefault(name, empty)

    for sample in samples(metrics_text, "broker_dispatcher_in_flight"):
        entry(sample.labels["dispatcher"])["inFlight"] = int(sample.value)
    for sample in samples(metrics_text, "broker_dispatcher_last_beat_timestamp_seconds"):
        ago = round(max(0.0, now - sample.value), 1)
        entry(sample.labels["dispatcher"])["lastBeatSecondsAgo"] = ago
    for sample in samples(metrics_text, "broker_dispatcher_attempts_total"):
        result = sample.labels.get("result")
        if result in ("delivered", "failed"):
            entry(sample.labels["dispatcher"])[result] = int(sample.value)
    return sorted(found.values(), key=lambda item: str(item["id"]))


def gather(admin: Admin) -> dict[str, Any]:
    return {
        "broker": admin.status(),
        "jobs": job_rows(admin.job_status()),
        "dispatchers": dispatchers(admin.metrics(), time.time()),
    }


@click.command()
@json_option
def status() -> None:
    """The broker's health, job counts per consumer, and its dispatchers."""
    with admin_client() as admin:
        report = gather(admin)

    def human(out: Console) -> None:
        broker = report["broker"]
        database = broker.get("database") or {}
        health = [
            ("status", broker.get("status")),
            ("version", broker.get("version")),
            ("database", f"{database.get('vendor')}, {database.get('responseTimeMs')} ms"),
            ("warnings", broker.get("warnings")),
        ]
        out.print(record("broker", health))
        columns = ["channel", "consumer", *STATUSES, "oldestQueued"]
        rows = ([row[name] for name in columns] for row in report["jobs"])
        out.print(table("jobs", columns, rows))
        columns = ["id", "inFlight", "lastBeatSecondsAgo", "delivered", "failed"]
        rows = ([item[name] for name in columns] for item in report["dispatchers"])
        out.print(table("dispatchers", columns, rows))

    emit(report, human)
