"""`messages get` (a message with every consumer's job) and `messages list`."""

from __future__ import annotations

import click
from rich.console import Console

from webhook_broker_client.cli.app import json_option
from webhook_broker_client.cli.output import emit, fields_of, record, table
from webhook_broker_client.cli.resources import first, limit_option
from webhook_broker_client.cli.settings import admin_client

MESSAGE_FIELDS = [
    "ID",
    "Status",
    "EventType",
    "ContentType",
    "Priority",
    "ProducerID",
    "ReceivedAt",
    "DispatchedAt",
    "Payload",
]
PAYLOAD_SHOWN = 500  # characters of a payload in the table; --json has it whole


def clipped(value: object) -> object:
    text = str(value) if value is not None else None
    if text is None or len(text) <= PAYLOAD_SHOWN:
        return value
    return f"{text[:PAYLOAD_SHOWN]}… ({len(text)} characters; --json shows it whole)"


# A job's last attempt, as the API shows it: the attempts made, when the job last changed
# state, and the last attempt's error (the API has no attempt-by-attempt history).
JOB_COLUMNS = ["ListenerName", "ID", "Status", "Attempts", "StatusChangedAt", "LastError"]


@click.group()
def messages() -> None:
    """A channel's messages and their delivery."""


@messages.command("get")
@click.argument("channel")
@click.argument("message_id", metavar="ID")
@json_option
def get_message(channel: str, message_id: str) -> None:
    """Show a message and each consumer's job: status, attempts, last error."""
    with admin_client() as admin:
        message = admin.get_message(channel, message_id)

    def human(out: Console) -> None:
        fields = [
            (name, clipped(value) if name == "Payload" else value)
            for name, value in fields_of(dict(message), MESSAGE_FIELDS)
            if name != "Jobs"
        ]
        out.print(record(f"message {message['ID']}", fields))
        rows = ([job.get(name) for name in JOB_COLUMNS] for job in message["Jobs"])
        out.print(table("jobs", ["Consumer", *JOB_COLUMNS[1:]], rows))

    emit(message, human)


@messages.command("list")
@click.argument("channel")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(["ACKNOWLEDGED", "DISPATCHED", "SCHEDULED"], case_sensitive=False),
)
@limit_option
@json_option
def list_messages(channel: str, statuses: tuple[str, ...], limit: int) -> None:
    """List CHANNEL's message IDs, newest first."""
    with admin_client() as admin:
        ids = first(admin.messages(channel, [s.upper() for s in statuses]), limit)

    def human(out: Console) -> None:
        out.print(table(None, ["ID"], ([message_id] for message_id in ids)))

    emit(ids, human)
