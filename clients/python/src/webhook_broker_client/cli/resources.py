"""`channels` and `producers`: list, get, put (create or update)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from itertools import islice
from typing import Any

import click
from rich.console import Console

from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.output import emit, fields_of, note, record, table
from webhook_broker_client.cli.settings import admin_client

LIMIT_HELP = "Show at most N (newest first); 0: all."
SHOWN_ONCE = "The token is shown only now: the broker keeps it hashed or encrypted."


def limit_option(command: Callable[..., Any]) -> Callable[..., Any]:
    return click.option("--limit", type=click.IntRange(min=0), default=100, help=LIMIT_HELP)(
        command
    )


def first(ids: Iterator[str], limit: int) -> list[str]:
    return list(ids if limit == 0 else islice(ids, limit))


def show_list(kind: str, items: Sequence[Mapping[str, object]], columns: list[str]) -> None:
    def human(out: Console) -> None:
        if not items:
            out.print(f"no {kind}")
            return
        out.print(table(None, columns, ([item.get(name) for name in columns] for item in items)))

    emit(items, human)


def show_one(kind: str, item: Mapping[str, object], order: list[str]) -> None:
    """A resource as a GET or a command answers it: without its token, never readable later."""
    _show(kind, item, order, token_set_now=False)


def show_put(kind: str, item: Mapping[str, object], order: list[str]) -> None:
    """A PUT's answer. It has `Token` only when this PUT set the token (given, or generated on
    create): the one time the broker shows it, which the note says."""
    _show(kind, item, order, token_set_now=bool(item.get("Token")))


def _show(kind: str, item: Mapping[str, object], order: list[str], token_set_now: bool) -> None:
    def human(out: Console) -> None:
        out.print(record(f"{kind} {item.get('ID')}", fields_of(dict(item), order)))
        if token_set_now:
            note(SHOWN_ONCE)

    emit(item, human)


CHANNEL_FIELDS = ["ID", "Name", "ChangedAt"]
PRODUCER_FIELDS = ["ID", "Name", "Channels", "ChangedAt"]


@click.group()
def channels() -> None:
    """Channels: what producers publish to."""


@channels.command("list")
@limit_option
@json_option
def list_channels(limit: int) -> None:
    """List channels."""
    with admin_client() as admin:
        items = [admin.get_channel(channel_id) for channel_id in first(admin.channels(), limit)]
    show_list("channels", items, CHANNEL_FIELDS)


@channels.command("get")
@click.argument("channel")
@json_option
def get_channel(channel: str) -> None:
    """Show a channel."""
    with admin_client() as admin:
        show_one("channel", admin.get_channel(channel), CHANNEL_FIELDS)


@channels.command("put")
@click.argument("channel")
@click.option("--name", help="Default: the ID (on create); kept (on update).")
@click.option(
    "--token",
    help="The channel's own token (not the admin token); generated and shown once when "
    "not given on create; kept on update.",
)
@json_option
def put_channel(channel: str, name: str | None, token: str | None) -> None:
    """Create or update a channel."""
    with admin_client() as admin:
        show_put("channel", admin.put_channel(channel, name=name, token=token), CHANNEL_FIELDS)


@click.group()
def producers() -> None:
    """Producers: who publishes."""


@producers.command("list")
@limit_option
@json_option
def list_producers(limit: int) -> None:
    """List producers."""
    with admin_client() as admin:
        ids = first(admin.producers(), limit)
        items = [admin.get_producer(producer_id) for producer_id in ids]
    show_list("producers", items, PRODUCER_FIELDS)


@producers.command("get")
@click.argument("producer")
@json_option
def get_producer(producer: str) -> None:
    """Show a producer."""
    with admin_client() as admin:
        show_one("producer", admin.get_producer(producer), PRODUCER_FIELDS)


@producers.command("put")
@click.argument("producer")
@click.option("--name", help="Default: the ID (on create); kept (on update).")
@click.option(
    "--token",
    help="The producer's own token (not the admin token); generated and shown once when "
    "not given on create; kept on update.",
)
@click.option(
    "--channels",
    "channel_list",
    metavar="C1,C2",
    help="The channels it may publish to (with BROKER_PRODUCER_CHANNELS=bound); '' for none.",
)
@json_option
def put_producer(
    producer: str, name: str | None, token: str | None, channel_list: str | None
) -> None:
    """Create or update a producer."""
    allowed = None
    if channel_list is not None:
        allowed = [part.strip() for part in channel_list.split(",") if part.strip()]
    with admin_client() as admin:
        answer = admin.put_producer(producer, name=name, token=token, channels=allowed)
        show_put("producer", answer, PRODUCER_FIELDS)
