"""`publish`: one message to a channel, as a producer (the Producer client's publish)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.output import emit, note
from webhook_broker_client.cli.settings import (
    CHANNEL_TOKEN_VARIABLE,
    PRODUCER_ID_VARIABLE,
    PRODUCER_TOKEN_VARIABLE,
    current_settings,
    required,
)
from webhook_broker_client.producer import BatchMessage, Producer


def read_data(data: str) -> bytes | str:
    """--data: `@FILE` the file's bytes, `-` stdin's bytes, anything else the text itself."""
    if data == "-":
        return sys.stdin.buffer.read()
    if data.startswith("@"):
        try:
            return Path(data[1:]).read_bytes()
        except OSError as exc:
            raise click.BadParameter(f"cannot read {data[1:]}: {exc.strerror}") from None
    return data


def parse_headers(pairs: tuple[str, ...]) -> dict[str, str]:
    headers: dict[str, str] = {}
    for pair in pairs:
        name, equals, value = pair.partition("=")
        if not equals or not name.strip():
            raise click.BadParameter(f"{pair!r} is not NAME=VALUE", param_hint="--header")
        headers[name.strip()] = value
    return headers


@click.command()
@click.argument("channel")
@click.option(
    "--data",
    "-d",
    default="-",
    show_default=True,
    help="The payload: TEXT, @FILE (its bytes) or - (stdin).",
)
@click.option("--content-type", help="Default text/plain for TEXT, else application/octet-stream.")
@click.option("--event-type", help="The message's event type (consumers subscribe to types).")
@click.option("--id", "message_id", help="The message ID; made up when not given.")
@click.option("--priority", type=int, help="Higher first; default 0.")
@click.option("--ordering-key", help="Delivered in order among messages of this key.")
@click.option("--scheduled-for", metavar="RFC3339", help="Release the message at this time.")
@click.option("--header", "headers", multiple=True, metavar="NAME=VALUE", help="Metadata header.")
@click.option("--channel-token", envvar=CHANNEL_TOKEN_VARIABLE, show_envvar=True)
@click.option("--producer", "producer_id", envvar=PRODUCER_ID_VARIABLE, show_envvar=True)
@click.option("--producer-token", envvar=PRODUCER_TOKEN_VARIABLE, show_envvar=True)
@json_option
def publish(
    channel: str,
    data: str,
    content_type: str | None,
    event_type: str | None,
    message_id: str | None,
    priority: int | None,
    ordering_key: str | None,
    scheduled_for: str | None,
    headers: tuple[str, ...],
    channel_token: str | None,
    producer_id: str | None,
    producer_token: str | None,
) -> None:
    """Publish a message to CHANNEL and print its ID.

    A message ID the channel already has counts as published (exit 0): when the broker says so
    at the first try, a note on stderr tells that nothing new was published.
    """
    settings = current_settings()
    producer = Producer(
        settings.broker_url(),
        channel,
        required(channel_token, "--channel-token", CHANNEL_TOKEN_VARIABLE, "the channel token"),
        required(producer_id, "--producer", PRODUCER_ID_VARIABLE, "the producer ID"),
        required(producer_token, "--producer-token", PRODUCER_TOKEN_VARIABLE, "its token"),
    )
    message = BatchMessage(
        read_data(data),
        message_id=message_id,
        content_type=content_type,
        event_type=event_type,
        ordering_key=ordering_key,
        priority=priority,
        scheduled_for=scheduled_for,
        headers=parse_headers(headers),
    )
    with producer:
        # The package's own internal call: `publish` would return the ID alone, and whether the
        # broker had the ID before is what the note below needs.
        published = producer._publish_message(message)
    if published.already_stored:
        note(f"message ID {published.message_id} already existed; not published again")
    emit(
        {"Channel": channel, "MessageID": published.message_id},
        lambda out: out.print(published.message_id),
    )
