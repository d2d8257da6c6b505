"""`dlq`: a consumer's dead-letter queue: list, requeue, purge (after a count and a question)."""

from __future__ import annotations

from itertools import islice
from typing import Any

import click
from rich.console import Console

from webhook_broker_client.admin import Admin
from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.confirm import confirm_or_stop
from webhook_broker_client.cli.output import emit, note, table
from webhook_broker_client.cli.resources import limit_option
from webhook_broker_client.cli.settings import (
    CHANNEL_TOKEN_VARIABLE,
    CONSUMER_TOKEN_VARIABLE,
    admin_client,
)
from webhook_broker_client.models import DlqResult

DEAD_JOB_COLUMNS = ["ID", "Message", "Attempts", "DiedAt", "LastError"]


def dead_count(admin: Admin, channel: str, consumer: str) -> int:
    """The consumer's dead jobs now (/dlq-status); NotFound when there is no such consumer."""
    admin.get_consumer(channel, consumer)
    for entry in admin.dlq_status()["consumers"]:
        if entry["channelId"] == channel and entry["consumerId"] == consumer:
            return int(entry["deadCount"])
    return 0


def message_id_of(url: str) -> str:
    return url.rstrip("/").rsplit("/", 1)[-1]


def show_result(verb: str, result: DlqResult) -> None:
    def human(out: Console) -> None:
        out.print(f"{verb} {result['count']} dead job(s)")
        action = result["action"]
        if action is not None:
            note(
                f"More goes on in the background (action {action['id']}, about "
                f"{action['estimatedCount']} jobs in all)."
            )

    emit(result, human)


@click.group()
def dlq() -> None:
    """Dead-letter queues: jobs whose delivery failed for good."""


@dlq.command("list")
@click.argument("channel")
@click.argument("consumer")
@limit_option
@json_option
def list_dead(channel: str, consumer: str, limit: int) -> None:
    """List CONSUMER's dead jobs, most recently dead first."""
    with admin_client() as admin:
        jobs = admin.dead_jobs(channel, consumer)
        dead = list(jobs if limit == 0 else islice(jobs, limit))

    def human(out: Console) -> None:
        if not dead:
            out.print("no dead jobs")
            return
        rows: list[list[Any]] = [
            [
                job["ID"],
                message_id_of(job["MessageURL"]),
                job["Attempts"],
                job["StatusChangedAt"],
                job["LastError"],
            ]
            for job in dead
        ]
        out.print(table(None, DEAD_JOB_COLUMNS, rows))

    emit(dead, human)


@dlq.command("requeue")
@click.argument("channel")
@click.argument("consumer")
@click.option("--since", metavar="RFC3339", help="Only the jobs that died at or after this time.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
def requeue(channel: str, consumer: str, since: str | None, yes: bool) -> None:
    """Requeue CONSUMER's dead jobs: they are delivered again, attempts from 0."""
    with admin_client() as admin:
        count = dead_count(admin, channel, consumer)
        if count == 0:
            show_result("requeued", {"count": 0, "action": None})
            return
        which = f"up to {count}" if since else str(count)
        confirm_or_stop(f"Requeue {which} dead job(s) of {channel}/{consumer}?", yes)
        show_result("requeued", admin.requeue_dlq(channel, consumer, since=since))


@dlq.command("purge")
@click.argument("channel")
@click.argument("consumer")
@click.option("--channel-token", envvar=CHANNEL_TOKEN_VARIABLE, show_envvar=True)
@click.option("--consumer-token", envvar=CONSUMER_TOKEN_VARIABLE, show_envvar=True)
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
@json_option
def purge(
    channel: str, consumer: str, channel_token: str | None, consumer_token: str | None, yes: bool
) -> None:
    """Delete CONSUMER's dead jobs for good: as the admin, or with the channel's and the
    consumer's tokens when both are given."""
    tokens = {}
    if channel_token and consumer_token:
        tokens = {"channel_token": channel_token, "consumer_token": consumer_token}
    with admin_client() as admin:
        count = dead_count(admin, channel, consumer)
        if count == 0:
            show_result("deleted", {"count": 0, "action": None})
            return
        confirm_or_stop(f"Delete {count} dead job(s) of {channel}/{consumer} for good?", yes)
        show_result("deleted", admin.purge_dlq(channel, consumer, **tokens))
