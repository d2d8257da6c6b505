"""`pull CHANNEL CONSUMER`: claim a pull consumer's jobs, print them, acknowledge them with --ack.

For trying a pull consumer out and for scripts; a program that processes jobs uses the Worker
(webhook_broker_client.worker), which also retries, extends leases and stops gracefully. The
broker authorizes these requests by the consumer's two tokens alone: no admin token is needed.
"""

from __future__ import annotations

import base64
from typing import Any

import click
from rich.console import Console

from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.output import emit, note, table
from webhook_broker_client.cli.settings import (
    CHANNEL_TOKEN_VARIABLE,
    CONSUMER_TOKEN_VARIABLE,
    current_settings,
    required,
)
from webhook_broker_client.pull_consumer import PullConsumer

PAYLOAD_SHOWN = 200  # characters of a payload in the table; --json has it whole


def payload_text(message: dict[str, Any]) -> str:
    payload = message.get("Payload")
    if payload is None:
        return f"(missing: {message.get('PayloadError')})"
    if message.get("PayloadEncoding") == "base64":
        return f"({len(base64.b64decode(payload))} bytes, not text)"
    text = str(payload)
    return text if len(text) <= PAYLOAD_SHOWN else text[:PAYLOAD_SHOWN] + "…"


@click.command()
@click.argument("channel")
@click.argument("consumer")
@click.option("--channel-token", envvar=CHANNEL_TOKEN_VARIABLE, show_envvar=True)
@click.option("--consumer-token", envvar=CONSUMER_TOKEN_VARIABLE, show_envvar=True)
@click.option("--limit", type=click.IntRange(1, 100), default=10, show_default=True)
@click.option(
    "--timeout", type=click.IntRange(1, 86400), help="Lease seconds (default: the broker's)."
)
@click.option("--wait", type=click.IntRange(0, 20), default=0, help="Seconds to wait for a job.")
@click.option("--ack", is_flag=True, help="Report the jobs DELIVERED once printed.")
@json_option
def pull(
    channel: str,
    consumer: str,
    channel_token: str | None,
    consumer_token: str | None,
    limit: int,
    timeout: int | None,
    wait: int,
    ack: bool,
) -> None:
    """Claim up to --limit of CONSUMER's jobs and print them.

    Without --ack the jobs stay in flight until their lease ends, then go back to the queue
    (the attempt counted).
    """
    url = current_settings().broker_url()
    tokens = (
        required(channel_token, "--channel-token", CHANNEL_TOKEN_VARIABLE, "the channel token"),
        required(consumer_token, "--consumer-token", CONSUMER_TOKEN_VARIABLE, "the consumer token"),
    )
    with PullConsumer(url, channel, consumer, *tokens) as pull_consumer:
        jobs = pull_consumer.claim(limit, lease_seconds=timeout, wait=wait).jobs
        reported = None
        if ack and jobs:
            outcomes = [{"ID": job["ID"], "NextState": "DELIVERED"} for job in jobs]
            reported = pull_consumer.report(outcomes)

    def human(out: Console) -> None:
        if not jobs:
            out.print("no jobs")
            return
        columns = ["Job", "Message", "Attempts", "EventType", "Payload"]
        rows = (
            [
                job["ID"],
                job["Message"]["MessageID"],
                job["Attempts"],
                job["Message"].get("EventType"),
                payload_text(job["Message"]),
            ]
            for job in jobs
        )
        out.print(table(None, columns, rows))
        for result in reported or []:
            if result["Status"] == 202:
                note(f"acknowledged job {result['ID']}")
            else:
                note(f"job {result['ID']} not acknowledged: {result.get('Error')}")

    emit({"Result": jobs, "Report": reported}, human)
    if reported and any(result["Status"] != 202 for result in reported):
        raise click.exceptions.Exit(1)
