"""`consumers`: list, get, put (every field the broker's form takes), pause, resume, secret,
delete."""

from __future__ import annotations

from typing import Any, Literal, cast

import click
from rich.console import Console

from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.confirm import confirm_or_stop
from webhook_broker_client.cli.output import emit
from webhook_broker_client.cli.resources import (
    first,
    limit_option,
    show_list,
    show_one,
    show_put,
)
from webhook_broker_client.cli.settings import admin_client

CONSUMER_FIELDS = [
    "ID",
    "Name",
    "Type",
    "CallbackURL",
    "Paused",
    "CircuitState",
    "ConsecutiveFailures",
    "RetryDelays",
    "EventTypes",
    "ChangedAt",
]
LIST_COLUMNS = ["ID", "Type", "CallbackURL", "Paused", "CircuitState", "EventTypes"]
BLANK_HELP = "'' sets it back to the broker's default."


class BlankOr(click.ParamType[Any]):
    """A number, a comma-separated list of them, or '' (back to the broker's default)."""

    def __init__(self, kind: type[int] | type[float] | type[str], many: bool = False) -> None:
        self.kind = kind
        self.many = many
        self.name = f"{kind.__name__}{'s' if many else ''}"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str) or value.strip() == "":
            return "" if isinstance(value, str) else value
        try:
            if self.many:
                return [self.kind(part.strip()) for part in value.split(",") if part.strip()]
            return self.kind(value.strip())
        except ValueError:
            self.fail(f"{value!r} is not {'a list of ' if self.many else 'a '}{self.name}")


@click.group()
def consumers() -> None:
    """Consumers: who receives a channel's messages (push to a URL, or pulled by workers)."""


@consumers.command("list")
@click.argument("channel")
@limit_option
@json_option
def list_consumers(channel: str, limit: int) -> None:
    """List CHANNEL's consumers."""
    with admin_client() as admin:
        ids = first(admin.consumers(channel), limit)
        items = [admin.get_consumer(channel, consumer_id) for consumer_id in ids]
    show_list("consumers", items, LIST_COLUMNS)


@consumers.command("get")
@click.argument("channel")
@click.argument("consumer")
@json_option
def get_consumer(channel: str, consumer: str) -> None:
    """Show a consumer, with its delivery state (paused, circuit)."""
    with admin_client() as admin:
        show_one("consumer", admin.get_consumer(channel, consumer), CONSUMER_FIELDS)


@consumers.command("put")
@click.argument("channel")
@click.argument("consumer")
@click.option("--callback-url", help="Where pushes go (required on create, pull consumers too).")
@click.option("--type", "kind", type=click.Choice(["push", "pull"]), help="Default push.")
@click.option("--name", help="Default: the ID.")
@click.option(
    "--token",
    help="The consumer's own token (not the admin token); generated and shown once when "
    "not given on create; kept after.",
)
@click.option("--ordering", type=click.Choice(["none", "ordered"]))
@click.option(
    "--retry-delays", type=BlankOr(int, many=True), metavar="S1,S2", help="Seconds. " + BLANK_HELP
)
@click.option(
    "--non-retryable-statuses", type=BlankOr(int, many=True), metavar="CODES", help=BLANK_HELP
)
@click.option("--max-in-flight", type=BlankOr(int), help="'' for no cap.")
@click.option("--max-job-age", type=BlankOr(int), help="Seconds; 0 no limit. " + BLANK_HELP)
@click.option("--max-per-second", type=BlankOr(float), help="'' for no limit.")
@click.option(
    "--event-types", type=BlankOr(str, many=True), metavar="T1,T2", help="'' for every message."
)
@click.option("--signing-secret", help="Import a secret (whsec_…); replaces the current one.")
@json_option
def put_consumer(channel: str, consumer: str, kind: str | None, **settings: Any) -> None:
    """Create or update a consumer; options left out keep their values."""
    with admin_client() as admin:
        answer = admin.put_consumer(
            channel, consumer, type=cast(Literal["push", "pull"] | None, kind), **settings
        )
        show_put("consumer", answer, CONSUMER_FIELDS)


@consumers.command("pause")
@click.argument("channel")
@click.argument("consumer")
@json_option
def pause(channel: str, consumer: str) -> None:
    """Stop delivery: jobs accumulate until resumed."""
    with admin_client() as admin:
        show_one("consumer", admin.pause_consumer(channel, consumer), CONSUMER_FIELDS)


@consumers.command("resume")
@click.argument("channel")
@click.argument("consumer")
@json_option
def resume(channel: str, consumer: str) -> None:
    """Restart delivery of a paused consumer."""
    with admin_client() as admin:
        show_one("consumer", admin.resume_consumer(channel, consumer), CONSUMER_FIELDS)


@consumers.command("secret")
@click.argument("channel")
@click.argument("consumer")
@click.option("--rotate", is_flag=True, help="Make a new one (the old one signs 24 h more).")
@json_option
def secret(channel: str, consumer: str, rotate: bool) -> None:
    """Print the signing secret its deliveries are signed with (for the receiver)."""
    with admin_client() as admin:
        if rotate:
            answer = admin.rotate_signing_secret(channel, consumer)
        else:
            answer = admin.signing_secret(channel, consumer)

    def human(out: Console) -> None:
        out.print(answer["SigningSecret"])

    emit(answer, human)


@consumers.command("delete")
@click.argument("channel")
@click.argument("consumer")
@click.option("--yes", "-y", is_flag=True, help="Do not ask for confirmation.")
def delete(channel: str, consumer: str, yes: bool) -> None:
    """Delete a consumer with all its jobs (the messages stay)."""
    confirm_or_stop(f"Delete consumer {channel}/{consumer} and all its jobs?", yes)
    with admin_client() as admin:
        admin.delete_consumer(channel, consumer)
    emit({"Deleted": f"{channel}/{consumer}"}, lambda out: out.print("deleted"))
